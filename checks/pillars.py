"""ChangeSet → PillarMap: each hunk to pillars, by path glob and by its enclosing symbol.

A path glob says which files belong to a pillar; a symbol pattern catches the
pillar's code living in a shared file (``persistent_kernel.py::*_layer``). The
symbol is the innermost function, method or class around the hunk, taken from
the head version, or from the base version when the hunk only deletes lines.
"""

from __future__ import annotations

import bisect
import fnmatch
import os
import re
import threading
from dataclasses import dataclass
from functools import cache
from typing import Literal

from checks import syntax
from checks.config import Config, Pillar
from checks.globs import compile_globs
from checks.model import ChangeSet, Checkout, FileChange, HunkPillars, PillarHit, PillarMap, Touch
from checks.workspace import read_blob

# Definition node types per grammar. Namespaces qualify names but are never a hunk's symbol.
_PY_DEFS = {"function_definition", "class_definition"}
_C_DEFS = {"function_definition", "class_specifier", "struct_specifier", "namespace_definition",
           "union_specifier", "enum_specifier"}
_QUERIES = {
    "python": "(function_definition) @d (class_definition) @d",
    "c": "(function_definition) @d (struct_specifier body: (_)) @d (enum_specifier body: (_)) @d",
    "cpp": "(function_definition) @d (class_specifier body: (_)) @d (struct_specifier body: (_)) @d "
    "(enum_specifier body: (_)) @d",
}
_QUERIES["cuda"] = _QUERIES["cpp"]


@dataclass(frozen=True)
class Symbol:
    start: int  # 1-based first line
    end: int  # 1-based last line
    name: str  # qualified: Class.method (python), ns::Class::method (C/C++/CUDA)


@cache
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


def symbols_in(lang: str, data: bytes, key: str | None = None,
               spans: list[tuple[int, int]] | None = None) -> list[Symbol]:
    """Definitions in a file with qualified names, sorted by start line.

    With ``spans`` (1-based inclusive line ranges), only definitions that
    intersect one of them: the query runs in C over those ranges alone, so a
    small hunk in a large file costs little beyond the parse.
    """
    import tree_sitter as ts

    tree = syntax.parse(lang, data, key=key)
    if spans is None:
        captures = ts.QueryCursor(_query(lang)).captures(tree.root_node).get("d", [])
    else:
        found: dict[tuple[int, int], ts.Node] = {}
        cursor = ts.QueryCursor(_query(lang))
        for first, last in spans:
            cursor.set_point_range((max(first - 1, 0), 0), (last, 0))
            for node in cursor.captures(tree.root_node).get("d", []):
                found[(node.start_byte, node.end_byte)] = node
        captures = list(found.values())
    defs = set(_PY_DEFS if lang == "python" else _C_DEFS)
    sep = "." if lang == "python" else "::"
    out = []
    for node in captures:
        own = _own_name(node, lang)
        if own is None:
            continue
        parts, parent = [own], node.parent
        while parent is not None:
            if parent.type in defs:
                pname = _own_name(parent, lang)
                if pname:
                    parts.append(pname)
            parent = parent.parent
        start = node.parent if node.parent is not None and node.parent.type == "decorated_definition" else node
        out.append(Symbol(start.start_point[0] + 1, node.end_point[0] + 1, sep.join(reversed(parts))))
    out.sort(key=lambda s: (s.start, -s.end))
    return out


class PillarMatcher:
    """Compiled globs for each pillar; pathspec gives gitignore-style ``**``.

    A ``paths`` entry starting with ``!`` excludes: a file it matches is not in
    that pillar, whichever glob or symbol pattern would have put it there
    (the built-in default keeps test code out of the four checklist pillars).
    """

    def __init__(self, pillars: list[Pillar]):
        self.pillars = pillars
        self.paths = {
            p.id: [(pat, compile_globs(pat)) for pat in p.paths if not pat.startswith("!")]
            for p in pillars
            if any(not pat.startswith("!") for pat in p.paths)
        }
        # one spec per pillar first: most files match none of a pillar's globs, and one match_file says so
        self.any_path = {pid: compile_globs([pat for pat, _spec in patterns]) for pid, patterns in self.paths.items()}
        self.excluded = {
            p.id: compile_globs([pat[1:] for pat in p.paths if pat.startswith("!")])
            for p in pillars
            if any(pat.startswith("!") for pat in p.paths)
        }
        self.symbols = {
            p.id: [(pat, compile_globs(pat.split("::", 1)[0]),
                    re.compile(fnmatch.translate(pat.split("::", 1)[1]))) for pat in p.symbols]
            for p in pillars
            if p.symbols
        }

    def _excludes(self, pid: str, path: str) -> bool:
        spec = self.excluded.get(pid)
        return spec is not None and spec.match_file(path)

    def by_path(self, path: str) -> list[tuple[str, str]]:
        """(pillar id, first matching glob) for each pillar whose paths match."""
        hits = []
        for pid, patterns in self.paths.items():
            if not self.any_path[pid].match_file(path):
                continue
            for pattern, spec in patterns:
                if spec.match_file(path):
                    if not self._excludes(pid, path):
                        hits.append((pid, pattern))
                    break
        return hits

    def symbol_patterns(self, path: str) -> list[tuple[str, str, re.Pattern]]:
        """(pillar id, raw pattern, compiled name pattern) whose path glob matches ``path``."""
        return [(pid, raw, name_re) for pid, patterns in self.symbols.items()
                for raw, spec, name_re in patterns if spec.match_file(path) and not self._excludes(pid, path)]


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


_HunkJob = tuple[str, bytes, str, list[list[int]]]  # lang, data, blob sha, changed lines per hunk
PARALLEL_MIN_BYTES = 512 * 1024


def _symbols_job(job: _HunkJob) -> list[list[tuple[str, int]]]:
    lang, data, blob, hunk_lines = job
    return [touched_symbols(symbols_in(lang, data, key=blob, spans=[(ls[0], ls[-1])]), ls) if ls else []
            for ls in hunk_lines]


def _run_jobs(jobs: list[_HunkJob]) -> list[list[list[tuple[str, int]]]]:
    """Answers per job, from a cache keyed by blob and changed lines, so a re-audit re-parses nothing."""
    results: list = [_results_cache.get(_job_key(j)) for j in jobs]
    todo = [i for i, r in enumerate(results) if r is None]
    for i, res in zip(todo, _run_uncached([jobs[i] for i in todo])):
        results[i] = res
        if len(_results_cache) > 50_000:
            _results_cache.clear()
        _results_cache[_job_key(jobs[i])] = res
    return results


_results_cache: dict[tuple, list] = {}


def _job_key(job: _HunkJob) -> tuple:
    lang, _data, blob, hunk_lines = job
    return (lang, blob, tuple((ls[0], ls[-1], len(ls)) for ls in hunk_lines), hash(tuple(map(tuple, hunk_lines))))


def _run_uncached(jobs: list[_HunkJob]) -> list[list[list[tuple[str, int]]]]:
    """Parse in two processes when the change is large and forking is safe (single-threaded CLI).

    Tree-sitter holds the GIL while parsing, so threads don't help; a forked
    child takes about half the bytes, which halves the stage on a 2-core box.
    """
    total = sum(len(j[1]) for j in jobs)
    if total < PARALLEL_MIN_BYTES or (os.cpu_count() or 1) < 2 or threading.active_count() > 1 \
            or not hasattr(os, "fork"):
        return _run_serial(jobs)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    for lang in {j[0] for j in jobs}:  # compile once, before the fork, so the child inherits them
        _query(lang)

    order = sorted(range(len(jobs)), key=lambda i: -len(jobs[i][1]))
    mine: list[int] = []
    theirs: list[int] = []
    load = [0, 0]
    for i in order:  # greedy split by bytes
        side = 0 if load[0] <= load[1] else 1
        (mine if side == 0 else theirs).append(i)
        load[side] += len(jobs[i][1])
    results: list = [None] * len(jobs)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        remote = pool.submit(_run_serial, [jobs[i] for i in theirs])
        for i in mine:
            results[i] = _symbols_job(jobs[i])
        for i, res in zip(theirs, remote.result()):
            results[i] = res
    return results


def _run_serial(jobs: list[_HunkJob]) -> list[list[list[tuple[str, int]]]]:
    return [_symbols_job(j) for j in jobs]


def _file_job(checkout: Checkout, fc: FileChange,
              max_bytes: int | None = None) -> tuple[list[_HunkJob], list[tuple[int, int, int]], bool]:
    """Jobs for one file's hunks (head side, and base side for deletion-only hunks), and where each
    hunk's answer lands: (job index within the returned list, hunk position in that job, first line).
    A blob over ``max_bytes`` gets no job (its hunks land nowhere): it is mapped by path only."""
    lang = None if fc.binary else syntax.lang_for_path(fc.path)
    sides: dict[str, list[list[int]]] = {}
    where = []
    for h in fc.hunks:
        head_side = bool(h.added)
        lines = h.added if head_side else h.removed
        first = lines[0] if lines else h.new_start
        blob = fc.new_blob if head_side else fc.old_blob
        if lang is None or not blob or not lines:
            where.append((-1, -1, first))
            continue
        bucket = sides.setdefault(blob, [])
        where.append((list(sides).index(blob), len(bucket), first))
        bucket.append(lines)
    jobs: list[_HunkJob] = []
    oversized = False
    if lang is None:
        return jobs, where, oversized
    at: list[int] = []  # side index → job index, -1 for a side mapped by path only
    for blob, hunk_lines in sides.items():
        try:
            data = read_blob(checkout.repo, blob)
        except ValueError:  # blob missing from a shallow mirror
            data = b""
        if max_bytes is not None and len(data) > max_bytes:  # generated code: costs more than the audit
            at.append(-1)
            oversized = True
            continue
        at.append(len(jobs))
        jobs.append((lang, data, blob, hunk_lines))
    if oversized:
        where = [(at[j], k, first) if j >= 0 and at[j] >= 0 else (-1, -1, first) for j, k, first in where]
    return jobs, where, oversized


def map_pillars(checkout: Checkout, config: Config, changes: ChangeSet) -> PillarMap:
    matcher = PillarMatcher(config.pillars)
    hits: dict[str, PillarHit] = {p.id: PillarHit(id=p.id, title=p.title) for p in config.pillars}
    hunk_rows: list[HunkPillars] = []

    seen_files: set[tuple[str, str]] = set()
    seen_symbols: set[tuple[str, str]] = set()
    touches: dict[tuple[str, str, str, str], Touch] = {}
    said: dict[tuple[str, str, str, str], tuple[set[str], set[int]]] = {}  # a Touch's symbols and lines, as sets

    def touch(pid: str, fc: FileChange, reason: Literal["path", "symbol", "fallback"], pattern: str,
              symbol: str | None, line: int | None) -> None:
        hit = hits[pid]
        if (pid, fc.path) not in seen_files:
            seen_files.add((pid, fc.path))
            hit.files.append(fc.path)
        if symbol and (pid, f"{fc.path}::{symbol}") not in seen_symbols:
            seen_symbols.add((pid, f"{fc.path}::{symbol}"))
            hit.symbols.append(f"{fc.path}::{symbol}")
        key = (pid, fc.path, reason, pattern)
        t = touches.get(key)
        if t is None:
            t = touches[key] = Touch(path=fc.path, reason=reason, pattern=pattern)
            hit.touches.append(t)
            said[key] = (set(), set())
        symbols, lines = said[key]  # membership in sets: a 300k-function file stays linear
        if symbol and symbol not in symbols:
            symbols.add(symbol)
            t.symbols.append(symbol)
        if line is not None and line not in lines:
            lines.add(line)
            t.lines.append(line)

    all_jobs: list[_HunkJob] = []
    placement: dict[int, list[tuple[int, int, int]]] = {}
    max_bytes = getattr(config.settings, "max_file_bytes", None)
    oversized: list[str] = []
    for n, fc in enumerate(changes.files):
        jobs, where, over = _file_job(checkout, fc, max_bytes)
        if over:
            oversized.append(fc.path)
        offset = len(all_jobs)
        all_jobs += jobs
        placement[n] = [(offset + j if j >= 0 else -1, k, first) for j, k, first in where]
    answers = _run_jobs(all_jobs)

    for n, fc in enumerate(changes.files):
        path_hits = matcher.by_path(fc.path)
        if fc.old_path:
            path_hits += [h for h in matcher.by_path(fc.old_path) if h[0] not in {x[0] for x in path_hits}]
        hunk_syms = [(answers[j][k] if j >= 0 else [], first) for j, k, first in placement[n]]
        sym_patterns = matcher.symbol_patterns(fc.path) if hunk_syms else []
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
                matched: set[str] = set()
                for pid, pattern, name_re in sym_patterns:
                    if pid in matched or not name_re.match(symbol):
                        continue
                    matched.add(pid)
                    if pid not in pillars:
                        pillars.append(pid)
                    touch(pid, fc, "symbol", pattern, symbol, line)
            if not pillars:
                fallback: list[tuple[str | None, int]] = list(symbols) or [(None, first)]
                for fsymbol, fline in fallback:
                    touch("other", fc, "fallback", "", fsymbol, fline)
                pillars.append("other")
            names = [name for name, _ in symbols]
            hunk_rows.append(HunkPillars(path=fc.path, hunk=index, symbol=names[0] if names else None,
                                         pillars=pillars, symbols=names))

    return PillarMap(pillars=[h for h in hits.values() if h.files], hunks=hunk_rows, oversized=oversized)

