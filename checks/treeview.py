"""``drift-audit facts --tree FILE [--at LINE:COL]``: the parse tree a fact's query runs on.

Writing a tree-sitter query means knowing the grammar's node types and field
names. This prints them for a real file, and for a cursor position builds a
query that captures the node there, checked against the file before it is
shown, so a config can start from something that works.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import tree_sitter as ts

from checks.syntax import language, parse

MAX_LEAF_TEXT = 40


class TreeError(ValueError):
    """A cursor outside the file, or a language with no grammar: said, not raised as a traceback."""


def _point(node: ts.Node) -> str:
    (r0, c0), (r1, c1) = node.start_point, node.end_point
    return f"{r0 + 1}:{c0 + 1}-{r1 + 1}:{c1 + 1}"


def _leaf_text(node: ts.Node) -> str:
    raw = (node.text or b"").decode("utf-8", "replace").replace("\n", "\\n")
    return raw if len(raw) <= MAX_LEAF_TEXT else raw[: MAX_LEAF_TEXT - 1] + "…"


def _named_children(node: ts.Node) -> Iterator[tuple[str | None, ts.Node]]:
    for i, child in enumerate(node.children):
        if child.is_named:
            yield node.field_name_for_child(i), child


def lines(root: ts.Node, *, field: str | None = None, mark: ts.Node | None = None, max_depth: int | None = None,
          indent: int = 0) -> Iterator[str]:
    """One line per named node: ``field: type [start-end]``, leaves with their text."""

    def walk(node: ts.Node, field: str | None, depth: int) -> Iterator[str]:
        label = f"{field}: {node.type}" if field else node.type
        leaf = f' "{_leaf_text(node)}"' if node.named_child_count == 0 else ""
        here = "   ◀ here" if mark is not None and node == mark else ""
        err = "  (syntax error)" if node.is_error or node.is_missing else ""
        yield f"{'  ' * depth}{label} [{_point(node)}]{leaf}{err}{here}"
        if max_depth is not None and depth - indent >= max_depth:
            if node.named_child_count:
                yield f"{'  ' * (depth + 1)}…"
            return
        for child_field, child in _named_children(node):
            yield from walk(child, child_field, depth + 1)

    yield from walk(root, field, indent)


def node_at(root: ts.Node, line: int, col: int) -> ts.Node:
    """The smallest named node covering 1-based ``line:col``."""
    if line < 1 or col < 1 or line - 1 > root.end_point[0]:
        raise TreeError(f"{line}:{col} is outside the file (it has {root.end_point[0] + 1} lines)")
    point = (line - 1, col - 1)
    node = root.named_descendant_for_point_range(point, point)
    if node is None:
        raise TreeError(f"no node at {line}:{col}")
    return node


def _field_of(node: ts.Node) -> str | None:
    parent = node.parent
    if parent is None:
        return None
    for i, child in enumerate(parent.children):
        if child == node:
            return parent.field_name_for_child(i)
    return None


def _pattern(node: ts.Node, inner: str) -> str:
    field = _field_of(node)
    return f"{field}: {inner}" if field else inner


@dataclass
class Suggestion:
    query: str
    captures: int  # how many nodes it captures in this file
    hits_cursor: bool


def suggest_query(lang: str, root: ts.Node, node: ts.Node, levels: int = 2) -> Suggestion:
    """``(grandparent (parent field: (node) @key))``: anchored by up to ``levels`` ancestors and their
    field names, so it is specific enough to mean this kind of node and general enough to match its
    siblings. Verified by running it on the file."""
    query = f"({node.type}) @key"
    current = node
    for _ in range(levels):
        parent = current.parent
        if parent is None or parent.parent is None and parent.type in ("module", "translation_unit"):
            break
        query = f"({parent.type} {_pattern(current, query)})"
        current = parent
    compiled = ts.Query(language(lang), query)
    found = ts.QueryCursor(compiled).captures(root).get("key", [])
    return Suggestion(query, len(found), any(n == node for n in found))


def render(lang: str, data: bytes, at: tuple[int, int] | None = None) -> Iterator[str]:
    root = parse(lang, data).root_node
    if at is None:
        yield from lines(root)
        return
    node = node_at(root, *at)
    chain = []
    up: ts.Node | None = node
    while up is not None:
        chain.append(up)
        up = up.parent
    for depth, ancestor in enumerate(reversed(chain[1:])):
        field = _field_of(ancestor)
        yield f"{'  ' * depth}{field + ': ' if field else ''}{ancestor.type} [{_point(ancestor)}]"
    yield from lines(node, field=_field_of(node), mark=node, max_depth=3, indent=len(chain) - 1)
    s = suggest_query(lang, root, node)
    yield ""
    yield f"# a query capturing the {node.type} at {at[0]}:{at[1]} as @key ({s.captures} capture(s) in this file):"
    yield s.query
