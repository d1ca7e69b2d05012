"""A cheap proof that a change is observable: it touches a definition both sides of the diff have.

Telling a changed module's names exactly takes a full ``ast`` table of both
sides, which on a large PR is the select stage's whole cost. A module no test
file imports needs far less: only whether its change is inert (a reviewer is
told so), and an edit inside a function or class that exists on both sides
never is. That can be shown from the few top-level statements around the
changed lines: tree-sitter splits the file into them (in C; pillars has parsed
most of these blobs already), ``ast`` reads only those. Whatever this cannot
show falls back to the full tables, so the answer never changes.

A file that does not parse makes its module "all", which is not inert either,
so a wrong split of a broken file cannot mislead; a file that parses has one
top-level split, and tree-sitter finds it (any tree-sitter error: no proof).
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterable

from checks import syntax

_MAX_SEGMENTS = 32  # a name written this often is looked up no further: the full tables decide
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=]", re.MULTILINE)


class Outline:
    """One blob's top-level statements as line ranges, each parsed by ``ast`` only when asked about."""

    def __init__(self, data: bytes, key: str | None):
        self.ok = False
        self.data = data
        head = b"\n".join(data.split(b"\n", 2)[:2])
        if b"\r" in data or b"\0" in data or _CODING.search(head):
            return  # line numbering or decoding could differ between tree-sitter, a segment and the file
        root = syntax.parse("python", data, key=key).root_node
        if root.has_error:
            return
        spans: list[list[int]] = []
        for node in root.named_children:
            if node.type == "comment":
                continue
            first, last = node.start_point[0] + 1, node.end_point[0] + 1
            if node.end_point[1] == 0 and last > first:
                last -= 1
            if spans and first <= spans[-1][1]:  # "a = 1; b = 2": statements sharing a line parse together
                spans[-1][1] = max(spans[-1][1], last)
            else:
                spans.append([first, last])
        self.lines = data.splitlines(keepends=True)
        self.offsets = [0]
        for line in self.lines:
            self.offsets.append(self.offsets[-1] + len(line))
        self.spans = spans
        self.starts = [s[0] for s in spans]
        self.parsed: dict[int, list[tuple[int, int, frozenset[str], bool]] | None] = {}
        self.ok = True

    def _segment(self, index: int) -> list[tuple[int, int, frozenset[str], bool]] | None:
        """(start, end, names bound, effect) of the statements of one segment; None when it does not parse."""
        if index in self.parsed:
            return self.parsed[index]
        from runner.impact import _bound

        first, last = self.spans[index]
        try:
            tree = ast.parse(b"".join(self.lines[first - 1:last]))
        except (SyntaxError, ValueError):
            self.parsed[index] = None
            return None
        out = []
        for node in tree.body:
            names, effect = _bound(node, set())  # the import set only adds effects, and an effect is a proof
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            out.append((start + first - 1, (node.end_lineno or node.lineno) + first - 1,
                        frozenset(names - {"__doc__"}), effect))
        self.parsed[index] = out
        return out

    def _index_of(self, line: int) -> int | None:
        i = bisect.bisect_right(self.starts, line) - 1
        return i if i >= 0 and self.spans[i][0] <= line <= self.spans[i][1] else None

    def stmt_at(self, line: int) -> tuple[frozenset[str], bool] | None:
        """(names, effect) of the first top-level statement holding ``line``, as ``ModuleInfo.changed_at`` picks."""
        if not 1 <= line <= len(self.lines):
            return None
        text = self.lines[line - 1]
        if not text.strip() or text.lstrip().startswith(b"#"):
            return None
        index = self._index_of(line)
        stmts = self._segment(index) if index is not None else None
        for start, end, names, effect in stmts or ():
            if start <= line <= end:
                return names, effect
        return None

    def binds(self, name: str) -> bool:
        """Whether some top-level statement binds ``name`` (only segments that spell it are parsed)."""
        seen: set[int] = set()
        for m in re.finditer(rb"(?<![\w])" + re.escape(name.encode()) + rb"(?![\w])", self.data):
            line = bisect.bisect_right(self.offsets, m.start())
            index = self._index_of(line)
            if index is None or index in seen:
                continue
            seen.add(index)
            if len(seen) > _MAX_SEGMENTS:
                return False
            if any(name in names for _s, _e, names, _eff in self._segment(index) or ()):
                return True
        return False


def touches_kept_definition(head: Outline, base: Outline, added: Iterable[int], removed: Iterable[int]) -> bool:
    """True only when the full tables would find the change not inert: a changed statement has an
    effect (the module is "all") or binds a name that both sides bind."""
    if not (head.ok and base.ok):
        return False
    for side, lines in ((head, added), (base, removed)):
        for line in lines:
            got = side.stmt_at(line)
            if got is None:
                continue
            names, effect = got
            if effect:
                return True
            if any(head.binds(n) and base.binds(n) for n in sorted(names)):
                return True
    return False
