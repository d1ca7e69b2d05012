"""ChangeSet → PillarMap: each hunk to pillars, by path glob and by its enclosing symbol.

A path glob says which files belong to a pillar; a symbol pattern catches the
pillar's code living in a shared file (``persistent_kernel.py::*_layer``). The
symbol is the innermost function, method or class around the hunk, taken from
the head version, or from the base version when the hunk only deletes lines.
"""

from __future__ import annotations

import bisect
import fnmatch
from dataclasses import dataclass
from functools import lru_cache

import pathspec

from checks import syntax
from checks.config import Config, Pillar
from checks.model import ChangeSet, Checkout, FileChange, HunkPillars, PillarHit, PillarMap, Touch
from checks.workspace import read_blob

# Definition node types per grammar, and how their name is found.
_PY_DEFS = {"function_definition", "class_definition"}
_C_DEFS = {"function_definition", "class_specifier", "struct_specifier", "namespace_definition",
           "union_specifier", "enum_specifier"}
_QUERIES = {
    "python": "(function_definition) @d (class_definition) @d",
    "c": "(function_definition) @d (struct_specifier body: (_)) @d (enum_specifier body: (_)) @d",
    "cpp": "(function_definition) @d (class_specifier body: (_)) @d (struct_specifier body: (_)) @d "
    "(namespace_definition) @d (enum_specifier body: (_)) @d",
}
_QUERIES["cuda"] = _QUERIES["cpp"]


@dataclass(frozen=True)
class Symbol:
    start: int  # 1-based first line
    end: int  # 1-based last line
    name: str  # qualified: Class.method (python), ns::Class::method (C/C++/CUDA)
    depth: int


@lru_cache(maxsize=None)
def _query(lang: str):
    import tree_sitter as ts

    return ts.Query(syntax.language(lang), _QUERIES[lang])


def _declarator_name(node) -> str | None:
    """Walk a C/C++ declarator chain down to the declared name (``Graph::register_x``)."""
    while node is not None:
        if node.type in ("identifier", "field_identifier", "qualified_identifier", "destructor_name",
                         "operator_name", "type_identifier", "namespace_identifier", "template_function"):
            return syntax.text(node)
        node = node.child_by_field_name("declarator")
    return None


def _own_name(node, lang: str) -> str | None:
    if lang == "python":
        name = node.child_by_field_name("name")
        return syntax.text(name) if name else None
    if node.type == "function_definition":
        return _declarator_name(node.child_by_field_name("declarator"))
    name = node.child_by_field_name("name")
    return syntax.text(name) if name else ("(anonymous)" if node.type == "namespace_definition" else None)


@lru_cache(maxsize=4096)
def _symbols_cached(lang: str, blob: str, repo: str) -> tuple[Symbol, ...]:
    return tuple(symbols_in(lang, read_blob(repo, blob), key=blob))


def symbols_in(lang: str, data: bytes, key: str | None = None) -> list[Symbol]:
    """Every definition in a file with its qualified name, sorted by start line."""
    import tree_sitter as ts

    tree = syntax.parse(lang, data, key=key)
    defs = set(_PY_DEFS if lang == "python" else _C_DEFS)
    captures = ts.QueryCursor(_query(lang)).captures(tree.root_node).get("d", [])
    sep = "." if lang == "python" else "::"
    out = []
    for node in captures:
        own = _own_name(node, lang)
        if own is None:
            continue
        parts, depth, parent = [own], 0, node.parent
        while parent is not None:
            if parent.type in defs:
                pname = _own_name(parent, lang)
                if pname:
                    parts.append(pname)
                    depth += 1
            parent = parent.parent
        start = node.parent if node.parent is not None and node.parent.type == "decorated_definition" else node
        out.append(Symbol(start.start_point[0] + 1, node.end_point[0] + 1, sep.join(reversed(parts)), depth))
    out.sort(key=lambda s: (s.start, -s.end))
    return out


def innermost(symbols: list[Symbol] | tuple[Symbol, ...], line: int) -> str | None:
    """The deepest definition whose span holds ``line``."""
    starts = [s.start for s in symbols]
    best = None
    for s in symbols[: bisect.bisect_right(starts, line)]:
        if s.start <= line <= s.end and (best is None or s.depth >= best.depth):
            best = s
    return best.name if best else None


class PillarMatcher:
    """Compiled globs for each pillar; pathspec's gitwildmatch gives gitignore-style ``**``."""

    def __init__(self, pillars: list[Pillar]):
        self.pillars = pillars
        self.paths = {
            p.id: [(pat, pathspec.PathSpec.from_lines("gitwildmatch", [pat])) for pat in p.paths]
            for p in pillars
            if p.paths
        }
        self.symbols = {
            p.id: [(pat, pathspec.PathSpec.from_lines("gitwildmatch", [pat.split("::", 1)[0]]), pat.split("::", 1)[1])
                   for pat in p.symbols]
            for p in pillars
            if p.symbols
        }

    def by_path(self, path: str) -> list[tuple[str, str]]:
        """(pillar id, first matching glob) for each pillar whose paths match."""
        hits = []
        for pid, patterns in self.paths.items():
            for pattern, spec in patterns:
                if spec.match_file(path):
                    hits.append((pid, pattern))
                    break
        return hits

    def by_symbol(self, path: str, symbol: str) -> list[tuple[str, str]]:
        hits = []
        for pid, patterns in self.symbols.items():
            for raw, spec, name_pat in patterns:
                if spec.match_file(path) and fnmatch.fnmatchcase(symbol, name_pat):
                    hits.append((pid, raw))
                    break
        return hits


def touched_symbols(symbols: list[Symbol] | tuple[Symbol, ...], lines: list[int]) -> list[tuple[str, int]]:
    """(name, first changed line) of each symbol that is innermost for at least one changed line.

    Linear in the number of symbols plus a bisect each, so a 50k-line added
    file costs no more than its parse.
    """
    lines = sorted(lines)
    counts = [bisect.bisect_right(lines, s.end) - bisect.bisect_left(lines, s.start) for s in symbols]
    child = [0] * len(symbols)
    stack: list[int] = []
    for i, sym in enumerate(symbols):
        while stack and symbols[stack[-1]].end < sym.start:
            stack.pop()
        if stack:
            child[stack[-1]] += counts[i]
        stack.append(i)
    out = []
    for i, sym in enumerate(symbols):
        if counts[i] > child[i]:
            out.append((sym.name, lines[bisect.bisect_left(lines, sym.start)]))
    return out


def _hunk_symbols(checkout: Checkout, fc: FileChange) -> list[tuple[list[tuple[str, int]], int]]:
    """Per hunk: the symbols it touches (innermost, with their first changed line) and its first line."""
    lang = None if fc.binary else syntax.lang_for_path(fc.path)
    cache: dict[str, tuple[Symbol, ...]] = {}
    out = []
    for h in fc.hunks:
        head_side = bool(h.added)
        lines = h.added if head_side else h.removed
        first = lines[0] if lines else h.new_start
        blob = fc.new_blob if head_side else fc.old_blob
        if lang is None or not blob:
            out.append(([], first))
            continue
        if blob not in cache:
            try:
                cache[blob] = _symbols_cached(lang, blob, checkout.repo)
            except ValueError:  # blob missing from a shallow mirror
                cache[blob] = ()
        out.append((touched_symbols(cache[blob], lines), first))
    return out


def map_pillars(checkout: Checkout, config: Config, changes: ChangeSet) -> PillarMap:
    matcher = PillarMatcher(config.pillars)
    hits: dict[str, PillarHit] = {p.id: PillarHit(id=p.id, title=p.title) for p in config.pillars}
    hunk_rows: list[HunkPillars] = []

    def touch(pid: str, fc: FileChange, reason: str, pattern: str, symbol: str | None, line: int | None) -> None:
        hit = hits[pid]
        if fc.path not in hit.files:
            hit.files.append(fc.path)
        if symbol and f"{fc.path}::{symbol}" not in hit.symbols:
            hit.symbols.append(f"{fc.path}::{symbol}")
        t = next((t for t in hit.touches if t.path == fc.path and t.reason == reason and t.pattern == pattern), None)
        if t is None:
            t = Touch(path=fc.path, reason=reason, pattern=pattern)
            hit.touches.append(t)
        if symbol and symbol not in t.symbols:
            t.symbols.append(symbol)
        if line is not None and line not in t.lines:
            t.lines.append(line)

    for fc in changes.files:
        path_hits = matcher.by_path(fc.path)
        if fc.old_path:
            path_hits += [h for h in matcher.by_path(fc.old_path) if h[0] not in {x[0] for x in path_hits}]
        hunk_syms = _hunk_symbols(checkout, fc) if fc.hunks else []
        if not fc.hunks:  # binary, pure rename, mode change, empty file
            for pid, pattern in path_hits:
                touch(pid, fc, "path", pattern, None, None)
            if not path_hits:
                touch("other", fc, "fallback", "", None, None)
            continue
        for index, (symbols, first) in enumerate(hunk_syms):
            pillars: list[str] = []
            for pid, pattern in path_hits:
                if symbols:
                    for symbol, line in symbols:
                        touch(pid, fc, "path", pattern, symbol, line)
                else:
                    touch(pid, fc, "path", pattern, None, first)
                pillars.append(pid)
            for symbol, line in symbols:
                for pid, pattern in matcher.by_symbol(fc.path, symbol):
                    if pid not in pillars:
                        pillars.append(pid)
                    touch(pid, fc, "symbol", pattern, symbol, line)
            if not pillars:
                for symbol, line in symbols or [(None, first)]:
                    touch("other", fc, "fallback", "", symbol, line)
                pillars.append("other")
            names = [name for name, _ in symbols]
            hunk_rows.append(HunkPillars(path=fc.path, hunk=index, symbol=names[0] if names else None,
                                         pillars=pillars, symbols=names))

    return PillarMap(pillars=[h for h in hits.values() if h.files], hunks=hunk_rows)
