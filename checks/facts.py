"""Facts: rows of (key, value fields, file, line) pulled out of code by a ``[[fact]]`` entry.

Rules never look at code, only at rows, so one rule kind works on any repo
whose layout a few queries can describe. Rows are cached by (fact, path, blob
SHA): base and head share almost every blob, so the second side of an audit and
any later audit of the same repo re-extract only the files that changed.

Options a ``[[fact]]`` accepts besides ``id``/``lang``/``files``/``query``/``regex``
(they arrive in ``Fact.options``; docs/rules.md has worked examples):

``key``      capture (or regex group) giving the row key; default ``"key"``.
             ``"@function"``: the name of the function around the first capture.
             ``"@index"``: the row's position in its file (0, 1, ...), for list literals.
``scope``    keep only matches inside ``"function:GLOB"``, ``"enum:GLOB"``,
             ``"class:GLOB"`` or ``"if-chain:REGEX"`` (an if/else-if chain whose
             first condition matches REGEX).
``count``    capture to count per function: each row gains ``count``, the range
             (unconditional, total) of that capture inside the key's function.
``len``      captures whose value is their number of elements (list/argument length).
``sub``      ``{field = ["pattern", "replacement"]}``: a regex substitution per field
             (``key`` included), applied before ``case``.
``case``     ``{field = "upper" | "lower"}``, or a bare string for the key.
``ignore``   key globs to drop, e.g. ``["*_BEGIN", "*_END"]``.
``unquote``  strip string-literal quotes from values; default true.
``key``      may also be a template: ``"{module}.{name}"`` (captures, and the file's
             ``module``/``path``/``dir``/``stem``).
``normalize`` key steps after sub/case: lower, upper, snake, no-separators,
             strip-prefix:TEXT, strip-suffix:TEXT.
``aliases``  ``{normalised = "KEY"}``: a convention's exceptions.
``matches``  ``{field = ["capture", "regex"]}``: the number of regex matches in a capture.
``follow_aliases`` true: a key that is a local name bound earlier in its function
             (``f = mod.op``; ``auto f = ns::op;``) is the bound name (``mod.op``).
``read``     regex facts: ``"code"`` skips comments, ``"strings"`` reads string literals
             only, adjacent ones joined.
``preprocess`` C/C++/CUDA: blank attribute macros and ``#if`` branches before parsing
             (checks/preprocess.py); default true.
``optional`` true: selecting no file is not a problem (a layout some eras lack); the
             fact's rules are skipped quietly.

Captures whose name starts with ``_`` only serve predicates and are not fields.
A ``lang = "path"`` fact has no query or regex: its rows are the files its globs select.
The file is parsed with the fact's ``lang`` whatever its extension (CUDA's
grammar is a superset of C++, so ``lang = "cuda"`` reads ``.cu``/``.cuh``/``.h``).
"""

from __future__ import annotations

import fnmatch
import json
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pathspec
import tree_sitter as ts

from checks import syntax
from checks.config import Fact
from checks.globs import compile_globs
from checks.preprocess import preprocess

OPTIONS = ("key", "scope", "count", "len", "sub", "case", "ignore", "unquote", "optional", "preprocess",
           "normalize", "aliases", "matches", "read", "follow_aliases")
SCOPE_KINDS = ("function", "enum", "class", "if-chain")


class FactError(ValueError):
    """The fact cannot run at all (its query does not compile, a bad option); names the entry."""


@dataclass(frozen=True)
class Count:
    """How many times a call happens in a function: ``lo`` outside any branch, ``hi`` in total."""

    lo: int
    hi: int

    def __contains__(self, n: object) -> bool:
        return isinstance(n, int) and self.lo <= n <= self.hi

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}..{self.hi}"


@dataclass
class Row:
    fact: str
    key: str
    values: dict[str, Any]
    path: str
    line: int  # 1-based
    nodes: dict[str, ts.Node | None] = field(default_factory=dict, compare=False, repr=False)
    written: str = field(default="", compare=False)  # the key as the source spells it, where sub/case changed it

    def get(self, name: str) -> Any:
        return self.key if name == "key" else self.values.get(name)

    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class FactResult:
    """Rows of one fact over one tree, and why some files could not be read fully."""

    rows: list[Row] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "path:line: syntax error ..."
    inputs: str = ""  # digest of the (path, blob) pairs read: equal inputs, equal rows (stable across processes)


def _digest(parts) -> str:
    import hashlib

    return hashlib.sha1("\0".join(parts).encode()).hexdigest()


def describe(fact: Fact) -> str:
    return f"fact '{fact.id}'" + (f" (line {fact.line})" if fact.line else "")


# --------------------------------------------------------------------------- compiling


@dataclass(frozen=True)
class _Finish:
    """Row transforms resolved once per fact, not per row."""

    unquote: bool
    subs: tuple[tuple[str, re.Pattern, str], ...]
    cases: tuple[tuple[str, str], ...]
    ignore: tuple[str, ...]
    template: str | None = None  # a composite key such as "{module}.{name}"
    anchor: str = "key"  # the capture the template's first field names
    normalize: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    matches: tuple[tuple[str, str, re.Pattern], ...] = ()  # (new field, source field, pattern)

    @property
    def identity(self) -> bool:
        return not (self.unquote or self.subs or self.cases or self.ignore or self.template or self.normalize
                    or self.aliases or self.matches)


@dataclass(frozen=True)
class _Compiled:
    fact: Fact
    query: ts.Query | None
    regex: re.Pattern | None
    spec: pathspec.PathSpec
    signature: str
    finish: _Finish
    # Per pattern, groups of literals of which the file must contain one each (from #eq?/#any-of?
    # on captures that are always present); None when some pattern needs no literal.
    needs: tuple[tuple[tuple[bytes, ...], ...], ...] | None = None

    def may_match(self, data: bytes) -> bool:
        """False only when no pattern can match: the file lacks a literal every match would contain."""
        if self.needs is None:
            return True
        return any(all(any(lit in data for lit in group) for group in pattern) for pattern in self.needs)


_PREDICATE = re.compile(r'\(\s*#(eq|any-of)\?\s+@([\w.-]+)((?:\s+"(?:[^"\\]|\\.)*")+)\s*\)')
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ALWAYS = {"", "+"}  # capture_quantifier: exactly one, one or more


def _needs(query: ts.Query, source: str) -> tuple[tuple[tuple[bytes, ...], ...], ...] | None:
    """The literals each pattern's text predicates force into any file it matches."""
    raw = source.encode()
    index = {query.capture_name(i): i for i in range(query.capture_count)}
    out = []
    for p in range(query.pattern_count):
        text = raw[query.start_byte_for_pattern(p) : query.end_byte_for_pattern(p)].decode()
        groups = []
        for _, cap, strings in _PREDICATE.findall(text):
            if cap in index and query.capture_quantifier(p, index[cap]) in _ALWAYS:
                lits = tuple(
                    bytes(s, "utf-8").decode("unicode_escape").encode("utf-8") for s in _STRING.findall(strings)
                )
                if lits and all(lits):
                    groups.append(lits)
        if not groups:
            return None
        out.append(tuple(groups))
    return tuple(out)


_TEMPLATE_FIELD = re.compile(r"\{(\w+)\}")
PATH_FIELDS = ("module", "path", "stem", "dir")  # what a key template may take from the row's file


def key_capture(fact: Fact) -> str:
    """The capture that anchors each row: ``key``, the ``key`` option, or a key template's first capture."""
    key = fact.options.get("key", "key")
    if isinstance(key, str) and "{" in key:
        names = [n for n in _TEMPLATE_FIELD.findall(key) if n not in PATH_FIELDS]
        return names[0] if names else "@path"
    return key if isinstance(key, str) else "key"


def module_of(path: str) -> str:
    """``pkg/sub/mod.py`` → ``pkg.sub.mod`` (``__init__`` names its package)."""
    stem = path.rsplit(".", 1)[0] if "." in path.rsplit("/", 1)[-1] else path
    parts = [p for p in stem.split("/") if p]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


NORMALIZE = ("lower", "upper", "no-separators", "snake")


def normalize_key(key: str, steps: tuple[str, ...]) -> str:
    for step in steps:
        if step == "lower":
            key = key.lower()
        elif step == "upper":
            key = key.upper()
        elif step == "no-separators":
            key = re.sub(r"[-_.\s]", "", key)
        elif step == "snake":
            key = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).replace("-", "_").lower()
        elif step.startswith("strip-prefix:") and key.startswith(step[13:]):
            key = key[len(step) - 13:]
        elif step.startswith("strip-suffix:") and key.endswith(step[13:]) and step[13:]:
            key = key[: -len(step[13:])]
    return key


def validate_options(fact: Fact) -> None:
    """Raise FactError for an option this module does not understand or a malformed one."""
    opts = fact.options
    for k in opts:
        if k not in OPTIONS:
            raise FactError(f"{describe(fact)}: unknown option '{k}'; use one of {', '.join(OPTIONS)}")
    scope = opts.get("scope")
    if scope is not None:
        kind, _, name = str(scope).partition(":")
        if kind not in SCOPE_KINDS or not name:
            raise FactError(f"{describe(fact)}: scope '{scope}' must be KIND:NAME with KIND one of {', '.join(SCOPE_KINDS)}")
        if fact.lang == "regex" or not fact.query:
            raise FactError(f"{describe(fact)}: 'scope' needs a tree-sitter query, not a regex")
    for name in ("sub", "case"):
        value = opts.get(name)
        if value is None:
            continue
        if name == "case" and isinstance(value, str):
            value = {"key": value}
        if not isinstance(value, dict):
            raise FactError(f"{describe(fact)}: '{name}' must be a table like {{ key = ... }}")
        for f, v in value.items():
            if name == "case" and v not in ("upper", "lower"):
                raise FactError(f"{describe(fact)}: case for '{f}' must be \"upper\" or \"lower\"")
            if name == "sub":
                if not (isinstance(v, list) and len(v) == 2 and all(isinstance(s, str) for s in v)):
                    raise FactError(f"{describe(fact)}: sub for '{f}' must be [\"pattern\", \"replacement\"]")
                try:
                    re.compile(v[0])
                except re.error as exc:
                    raise FactError(f"{describe(fact)}: sub pattern for '{f}' does not compile: {exc}") from None
    for name in ("len", "ignore"):
        value = opts.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise FactError(f"{describe(fact)}: '{name}' must be a list of strings")
    if "count" in opts and not isinstance(opts["count"], str):
        raise FactError(f"{describe(fact)}: 'count' must name a capture")
    norm = opts.get("normalize", [])
    if not isinstance(norm, list) or not all(
        isinstance(x, str) and (x in NORMALIZE or x.startswith(("strip-prefix:", "strip-suffix:"))) for x in norm
    ):
        raise FactError(f"{describe(fact)}: 'normalize' must be a list of {', '.join(NORMALIZE)}, "
                        f"\"strip-prefix:TEXT\" or \"strip-suffix:TEXT\"")
    aliases = opts.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise FactError(f"{describe(fact)}: 'aliases' must be a table like {{ rmsnorm = \"RMS_NORM\" }}")
    matches = opts.get("matches", {})
    if not isinstance(matches, dict) or not all(
        isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v) for v in matches.values()
    ):
        raise FactError(f"{describe(fact)}: 'matches' must be a table like {{ n_args = [\"template\", \"\\\\$\"] }}")
    for f, (_, pattern) in matches.items():
        try:
            re.compile(pattern)
        except re.error as exc:
            raise FactError(f"{describe(fact)}: matches pattern for '{f}' does not compile: {exc}") from None
    if opts.get("read", "all") not in ("all", "code", "strings"):
        raise FactError(f"{describe(fact)}: read must be \"all\", \"code\" (comments skipped) or \"strings\"")
    if "read" in opts and (fact.query or fact.lang == "path"):
        raise FactError(f"{describe(fact)}: 'read' is for regex facts; a query already tells code from comments")
    if "follow_aliases" in opts and not fact.query:
        raise FactError(f"{describe(fact)}: 'follow_aliases' needs a tree-sitter query")
    for name in ("optional", "unquote", "preprocess", "follow_aliases"):
        if name in opts and not isinstance(opts[name], bool):
            raise FactError(f"{describe(fact)}: '{name}' must be true or false")
    if "key" in opts and not isinstance(opts["key"], str):
        raise FactError(f"{describe(fact)}: 'key' must name a capture")
    if fact.query:
        problem = lint_query(fact.query)
        if problem:
            raise FactError(f"{describe(fact)}: {problem}")


_ESCAPES = set('\\"ntr0')


@lru_cache(maxsize=1024)
def lint_query(text: str) -> str | None:
    """Query mistakes tree-sitter accepts silently: a predicate outside its pattern's parentheses
    (ignored), and a regex escape like ``\\w`` that the query language unescapes to ``w``."""
    depth, i, n = 0, 0, len(text)
    line = 1
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
        elif ch == ";":
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    if text[j + 1] not in _ESCAPES:
                        bad = text[j:j + 2]
                        return (f"query line {line}: '{bad}' in a string: the query language reads it as "
                                f"'{bad[1]}', so the regex silently changes; double the backslash in the query text "
                                f"(write \\\\{bad[1]} in a TOML '...' string, \\\\\\\\{bad[1]} in a \"...\" string)")
                    j += 1
                j += 1
            i = j + 1
            continue
        elif ch in "([":
            if depth == 0 and ch == "(" and text[i + 1:].lstrip().startswith("#"):
                pred = text[i:].split(")", 1)[0] + ")"
                return (f"query line {line}: predicate {pred} is outside its pattern's parentheses, so it is "
                        f"ignored; move it inside the pattern, before the last ')'")
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        i += 1
    return None


def fields_of(fact: Fact) -> set[str] | None:
    """The field names a rule may read from the fact's rows; None when the fact does not compile."""
    try:
        c = compile_fact(fact)
    except FactError:
        return None
    key_name = key_capture(fact)
    if c.query is not None:
        names = {c.query.capture_name(i) for i in range(c.query.capture_count)}
    else:
        names = set(c.regex.groupindex) if c.regex is not None else set()
    names = {x for x in names if not x.startswith("_") and x != key_name and x != fact.options.get("count")}
    if fact.options.get("count"):
        names.add("count")
    names |= set(fact.options.get("matches", {}))
    return names | {"key"}


def compile_fact(fact: Fact) -> _Compiled:
    """Compile a fact's query/regex and globs once; raises FactError naming the entry."""
    validate_options(fact)
    sig = json.dumps([fact.id, fact.lang, fact.query, fact.regex, fact.options], sort_keys=True, default=str)
    return _compile(sig, fact)


@lru_cache(maxsize=4096)
def _ts_query(lang: str, text: str) -> ts.Query:
    """One compiled Query per (language, text): inferred rules repeat a few queries over many facts, and
    building a Query is the slow part of compiling a fact. Queries are read-only; each run has its own cursor."""
    return ts.Query(syntax.language(lang), text)


_compile_lock = threading.Lock()
_compiled: dict[str, _Compiled] = {}


def _compile(sig: str, fact: Fact) -> _Compiled:
    key = sig + json.dumps(fact.files)
    hit = _compiled.get(key)
    if hit is not None:
        return hit
    query = regex = None
    if fact.query and fact.lang != "regex":
        try:
            query = _ts_query(fact.lang, fact.query)
        except (ts.QueryError, NameError, ValueError) as exc:
            raise FactError(f"{describe(fact)}: query does not compile for {fact.lang}: {exc}") from None
        names = {query.capture_name(i) for i in range(query.capture_count)}
        wanted = key_capture(fact)
        if wanted not in ("@function", "@index", "@path") and wanted not in names:
            raise FactError(
                f"{describe(fact)}: query has no @{wanted} capture (captures: {', '.join(sorted(names)) or 'none'}); "
                f"add @{wanted} to the node that names each row, or set key = \"...\""
            )
    elif fact.lang == "path":
        wanted = key_capture(fact)
        if wanted not in ("key", "@path"):
            raise FactError(f"{describe(fact)}: a path fact's key is its path or a template of {{path}}, {{dir}}, "
                            f"{{stem}}, {{module}}; '{wanted}' is none of them")
    else:
        regex = re.compile(fact.regex or "", re.M)
        wanted = key_capture(fact)
        if wanted not in ("@index", "@path") and wanted not in regex.groupindex:
            raise FactError(f"{describe(fact)}: regex has no (?P<{wanted}>...) group; add one for the row key")
    spec = compile_globs(fact.files)
    cases = fact.options.get("case", {})
    if isinstance(cases, str):
        cases = {"key": cases}
    key_option = fact.options.get("key", "key")
    finish = _Finish(
        unquote=bool(fact.options.get("unquote", True)),
        subs=tuple((f, re.compile(p), r) for f, (p, r) in fact.options.get("sub", {}).items()),
        cases=tuple(cases.items()),
        ignore=tuple(fact.options.get("ignore", [])),
        template=key_option if isinstance(key_option, str) and "{" in key_option else None,
        anchor=key_capture(fact),
        normalize=tuple(fact.options.get("normalize", [])),
        aliases=tuple(fact.options.get("aliases", {}).items()),
        matches=tuple((f, src, re.compile(p)) for f, (src, p) in fact.options.get("matches", {}).items()),
    )
    needs = _needs(query, fact.query) if query is not None and fact.query else None
    out = _Compiled(fact, query, regex, spec, sig, finish, needs)
    with _compile_lock:
        _compiled[key] = out
    return out


# --------------------------------------------------------------------------- extraction

_rows_cache: dict[tuple[str, str, str], tuple[list[Row], str | None]] = {}
_rows_lock = threading.Lock()
_ROWS_MAX = 100_000  # rows parsed here hold their tree's nodes; rows from disk or a pool hold none


_files_cache: dict[tuple[str, str, str], list[str]] = {}


def _literal_tails(globs: list[str]) -> tuple[str, ...] | None:
    """The fixed text every match must end with, per glob; None when some glob has none."""
    tails = []
    for g in globs:
        if g.startswith("!") or g.endswith(("/", "*", "]", "?")):
            return None
        tail = re.split(r"[*?\]]", g)[-1].lstrip("/")
        # A glob without a file extension may name a directory, which matches everything below it.
        if not tail or "[" in tail or "." not in tail.rsplit("/", 1)[-1]:
            return None
        tails.append(tail)
    return tuple(tails)


def _under_prefixes(paths: list[str], globs: list[str]) -> list[str]:
    """The sorted ``paths`` under the literal directory each glob starts with (found by bisection), so a
    fact over ``include/arch/*.h`` never looks at the rest of a large tree; all paths when a glob has none."""
    import bisect

    prefixes = []
    for g in globs:
        if g.startswith("!"):
            continue
        literal = re.split(r"[*?\[\\]", g.lstrip("/"), maxsplit=1)[0]
        if "/" not in literal:  # no fixed directory (or unanchored, which gitignore matches anywhere)
            return paths
        prefixes.append(literal.rsplit("/", 1)[0] + "/")
    out: list[str] = []
    for prefix in sorted(set(prefixes)):
        lo = bisect.bisect_left(paths, prefix)
        hi = bisect.bisect_left(paths, prefix + "\U0010ffff")
        out.extend(p for p in paths[lo:hi] if not out or p > out[-1])
    return out


def files_for(compiled: _Compiled, tree: Any) -> list[str]:
    """Paths of ``tree`` the fact's globs select, cached per (globs, repo, commit)."""
    key = (json.dumps(compiled.fact.files), str(getattr(tree, "repo_path", "")), tree.sha)
    hit = _files_cache.get(key)
    if hit is None:
        paths = _under_prefixes(tree.paths(), compiled.fact.files)
        tails = _literal_tails(compiled.fact.files)
        if tails:  # str.endswith in C first; the glob match then confirms the few candidates
            paths = [p for p in paths if p.endswith(tails)]
        hit = [p for p in paths if compiled.spec.match_file(p)]
        if len(_files_cache) > 1024:
            _files_cache.clear()
        _files_cache[key] = hit
    return hit


_results: dict[tuple[str, str, str, str], FactResult] = {}


@dataclass(frozen=True)
class Limits:
    """What extraction may spend: the largest file it parses, and the on-disk row cache."""

    max_bytes: int = 2_000_000
    cache: Any = None  # checks.factcache.FactCache, or None
    nodes: frozenset[str] = frozenset()  # facts whose rules read syntax nodes: never served from disk


_DEFAULT_LIMITS = Limits()


def _from_disk(compiled: _Compiled, pairs: list[tuple[str, str]], limits: Limits) -> None:
    """Fill the in-memory row cache from the disk cache for (path, blob) pairs it lacks."""
    if limits.cache is None or compiled.fact.id in limits.nodes:
        return
    missing = [(p, b) for p, b in pairs if (compiled.signature, p, b) not in _rows_cache]
    if not missing:
        return
    got = limits.cache.load(compiled.signature, [b for _, b in missing])
    with _rows_lock:
        for path, blob in missing:
            hit = got.get(blob)
            if hit is None:
                continue
            rows, problem = hit
            for r in rows:
                r.path = path
            _rows_cache[(compiled.signature, path, blob)] = (rows, problem.replace("\0", path, 1) if problem else None)


def prefetch(facts: list[Fact], tree: Any, limits: Limits = _DEFAULT_LIMITS) -> dict[str, bytes]:
    """Read every blob that ``facts`` still need from ``tree`` in one git process."""
    repo_path = str(getattr(tree, "repo_path", ""))
    want: list[str] = []
    for fact in facts:
        try:
            compiled = compile_fact(fact)
        except FactError:
            continue
        if fact.lang == "path" or (compiled.signature, json.dumps(fact.files), repo_path, tree.sha) in _results:
            continue
        pairs = [(p, b) for p in files_for(compiled, tree) if (b := tree.blob_sha(p)) is not None]
        _from_disk(compiled, pairs, limits)
        want += [b for p, b in pairs if (compiled.signature, p, b) not in _rows_cache]
    return read_blobs(repo_path, want) if want and repo_path else {}


# Work handed to forked parse processes: set just before the fork, read by the children.
# One unit is one file with every fact that must parse it, so each file is parsed once.
_work: list[tuple[str, str, list[_Compiled]]] = []
_work_data: dict[str, bytes] = {}
_work_limits: Limits = _DEFAULT_LIMITS
PARALLEL_MIN_BYTES = 1_000_000  # below this a pool costs more than it saves


def _parse_one(i: int) -> tuple[int, list[tuple[list[tuple[str, dict, str, int, str]], str | None]]]:
    path, blob, compiled = _work[i]
    out = []
    for c in compiled:
        rows, problem = _guarded(c, path, _work_data.get(blob, b""), blob, _work_limits)
        out.append(([(r.key, r.values, r.path, r.line, r.written) for r in rows], problem))
    return i, out


def parse_parallel(facts: list[Fact], tree: Any, data: dict[str, bytes], limits: Limits = _DEFAULT_LIMITS,
                   workers: int | None = None) -> int:
    """Parse the uncached files of tree-sitter facts in forked processes; the rows land in the caches,
    so ``extract`` then finds them. Returns the number of files parsed this way (0: it stayed serial).
    Regex facts run in this process."""
    import multiprocessing
    import os

    global _work, _work_data, _work_limits
    n = workers or min(8, os.cpu_count() or 1)
    if n < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return 0
    if threading.active_count() > 1:
        # A fork copies locks other threads may hold (the parse cache's, logging's): in a threaded
        # server the children could hang, so it stays serial there; its memory caches stay warm anyway.
        return 0
    units: dict[tuple[str, str], list[_Compiled]] = {}
    size = 0
    for fact in facts:
        try:
            c = compile_fact(fact)
        except FactError:
            continue
        if c.query is None or fact.id in limits.nodes:
            continue
        for path in files_for(c, tree):
            blob = tree.blob_sha(path)
            raw = data.get(blob) if blob else None
            if blob is None or raw is None or (c.signature, path, blob) in _rows_cache or not c.may_match(raw):
                continue
            if (path, blob) not in units:
                size += len(raw)
            units.setdefault((path, blob), []).append(c)
    if size < PARALLEL_MIN_BYTES or len(units) < 2 * n:
        return 0
    work = sorted(((p, b, cs) for (p, b), cs in units.items()), key=lambda w: -len(data[w[1]]))  # big first
    _work, _work_data, _work_limits = work, data, limits
    try:
        with multiprocessing.get_context("fork").Pool(n) as pool:
            for i, results in pool.imap_unordered(_parse_one, range(len(work)), chunksize=2):
                path, blob, compiled = work[i]
                for c, (raw_rows, problem) in zip(compiled, results):
                    rows = [Row(c.fact.id, k, v, p, line, written=w) for k, v, p, line, w in raw_rows]
                    with _rows_lock:
                        _rows_cache[(c.signature, path, blob)] = (rows, problem)
                    if limits.cache is not None:
                        stored = problem.replace(path, "\0", 1) if problem else None
                        limits.cache.store(c.signature, blob, c.fact.id, rows, stored)
    finally:
        _work, _work_data = [], {}
    if limits.cache is not None:
        limits.cache.flush()
    return len(work)


def extract(fact: Fact, tree: Any, prefetched: dict[str, bytes] | None = None,
            limits: Limits = _DEFAULT_LIMITS) -> FactResult:
    """Rows of ``fact`` over a ``checks.workspace.Tree``; raises FactError if the fact cannot run."""
    compiled = compile_fact(fact)
    repo_path = str(getattr(tree, "repo_path", ""))
    whole = (compiled.signature, json.dumps(fact.files), repo_path, tree.sha)
    hit = _results.get(whole)
    if hit is not None:
        return hit
    result = FactResult(files=files_for(compiled, tree))
    if fact.lang == "path":  # rows are the files themselves: nothing to read
        made = (_finish(compiled, Row(fact.id, p, {}, p, 1)) for p in result.files)
        result.rows = [r for r in made if r is not None]
        result.inputs = _digest(result.files)
        _results[whole] = result
        return result
    blobs = [(path, tree.blob_sha(path)) for path in result.files]
    _from_disk(compiled, [(p, b) for p, b in blobs if b is not None], limits)
    data = prefetched or {}
    missing = [b for p, b in blobs if b is not None and b not in data and (compiled.signature, p, b) not in _rows_cache]
    if missing and repo_path:
        data = {**data, **read_blobs(repo_path, missing)}
    inputs = []
    stored = False
    for path, blob in blobs:
        if blob is None:
            continue
        inputs.append((path, blob))
        cache_key = (compiled.signature, path, blob)
        got = _rows_cache.get(cache_key)
        if got is None:
            raw = data.get(blob)
            if raw is None:
                try:
                    raw = tree.read(path) or b""
                except Exception:  # a partial clone or a pruned object: that file's rows are missing, not the fact's
                    result.problems.append(f"{path}:1: blob {blob[:12]} is not in the repository; its rows are missing")
                    continue
            got = _guarded(compiled, path, raw, blob, limits)
            with _rows_lock:
                if len(_rows_cache) >= _ROWS_MAX:
                    _rows_cache.clear()
                _rows_cache[cache_key] = got
            if limits.cache is not None and fact.id not in limits.nodes:
                problem = got[1].replace(path, "\0", 1) if got[1] else None
                limits.cache.store(compiled.signature, blob, fact.id, got[0], problem)
                stored = True
        rows, problem = got
        result.rows.extend(rows)
        if problem:
            result.problems.append(problem)
    if stored:
        limits.cache.flush()
    result.inputs = _digest(f"{p}\t{b}" for p, b in inputs)
    if len(_results) > 256:
        _results.clear()
    _results[whole] = result
    return result


def _guarded(compiled: _Compiled, path: str, data: bytes, blob: str | None,
             limits: Limits) -> tuple[list[Row], str | None]:
    """Binary content gives no rows; a file over the size cap is skipped, and the skip reported."""
    if b"\0" in data[:8192]:
        return [], None
    if len(data) > limits.max_bytes:
        return [], (f"{path}:1: skipped: {len(data):,} bytes is over the size cap "
                    f"([settings] max_file_bytes = {limits.max_bytes:,}); its rows are missing")
    return extract_blob(compiled, path, data, blob)


def input_digest(fact: Fact, tree: Any) -> str:
    """What ``extract(fact, tree).inputs`` will be, without reading a blob: the fact's rows are a
    function of it, so a cache keyed by it can answer before any file is read."""
    compiled = compile_fact(fact)
    files = files_for(compiled, tree)
    if fact.lang == "path":
        return _digest(files)
    return _digest(f"{p}\t{b}" for p in files if (b := tree.blob_sha(p)) is not None)


def read_blobs(repo_path: str, shas: list[str]) -> dict[str, bytes]:
    """Many blobs in one ``git cat-file --batch`` process instead of a round trip per blob."""
    import subprocess

    unique = list(dict.fromkeys(shas))
    proc = subprocess.run(
        ["git", "cat-file", "--batch"], cwd=repo_path, input=("\n".join(unique) + "\n").encode(),
        capture_output=True, check=False,
    )
    out: dict[str, bytes] = {}
    if proc.returncode != 0:
        return out  # the caller falls back to reading one blob at a time
    buf, pos = proc.stdout, 0
    while pos < len(buf):
        nl = buf.index(b"\n", pos)
        header = buf[pos:nl].split()
        pos = nl + 1
        if len(header) < 3 or header[1] == b"missing":
            continue
        size = int(header[2])
        out[header[0].decode()] = buf[pos : pos + size]
        pos += size + 1
    return out


def extract_text(fact: Fact, path: str, data: bytes) -> tuple[list[Row], str | None]:
    """Rows from one file's bytes (no repo needed): for tests and ``drift-audit facts``."""
    return extract_blob(compile_fact(fact), path, data, None)


def extract_blob(compiled: _Compiled, path: str, data: bytes, blob: str | None) -> tuple[list[Row], str | None]:
    if compiled.query is not None:
        return _query_rows(compiled, path, data, blob)
    return _regex_rows(compiled, path, data), None


_C_LIKE = (".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cu", ".cuh", ".js", ".ts", ".java", ".rs", ".go")
_TOKENS_C = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.S)
_TOKENS_PY = re.compile(r'#[^\n]*|[rbuRBUfF]{0,2}(?:"""(?:[^\\]|\\.)*?"""|\'\'\'(?:[^\\]|\\.)*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\')', re.S)


def _tokens(path: str) -> re.Pattern:
    return _TOKENS_PY if path.endswith((".py", ".pyi")) else _TOKENS_C


def code_only(text: str, path: str) -> str:
    """``text`` with comments blanked (same offsets and lines); strings are kept, so a ``//`` inside one stays."""
    def blank(m: re.Match) -> str:
        t = m.group(0)
        return re.sub(r"[^\n]", " ", t) if t[:1] in ("#", "/") else t
    return _tokens(path).sub(blank, text)


_LITERAL = re.compile(r'^[rbuRBUfF]{0,2}("""|\'\'\'|"|\')(.*)\1$', re.S)


def string_literals(text: str, path: str) -> list[tuple[int, str]]:
    """(offset, content) of each string literal, adjacent literals joined (``"input_tma_" "desc"``)."""
    out: list[tuple[int, str]] = []
    last_end = -1
    for m in _tokens(path).finditer(text):
        t = m.group(0)
        lit = _LITERAL.match(t)
        if lit is None:
            continue
        if out and text[last_end:m.start()].strip() == "":
            out[-1] = (out[-1][0], out[-1][1] + lit.group(2))
        else:
            out.append((m.start(), lit.group(2)))
        last_end = m.end()
    return out


def _regex_rows(c: _Compiled, path: str, data: bytes) -> list[Row]:
    text = data.decode("utf-8", "replace")
    read = c.fact.options.get("read", "all")
    if read == "code":
        text = code_only(text, path)
    elif read == "strings":
        rows: list[Row] = []
        for offset, content in string_literals(text, path):
            line = text.count("\n", 0, offset) + 1
            for got in _regex_rows_in(c, path, content):
                got.line = line + got.line - 1
                rows.append(got)
        return rows
    return _regex_rows_in(c, path, text)


def _regex_rows_in(c: _Compiled, path: str, text: str) -> list[Row]:
    key_name = key_capture(c.fact)
    rows: list[Row] = []
    assert c.regex is not None
    at, line = 0, 1  # matches come in order: count newlines from the previous one, not from the start
    for i, m in enumerate(c.regex.finditer(text)):
        key = str(i) if key_name == "@index" else m.group(key_name)
        if key is None:
            continue
        values = {k: v for k, v in m.groupdict().items() if k != key_name and v is not None and not k.startswith("_")}
        start = m.start(key_name) if key_name != "@index" else m.start()
        if start >= at:
            line += text.count("\n", at, start)
        else:  # a key group before the previous match's key (overlapping groups): count afresh
            line = text.count("\n", 0, start) + 1
        at = start
        row = _finish(c, Row(c.fact.id, key, values, path, line))
        if row is not None:
            rows.append(row)
    return rows


def _query_rows(c: _Compiled, path: str, data: bytes, blob: str | None) -> tuple[list[Row], str | None]:
    if not c.may_match(data):
        return [], None  # no parse for a file that cannot hold a row
    fact = c.fact
    if fact.lang in ("c", "cpp", "cuda") and fact.options.get("preprocess", True):
        data = preprocess(data, fact.lang)  # same length and lines: rows keep their places
        tree = syntax.parse(fact.lang, data, key=f"{blob}:pp" if blob else None)
    else:
        tree = syntax.parse(fact.lang, data, key=blob)
    root = tree.root_node
    problem = None
    if root.has_error:
        err = _first_error(root)
        line = err.start_point[0] + 1 if err is not None else 1
        # Only where a row could sit near the error: the code around it holds a literal every row needs.
        if c.may_match(_around(data, err)):
            problem = f"{path}:{line}: {fact.lang} syntax error; rows near it may be missing"
    opts = fact.options
    key_name = key_capture(fact)
    count_name = opts.get("count")
    follow = bool(opts.get("follow_aliases"))
    bindings: dict[int, dict[str, list[tuple[int, str]]]] = {}  # function id → name → (where, bound to)
    scopes = _scopes(root, opts["scope"]) if opts.get("scope") else None
    rows: list[Row] = []
    counted: dict[int, list[ts.Node]] = {}  # function node id → counted nodes
    assert c.query is not None
    cursor = ts.QueryCursor(c.query)
    for _, caps in cursor.matches(root):
        if count_name and count_name in caps:
            for node in caps[count_name]:
                if scopes is None or _inside(node, scopes):
                    fn = _enclosing_function(node)
                    counted.setdefault(fn.id if fn else -1, []).append(node)
        anchor_nodes = caps.get(key_name) if key_name not in ("@function", "@index") else next(
            (ns for n, ns in caps.items() if not n.startswith("_") and n != count_name), None
        )
        if not anchor_nodes:
            continue
        anchor = anchor_nodes[0]
        if scopes is not None and not _inside(anchor, scopes):
            continue
        if key_name == "@function":
            fn = _enclosing_function(anchor)
            if fn is None:
                continue
            key = _function_name(fn)
        elif key_name == "@index":
            key = str(len(rows))
        else:
            key = syntax.text(anchor)
            if follow:
                key = _local_alias(anchor, key, bindings, fact.lang)
        values: dict[str, Any] = {}
        nodes: dict[str, ts.Node | None] = {"key": anchor}
        lens = set(opts.get("len", []))
        for name, ns in caps.items():
            if name.startswith("_") or name == count_name or name == key_name or not ns:
                continue
            node = ns[0]
            nodes[name] = node
            values[name] = _length(node) if name in lens else syntax.text(node)
        if key_name in lens:
            values[key_name] = _length(anchor)
        row = Row(fact.id, key, values, path, anchor.start_point[0] + 1, nodes)
        if count_name:
            row.nodes["@fn"] = _enclosing_function(anchor)
        rows.append(row)
    if count_name:
        for row in rows:
            fn = row.nodes.pop("@fn", None)
            found = counted.get(fn.id if fn else -1, [])
            lo = sum(1 for n in found if not _conditional(n, fn))
            row.values["count"] = Count(lo, len(found))
    rows = [r for r in (_finish(c, r) for r in rows) if r is not None]
    return _dedupe(rows), problem


_BINDING_QUERIES: dict[str, ts.Query] = {}
_BINDING = {
    "python": "(assignment left: (identifier) @name right: [(attribute) (identifier)] @target)",
    "cpp": "(init_declarator declarator: (identifier) @name value: [(qualified_identifier) (identifier) (field_expression)] @target)",
    "cuda": "(init_declarator declarator: (identifier) @name value: [(qualified_identifier) (identifier) (field_expression)] @target)",
    "c": "(init_declarator declarator: (identifier) @name value: [(identifier) (field_expression)] @target)",
}


def _local_alias(node: ts.Node, key: str, cache: dict[int, dict[str, list[tuple[int, str]]]], lang: str) -> str:
    """``f = mod.op`` (or ``auto f = ns::op;``) earlier in the same function: ``f`` stands for ``mod.op``."""
    fn = _enclosing_function(node)
    if fn is None:
        return key
    table = cache.get(fn.id)
    if table is None:
        query = _BINDING_QUERIES.get(lang)
        if query is None:
            query = _BINDING_QUERIES[lang] = ts.Query(syntax.language(lang), _BINDING[lang])
        table = {}
        for _, caps in ts.QueryCursor(query).matches(fn):
            name, target = syntax.text(caps["name"][0]), syntax.text(caps["target"][0])
            if name != target:
                table.setdefault(name, []).append((caps["name"][0].start_byte, target))
        cache[fn.id] = table
    bound = [target for at, target in sorted(table.get(key, [])) if at < node.start_byte]
    return bound[-1] if bound else key  # the latest binding before the use


def _dedupe(rows: list[Row]) -> list[Row]:
    """Overlapping query patterns can yield one row twice from one node; keep the first."""
    seen: set[tuple] = set()
    out = []
    for r in rows:
        anchor = r.nodes.get("key")
        at = anchor.start_byte if anchor is not None else r.line
        k = (r.key, at, tuple(r.values.items()))
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def _finish(c: _Compiled, row: Row) -> Row | None:
    """Apply unquote, sub, case and ignore to a raw row."""
    fin = c.finish
    if fin.identity:
        return row

    def clean(name: str, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        value = value.strip()
        if fin.unquote and value[-1:] in _QUOTES:  # every quoted form ends in a quote
            value = _unquote(value)
        for f, pattern, repl in fin.subs:
            if f == name:
                value = pattern.sub(repl, value)
        for f, how in fin.cases:
            if f == name:
                value = value.upper() if how == "upper" else value.lower()
        return value

    raw = row.key.strip() if isinstance(row.key, str) else row.key
    row.key = clean("key", row.key)
    if isinstance(raw, str) and raw != row.key:
        plain = _unquote(raw) if fin.unquote and raw[-1:] in _QUOTES else raw
        if plain != row.key:  # only what a reviewer would not recognise: case or sub rewrote it
            row.written = plain
    if row.values:
        row.values = {k: clean(k, v) for k, v in row.values.items()}
    for new, src, counted in fin.matches:
        text = row.key if src in ("key", fin.anchor) else row.values.get(src)
        if isinstance(text, str):
            row.values[new] = len(counted.findall(text))
    if fin.template is not None:
        where = {"module": module_of(row.path), "path": row.path, "stem": row.path.rsplit("/", 1)[-1].split(".")[0],
                 "dir": row.path.rsplit("/", 1)[0] if "/" in row.path else ""}
        fields = {**{k: str(v) for k, v in row.values.items()}, fin.anchor: row.key, **where}
        try:
            row.key = fin.template.format(**fields)
        except (KeyError, IndexError, ValueError):
            return None  # a field of the template is absent from this match
    if fin.normalize:
        row.key = normalize_key(row.key, fin.normalize)
    for alias, target in fin.aliases:
        if row.key == alias:
            row.key = target
            break
    for glob in fin.ignore:
        if fnmatch.fnmatchcase(row.key, glob):
            return None
    return row


_QUOTES = ('"', "'")
_QUOTED = re.compile(r'^(?:[rbuRBUfF]{0,2})("""|\'\'\'|"|\')(.*)\1$', re.S)


def _unquote(s: str) -> str:
    m = _QUOTED.match(s)
    return m.group(2) if m else s


def _length(node: ts.Node) -> int:
    return sum(1 for ch in node.named_children if ch.type not in ("comment",))


def _around(data: bytes, err: ts.Node | None, lines: int = 20) -> bytes:
    """The error's text and ``lines`` lines either side: where rows may have been lost."""
    if err is None:
        return data
    start, end = err.start_byte, err.end_byte
    for _ in range(lines):
        start = max(0, data.rfind(b"\n", 0, max(0, start - 1)))
        nxt = data.find(b"\n", end + 1)
        end = len(data) if nxt == -1 else nxt
    return data[start:end]


def _first_error(node: ts.Node) -> ts.Node | None:
    if node.type == "ERROR" or node.is_missing:
        return node
    for ch in node.children:
        if ch.has_error or ch.is_missing or ch.type == "ERROR":
            found = _first_error(ch)
            if found is not None:
                return found
    return None


# --------------------------------------------------------------------------- scopes

_FUNCTION_TYPES = {"function_definition", "lambda_expression"}
_ENUM_TYPES = {"enum_specifier", "class_definition"}  # Python enums are classes
_CLASS_TYPES = {"class_definition", "class_specifier", "struct_specifier"}


def _enclosing_function(node: ts.Node) -> ts.Node | None:
    n = node.parent
    while n is not None and n.type != "function_definition":
        n = n.parent
    return n


_DECLARATOR_NAMES = ("identifier", "qualified_identifier", "field_identifier", "destructor_name", "operator_name")


def _function_name(fn: ts.Node) -> str:
    name = fn.child_by_field_name("name")  # python
    if name is not None:
        return syntax.text(name)
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type not in _DECLARATOR_NAMES:
        decl = decl.child_by_field_name("declarator")
    return syntax.text(decl) if decl is not None else ""


def _named(node: ts.Node) -> str:
    if node.type == "function_definition":
        return _function_name(node)
    name = node.child_by_field_name("name")
    return syntax.text(name) if name is not None else ""


def _scopes(root: ts.Node, scope: str) -> list[ts.Node]:
    kind, _, pattern = scope.partition(":")
    types = {"function": {"function_definition"}, "enum": _ENUM_TYPES, "class": _CLASS_TYPES, "if-chain": {"if_statement"}}[kind]
    found: list[ts.Node] = []
    stack = [root]
    while stack:
        n = stack.pop()
        if n.type in types:
            if kind == "if-chain":
                parent = n.parent
                is_else_if = parent is not None and parent.type == "else_clause"
                cond = n.child_by_field_name("condition")
                if not is_else_if and cond is not None and re.search(pattern, syntax.text(cond)):
                    found.append(n)
                    continue
            else:
                name = _named(n)
                if name and (fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name.split("::")[-1], pattern)):
                    found.append(n)
                    continue
        stack.extend(n.children)
    return found


def _inside(node: ts.Node, scopes: list[ts.Node]) -> bool:
    return any(s.start_byte <= node.start_byte and node.end_byte <= s.end_byte for s in scopes)


# Parents whose children run only on some paths, with the fields that still always run.
_BRANCHING = {
    "if_statement": {"condition"},
    "elif_clause": set(),
    "else_clause": set(),
    "for_statement": {"right", "initializer", "condition"},  # python: right; C++: init and first test
    "for_range_loop": {"right"},
    "while_statement": {"condition"},
    "conditional_expression": set(),
    "switch_statement": {"condition"},
    "case_statement": set(),
    "try_statement": {"body"},
    "except_clause": set(),
    "match_statement": {"subject"},
    "case_clause": set(),
    "boolean_operator": {"left"},
    "list_comprehension": set(),
    "generator_expression": set(),
    "lambda": set(),
}


def _conditional(node: ts.Node, fn: ts.Node | None) -> bool:
    """Whether ``node`` sits under a branch, loop or short-circuit between it and ``fn``."""
    child, parent = node, node.parent
    while parent is not None and (fn is None or parent.id != fn.id):
        always = _BRANCHING.get(parent.type)
        if parent.type == "binary_expression":
            op = parent.child_by_field_name("operator")
            always = {"left"} if op is not None and op.type in ("&&", "||", "and", "or") else None
        if always is not None:
            on_always_field = any(
                (f := parent.child_by_field_name(name)) is not None and f.id == child.id for name in always
            )
            if not on_always_field and not (parent.type == "try_statement" and child.type == "finally_clause"):
                return True
        child, parent = parent, parent.parent
    return False
