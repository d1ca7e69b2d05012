"""Change → TestPlan: the smallest set of suites that covers a change, each with its reasons.

A declared ``[[suite]]`` is selected by any of: a changed path matching its
``paths`` globs, a touched pillar in its ``pillars``, a changed hunk whose
enclosing symbol matches its ``symbols`` (``path-glob::name-pattern``), or a
new finding located in its paths. On top of that, every pytest file under
``settings.test_paths`` whose static import closure reaches a changed module is
selected: through the declared suite whose command already names it, else as a
suite of its own, ``pytest:<path>`` on the ``cpu`` runner.

Unselected declared suites are listed as not affected so a reviewer can still
ask for them by id.
"""

from __future__ import annotations

import ast
import fnmatch
import posixpath
import re
import shlex
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache

import pathspec

from checks.config import CONFIG_PATH, Config, Suite
from checks.expr import PARSE_ERRORS
from checks.model import AuditOptions, ChangeSet, Findings, PillarMap, PlannedSuite, TestPlan
from runner.impact import (
    ALL,
    PURE_DECORATORS,
    Binding,
    Changed,
    Impact,
    ModuleInfo,
    OverBudget,
    _decorator_name,
    _spelled,
    importers,
    info_of,
    static_bindings,
    without_wrappers,
)
from runner.imports import PROJECT_FILES, ImportGraph, gpu_need
from runner.outline import Outline, touches_kept_definition
from runner.runnable import extension_names

PYTEST_PREFIX = "pytest:"
DEFAULT_GPU_RUNNER = "sm90"


class SelectionError(ValueError):
    """A request the plan cannot honour, e.g. an unknown suite id."""


@lru_cache(maxsize=1024)
def spec(patterns: tuple[str, ...]) -> pathspec.PathSpec:
    try:
        return pathspec.PathSpec.from_lines("gitignore", patterns)
    except (KeyError, LookupError):  # pathspec < 0.12 names it gitwildmatch
        return pathspec.PathSpec.from_lines("gitwildmatch", patterns)


def first_match(patterns: list[str], path: str) -> str | None:
    for pat in patterns:
        if spec((pat,)).match_file(path):
            return pat
    return None


class _Picks:
    """Ordered suite id → reasons, de-duplicated."""

    def __init__(self) -> None:
        self.reasons: OrderedDict[str, list[str]] = OrderedDict()

    def add(self, suite_id: str, reason: str) -> None:
        bucket = self.reasons.setdefault(suite_id, [])
        if reason not in bucket:
            bucket.append(reason)


def changed_paths(changes: ChangeSet) -> list[str]:
    """Head paths plus the old side of renames: moving a file out of a glob still touches it."""
    out: list[str] = []
    for f in changes.files:
        for p in (f.path, f.old_path):
            if p and p not in out:
                out.append(p)
    return out


def _declared_reasons(suite: Suite, paths: list[str], pillars: PillarMap, findings: Findings, picks: _Picks) -> None:
    for path in paths:
        pat = first_match(suite.paths, path) if suite.paths else None
        if pat:
            picks.add(suite.id, f"path '{pat}' matched {path}")
    touched = {p.id for p in pillars.pillars}
    for pid in suite.pillars:
        if pid in touched:
            picks.add(suite.id, f"pillar '{pid}' touched")
    for sym_pat in suite.symbols:
        path_glob, _, name_pat = sym_pat.partition("::")
        for h in pillars.hunks:
            if not h.symbol:
                continue
            name = h.symbol.split("::", 1)[1] if "::" in h.symbol else h.symbol
            if spec((path_glob,)).match_file(h.path) and fnmatch.fnmatchcase(name, name_pat):
                picks.add(suite.id, f"symbol '{sym_pat}' matched {h.path}::{name}")
    if suite.paths:
        for f in findings.findings:
            if f.status != "new":
                continue
            for loc in f.locations:
                pat = first_match(suite.paths, loc.path)
                if pat:
                    picks.add(suite.id, f"new finding '{f.rule}' at {loc.path}:{loc.line}")
                    break


def _command_paths(command: str) -> list[str]:
    """Path-like arguments of a command, to tell which test files a declared suite already runs."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        tokens = command.split()
    out = []
    for tok in tokens:
        if tok.startswith("-") or "=" in tok:
            continue
        tok = tok.split("::", 1)[0].rstrip("/")
        if tok.startswith("./"):
            tok = tok[2:]
        if "/" in tok or tok.endswith(".py") or tok == "tests":
            out.append(tok)
    return out


def _covers(command_paths: list[str], test_file: str) -> bool:
    return any(test_file == p or test_file.startswith(p + "/") for p in command_paths)


def _planned(suite: Suite, runner: str, reasons: list[str]) -> PlannedSuite:
    return PlannedSuite(
        id=suite.id,
        kind=suite.kind,  # type: ignore[arg-type]
        command=suite.command,
        runner=runner,
        timeout=suite.timeout,
        requires=suite.requires,
        reasons=list(reasons),
        golden=suite.golden,
    )


def pytest_suite(test_file: str, reasons: list[str], timeout: float = 900.0, runner: str = "cpu") -> PlannedSuite:
    return PlannedSuite(
        id=f"{PYTEST_PREFIX}{test_file}",
        kind="unit",
        command=f"python -m pytest -q {shlex.quote(test_file)}",
        runner=runner,
        timeout=timeout,
        reasons=list(reasons),
    )


def gpu_runner(config: Config) -> str:
    """The label implicit GPU test files run on: ``[settings] gpu_runner``, else the repo's first GPU label."""
    configured = getattr(config.settings, "gpu_runner", None)
    if isinstance(configured, str) and configured:
        return configured
    labels = [lbl for s in config.suites for lbl in s.runners if lbl != "cpu"]
    return labels[0] if labels else DEFAULT_GPU_RUNNER


# An arch in a test file's name or marks: test_fmha_sm100.py, test_gemm_sm_90a.py, @pytest.mark.sm100
_NAMED_ARCH = re.compile(r"(?<![a-z0-9])sm_?(\d{2,3})[a-z]?(?![0-9])", re.I)
_MARKED_ARCH = re.compile(rb"pytest\.mark\.sm_?(\d{2,3})[a-z]?\b")
KNOWN_GPU_LABELS = ("sm90", "sm100", "sm120")


def _known_labels(config: Config) -> set[str]:
    known = {lbl for s in config.suites for lbl in s.runners} | set(KNOWN_GPU_LABELS)
    return known | set(getattr(config.settings, "runner_labels", []) or [])


def change_arch(config: Config, changes: ChangeSet) -> tuple[str, str] | None:
    """(label, a file) when every code file the change touches outside the tests names one and the same known
    arch (``flash_fwd_sm100.py``, ``copy_sm100.h``): the changed code only runs on that arch."""
    tests = spec(tuple(config.settings.test_paths)) if config.settings.test_paths else None
    labels: set[str] = set()
    first = ""
    for path in changed_paths(changes):
        if not path.endswith((".py", *KERNEL_SOURCES)) or (tests is not None and tests.match_file(path)):
            continue
        found = {f"sm{m.group(1)}" for m in _NAMED_ARCH.finditer(posixpath.basename(path))}
        if len(found) != 1:
            return None
        labels |= found
        first = first or path
    if len(labels) == 1 and next(iter(labels)) in _known_labels(config):
        return next(iter(labels)), first
    return None


def implicit_label(config: Config, test_file: str, text: bytes | None,
                   arch: tuple[str, str] | None = None) -> tuple[str, str]:
    """(label, how it was chosen) for a test file whose imports need a GPU. An arch its name or marks
    state wins when that label is known (declared by a suite, standard, or in [settings] runner_labels):
    an SM100-only test sent to sm90 would fail there for no fault of the change. Else the arch the changed
    code states (``arch``, from ``change_arch``): on another GPU the test would not run that code."""
    known = _known_labels(config)
    for m in _NAMED_ARCH.finditer(posixpath.basename(test_file)):
        if f"sm{m.group(1)}" in known:
            return f"sm{m.group(1)}", f"its name says sm{m.group(1)}"
    for marked in _MARKED_ARCH.finditer(text or b""):
        label = f"sm{marked.group(1).decode()}"
        if label in known:
            return label, f"it is marked {label}"
    if arch is not None:
        return arch[0], f"the change is only {arch[0]} code: {arch[1]}"
    label = gpu_runner(config)
    configured = getattr(config.settings, "gpu_runner", None)
    chosen = configured or any(lbl != "cpu" for s in config.suites for lbl in s.runners)
    return label, "" if chosen else "guessed: no arch in its name or marks; [settings] gpu_runner sets it"


def select_tests(
    config: Config,
    changes: ChangeSet,
    pillars: PillarMap,
    findings: Findings,
    options: AuditOptions,
    head,
    audit_id: str,
) -> TestPlan:
    """The TestPlan for a change. ``head`` is a checks.workspace.Tree of the head commit."""
    suites = {s.id: s for s in config.suites}
    paths = changed_paths(changes)
    picks = _Picks()
    head_paths = set(head.paths())

    for sid in options.suites:
        if sid in suites:
            picks.add(sid, "requested by id")
        elif sid.startswith(PYTEST_PREFIX) and sid[len(PYTEST_PREFIX) :] in head_paths:
            picks.add(sid, "requested by id")
        else:
            known = ", ".join(sorted(suites)) or "none declared"
            raise SelectionError(
                f"unknown suite '{sid}'; known suites: {known} (or pytest:<test file> for a test file in the head tree)"
            )

    needs: dict[str, str] = {}
    inert: dict[str, str] = {}
    if not options.suites:  # asking for suites by id runs just those
        needs = _automatic(config, changes, paths, pillars, findings, options, head, head_paths, picks, inert)
    planned: list[PlannedSuite] = []
    arch = change_arch(config, changes) if not options.suites else None
    for sid, reasons in picks.reasons.items():
        if sid in suites:
            s = suites[sid]
            for runner in s.runners:
                planned.append(_planned(s, runner, reasons))
        else:
            test_file = sid[len(PYTEST_PREFIX) :]
            need = needs.get(test_file)
            if need is None and sid in options.suites:  # asked for by id: it still runs where its imports say
                need = _need_of(head, head_paths, test_file)
            if need:
                label, how = implicit_label(config, test_file, head.read(test_file), arch)
                on = f"runs on {label}" + (f" ({how})" if how else "")
                planned.append(pytest_suite(test_file, [*reasons, f"{on}: {need}"], runner=label))
            else:
                planned.append(pytest_suite(test_file, reasons))
    if options.runner:
        planned = [p for p in planned if p.runner == options.runner]
    not_affected = [s.id for s in config.suites if s.id not in picks.reasons]
    return TestPlan(audit_id=audit_id, head_sha=changes.head_sha, suites=planned, not_affected=not_affected,
                    inert=[f"{path}: {why}" for path, why in inert.items()])


def _automatic(config: Config, changes: ChangeSet, paths: list[str], pillars: PillarMap, findings: Findings,
               options: AuditOptions, head, head_paths: set[str], picks: _Picks,
               inert_out: dict[str, str]) -> dict[str, str]:
    run_all = []
    if options.all_suites:
        run_all.append("every suite requested (--all)")
    for path in paths:
        pat = first_match(config.settings.run_all, path) if config.settings.run_all else None
        if pat:
            run_all.append(f"run-all pattern '{pat}' matched {path}")
        if path == CONFIG_PATH:
            run_all.append(f"{CONFIG_PATH} changed")
    for reason in dict.fromkeys(run_all):
        for s in config.suites:
            picks.add(s.id, reason)

    by_name = getattr(config.settings, "symbol_selection", True)
    reach = _test_reach(config, changes, head, head_paths)
    changed: dict[str, Changed] = (
        changed_names(changes, head, relevant=reach.users.__contains__ if reach else lambda _p: False,
                      graph=reach.graph if reach else None)
        if by_name else {p: ALL for p in paths if p.endswith(".py")}
    )
    inert = inert_files(changes, head, head_paths, changed) if by_name else {}
    inert_out.update(inert)
    if inert:  # a change no code can observe selects no suite by path, pillar, symbol or import
        changed = {p: names for p, names in changed.items() if p not in inert}
        paths = [p for p in paths if p not in inert]
        pillars = PillarMap(pillars=[h for h in pillars.pillars if any(f not in inert for f in h.files)],
                            hunks=[h for h in pillars.hunks if h.path not in inert])
    for s in config.suites:
        _declared_reasons(s, paths, pillars, findings, picks)

    members = member_changes(changes, head, changed) if by_name and reach is not None else {}
    needs = _import_graph(config, reach, head, head_paths, picks, changed, members) if reach is not None else {}
    if config.settings.import_graph and config.settings.test_paths:
        for test_file, need in _kernel_sources(config, changes, head, head_paths, picks).items():
            needs.setdefault(test_file, need)
    return needs


# modules read to follow compiled code by name; past it the package-wide answer (a superset) is cheaper
KERNEL_REACH_BUDGET = 300
# with no narrower path to changed compiled code, a package imported by more test files than this (a compiler, a
# runtime every test loads) is stood for by the PR's own tests; a smaller one runs all its importers
OWN_TESTS_ABOVE = 20
CUDA_SOURCES = (".cu", ".cuh")
KERNEL_SOURCES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".inl")


def _kernel_sources(config: Config, changes: ChangeSet, head, head_paths: set[str],
                    picks: _Picks) -> dict[str, str]:
    """Test files that import a package whose compiled (or JIT-compiled) sources changed.

    No import reaches a ``.cu`` or ``.hpp`` file, yet the tests that import the package run that code: a
    source under ``P/`` belongs to package ``P``; one outside every package (``csrc/``) to the packages
    the build files of its project name, or to its only package (``_source_owners``). Returns {test file: GPU
    need}.
    """
    sources = [f.path for f in changes.files if f.path.endswith(KERNEL_SOURCES)]
    if not sources:
        return {}
    owners = _source_owners(head, head_paths, sources)
    if not owners:
        return {}
    tests = spec(tuple(config.settings.test_paths))
    test_files = sorted(p for p in head_paths if p.endswith(".py") and tests.match_file(p))
    graph = ImportGraph(paths=head_paths, read=head.read, blob_sha=getattr(head, "blob_sha", None))
    users = importers(graph, test_files)
    covering = [(s, _command_paths(s.command)) for s in config.suites]
    extensions = _declared_extensions(head, head_paths)
    needs: dict[str, str] = {}
    blob_sha = getattr(head, "blob_sha", None)
    changed_tests = {f.path for f in changes.files} & set(test_files)

    info = unwrapping(graph, lambda p: info_of(p, blob_sha(p) if blob_sha else None, head.read))
    for pkg_dir, srcs in owners.items():
        pkg = pkg_dir.rsplit("/", 1)[-1]
        shown = ", ".join(srcs[:3]) + (f" +{len(srcs) - 3} more" if len(srcs) > 3 else "")
        reason = f"kernel source of {pkg} changed: {shown}"
        reached = _reaching(users, f"{pkg_dir}/", set(test_files))
        project = pkg_dir.rsplit("/", 1)[0] + "/" if "/" in pkg_dir else ""
        bound = _python_bindings(head, head_paths, project, changes, srcs)
        if bound is not None and not bound:
            continue  # only comments of the compiled sources changed
        if bound:
            reason += f" (bound for Python as {', '.join(sorted(bound)[:4])}{' …' if len(bound) > 4 else ''})"
        own_extensions = extensions if not project else _declared_extensions(head, head_paths, project)
        seeds = _compiled_code_users(graph, info, users, reached, pkg, srcs, own_extensions, bound)
        seeds = _same_part(seeds, srcs, pkg)
        runs: dict[str, str] = {}
        if seeds:  # the compiled code runs only where the modules that load it (or name the source) are used
            impact = Impact(graph, info, seeds, budget=KERNEL_REACH_BUDGET)
            try:
                impact.run(reached, users)
            except OverBudget:  # used all over (a compiler's runtime): every test importing the package counts
                seeds = {}
            else:
                for test_file in reached:
                    chain = impact.chain(test_file)
                    if chain is not None:
                        runs[test_file] = chain[-1]
                reached = sorted(runs)
        own = [t for t in reached if t in changed_tests]
        if not seeds and own and len(reached) > OWN_TESTS_ABOVE:
            # no narrower path to the compiled code: the tests the PR brings are the ones for its change
            others = len(reached) - len(own)
            reason += f" (the PR's own tests; {others} other test file{'s' if others != 1 else ''} import {pkg})"
            reached = own
        for test_file in reached:
            why = reason if not seeds else f"{reason}, run through {runs[test_file]}"
            owned = [s for s, cmd_paths in covering if _covers(cmd_paths, test_file)]
            for suite in owned:
                picks.add(suite.id, why)
            if not owned:
                picks.add(f"{PYTEST_PREFIX}{test_file}", why)
                need = gpu_need(graph, test_file, extensions) or (
                    f"it runs {pkg}'s compiled code" if any(src.endswith(CUDA_SOURCES) for src in srcs) else None)
                if need:  # C++ alone (a CPU kernel, AMX / AVX) needs no GPU unless the test itself does
                    needs[test_file] = need
    return needs


def _source_owners(head, head_paths: set[str], sources: list[str]) -> dict[str, list[str]]:
    """{package directory: the changed compiled sources it owns}.

    A source under a package's directory belongs to it. Else it belongs to the project it lies in: the tree
    itself, or a sub-project (a directory with its own setup.py or pyproject.toml, holding its own packages:
    ``sub/csrc/x.cu`` with ``sub/setup.py`` and ``sub/sub_pkg/__init__.py``), and there to the packages its
    build files name, or to its only package.
    """
    projects: dict[str, list[str]] = {}  # project prefix ("" or "sub/") → its package directories
    for p in head_paths:
        if not p.endswith("/__init__.py"):
            continue
        parts = p.split("/")
        if parts[-2] in _NATIVE_SKIP_DIRS:
            continue  # tests/__init__.py makes no package the compiled code belongs to
        if len(parts) == 2:
            projects.setdefault("", []).append(parts[0])
        elif len(parts) == 3 and f"{parts[0]}/__init__.py" not in head_paths \
                and any(f"{parts[0]}/{f}" in head_paths for f in PROJECT_FILES):
            projects.setdefault(f"{parts[0]}/", []).append(f"{parts[0]}/{parts[1]}")
    if not projects:
        return {}
    outside: dict[str, list[str]] = {}
    for prefix, dirs in projects.items():
        build_text = b"\n".join(head.read(prefix + p) or b"" for p in BUILD_FILES if prefix + p in head_paths)
        names = sorted(dirs)
        built = [d for d in names if re.search(rb"\b%s\b" % re.escape(d.rsplit("/", 1)[-1].encode()), build_text)]
        outside[prefix] = built or (names if len(names) == 1 else [])
    package_dirs = sorted((d for dirs in projects.values() for d in dirs), key=len, reverse=True)
    owners: dict[str, list[str]] = {}
    for src in sources:
        inside = next((d for d in package_dirs if src.startswith(d + "/")), None)
        if inside is not None:
            owners.setdefault(inside, []).append(src)
            continue
        within = [p for p in outside if src.startswith(p)]
        for d in outside[max(within, key=len)] if within else []:
            owners.setdefault(d, []).append(src)
    return owners


# the C/C++ a Python test can reach: not the project's own C++ tests, benchmarks or vendored trees
_NATIVE_SKIP_DIRS = {"test", "tests", "benchmark", "benchmarks", "example", "examples", "docs", "third_party",
                     "3rdparty", "thirdparty", "external", "extern", "vendor", "submodules"}
_NATIVE_HEADERS = (".h", ".hpp", ".hh", ".cuh", ".inl")
NATIVE_FILES_BUDGET = 4000
NATIVE_BYTES_BUDGET = 64 << 20
NATIVE_NAMES_BUDGET = 400
# names too common to follow by spelling: a change to one of them is followed package-wide, as before
_NATIVE_COMMON = {"main", "run", "forward", "backward", "operator", "init", "apply", "launch", "execute", "call",
                  "get", "set", "size", "data", "create", "update", "reset", "compute", "process", "invoke", "impl",
                  "kernel", "wrapper", "dispatch", "check", "print", "load", "save", "begin", "end", "value"}
# ``m.def("name", fn)``, ``.def_static("name", …)``, ``m.impl("name", fn)``, ``m.def("name(Tensor x) -> …")``
_BINDING = re.compile(rb"\.(?:def|def_static|def_readwrite|def_property|impl)\s*\(\s*\"([A-Za-z_]\w*)")


def _native_functions(path: str, data: bytes, blob: str | None) -> list[tuple[int, int, str]]:
    """(first line, last line, unqualified name) of each function defined in a C/C++/CUDA file."""
    import tree_sitter as ts

    from checks import syntax
    from checks.pillars import _declarator_name

    lang = syntax.lang_for_path(path) or "cpp"
    if lang == "c":
        lang = "cpp"  # a .h is parsed as C++: headers of C++ trees are the common case
    tree = syntax.parse(lang, data, key=blob)
    out = []
    for node in ts.QueryCursor(_native_query(lang, "(function_definition) @d")).captures(tree.root_node).get("d", []):
        name = _declarator_name(node.child_by_field_name("declarator"))
        if name:
            name = name.split("<", 1)[0].rsplit("::", 1)[-1].strip()
            out.append((node.start_point[0] + 1, node.end_point[0] + 1, name))
    return out


@cache
def _native_query(lang: str, text: str):
    """A compiled query (7-11 ms to compile, and a review may read thousands of native files)."""
    import tree_sitter as ts

    from checks import syntax

    return ts.Query(syntax.language(lang), text)


def _native_declarations(path: str, data: bytes, blob: str | None) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each function prototype (``void nvte_x(const T in, …);``) in a header."""
    import tree_sitter as ts

    from checks import syntax
    from checks.pillars import _declarator_name

    lang = "cuda" if path.endswith(".cuh") else "cpp"
    tree = syntax.parse(lang, data, key=blob)
    out = []
    query = _native_query(lang, "(declaration declarator: (function_declarator) @f) @d")
    for match in ts.QueryCursor(query).matches(tree.root_node):
        caps = match[1]
        decl, fn = caps.get("d", [None])[0], caps.get("f", [None])[0]
        name = _declarator_name(fn.child_by_field_name("declarator")) if fn is not None else None
        if decl is not None and name:
            out.append((decl.start_point[0] + 1, decl.end_point[0] + 1, name.rsplit("::", 1)[-1]))
    return out


def _innermost(funcs: list[tuple[int, int, str]], line: int) -> tuple[int, int, str] | None:
    best = None
    for f in funcs:
        if f[0] <= line <= f[1] and (best is None or f[1] - f[0] < best[1] - best[0]):
            best = f
    return best


def _python_bindings(head, head_paths: set[str], prefix: str, changes: ChangeSet,
                     srcs: list[str]) -> frozenset[str] | None:
    """The Python names (``m.def("group_requantize", fn)``) through which the changed compiled code is called.

    The functions around the changed lines (every function of a source file whose change lies outside them: an
    include, a file-level constant) are followed to their callers by name across the project's C/C++ sources
    (``prefix``; its tests, benchmarks and vendored trees aside), up to the pybind11 / torch library binding
    that names them for Python; empty when only comments change. None when that cannot be told: a changed
    header outside its functions (a struct or a macro reaches every includer), a name too common to follow,
    a use outside any function that is no binding (a function pointer in a table), a function nobody calls
    or binds (a hand-registered FFI handler), or past a budget.
    """
    seeds: set[str] = set()
    by_path = {fc.path: fc for fc in changes.files}
    considered = outside_any = False
    for src in srcs:
        if set(src[len(prefix):].split("/")[:-1]) & _NATIVE_SKIP_DIRS:
            continue  # a C++ test or benchmark: no Python test runs it
        considered = True
        fc = by_path.get(src)
        data = head.read(src) if fc is not None and fc.status in ("modified", "added") else None
        if fc is None or data is None:
            return None  # a deleted or renamed source: what used it is told by the build files
        funcs = _native_functions(src, data, fc.new_blob)
        lines = [0] if fc.status == "added" else \
            [n for h in fc.hunks for n in h.added] or [h.new_start for h in fc.hunks]  # 0: every function
        outside = False
        declared = _native_declarations(src, data, fc.new_blob) if src.endswith(_NATIVE_HEADERS) else []
        rows = data.split(b"\n")
        for line in lines:
            if 0 < line <= len(rows) and (not rows[line - 1].strip()
                                          or rows[line - 1].lstrip().startswith((b"//", b"*", b"/*"))):
                continue  # a comment or a blank line
            got = _innermost(funcs, line)
            if got is not None:
                seeds.add(got[2])
                continue
            decl = _innermost(declared, line)
            if decl is not None:
                seeds.add(decl[2])  # a prototype: what matters is its definition and callers
            else:
                outside = True
        if outside:
            outside_any = True
            if src.endswith(_NATIVE_HEADERS):
                return None  # a struct, a macro or an inline constant: every includer may change
            seeds |= {f[2] for f in funcs}
    if not seeds and not outside_any and considered:
        return frozenset()  # comments and blank lines alone (a licence header): no code changed
    if not seeds or seeds & _NATIVE_COMMON or any(len(n) < 4 for n in seeds):
        return None
    files = sorted(p for p in head_paths if p.startswith(prefix) and p.endswith(KERNEL_SOURCES)
                   and not (set(p[len(prefix):].split("/")[:-1]) & _NATIVE_SKIP_DIRS))
    if len(files) > NATIVE_FILES_BUDGET:
        return None
    texts: dict[str, bytes] = {}
    total = 0
    for p in files:
        texts[p] = head.read(p) or b""
        total += len(texts[p])
        if total > NATIVE_BYTES_BUDGET:
            return None
    funcs_of: dict[str, list[tuple[int, int, str]]] = {}
    blob_sha = getattr(head, "blob_sha", None)
    bound: set[str] = set()
    seen = set(seeds)
    reached: set[str] = set()  # names with a caller or a binding
    frontier = set(seeds)
    while frontier:
        pattern = _spelled(frozenset(frontier))
        found: set[str] = set()
        for p, data in texts.items():
            if not pattern.search(data):
                continue
            if p not in funcs_of:
                funcs_of[p] = _native_functions(p, data, blob_sha(p) if blob_sha else None)
            funcs = funcs_of[p]
            rows = data.split(b"\n")
            for m in pattern.finditer(data):
                name = m.group(0).decode()
                line = data.count(b"\n", 0, m.start()) + 1
                code = rows[line - 1].lstrip()
                if code.startswith((b"//", b"*", b"/*", b"#include")):
                    continue
                window = b" ".join(rows[max(line - 3, 0):line])
                binding = _BINDING.findall(window)
                enclosing = _innermost(funcs, line)
                if binding and (enclosing is None or enclosing[2] != name):
                    bound.add(binding[-1].decode())
                    reached.add(name)
                    continue
                if enclosing is None:
                    before = data[:m.start()].rstrip()[-1:]
                    if p.endswith(_NATIVE_HEADERS) or (before and (before.isalnum() or before in b"_*>")):
                        continue  # a declaration: ``void nvte_x(…);``, ``T* f(…);``
                    return None  # used as a value outside a function: reached some way not followed here
                if enclosing[2] == name:
                    continue  # its own definition, or a recursive call
                reached.add(name)
                if enclosing[2] not in seen:
                    found.add(enclosing[2])
        if found & _NATIVE_COMMON or any(len(n) < 4 for n in found):
            return None
        seen |= found
        if len(seen) > NATIVE_NAMES_BUDGET:
            return None
        frontier = found
    if seen - reached or not bound:
        return None  # a function nobody here calls or binds: it is reached some other way
    return frozenset(bound)


def _compiled_code_users(graph: ImportGraph, info: Callable, users: dict[str, list[str]], reached: list[str],
                         pkg: str, srcs: list[str], extensions: frozenset[str],
                         bound: frozenset[str] | None = None) -> dict[str, Changed]:
    """{module: its names that run the changed compiled code}, for the modules the tests reach.

    Compiled sources run through the modules that import the package's compiled extension (``import
    pkg._C as _C``, ``from flash_attn_2_cuda import …``: every name using that binding), and JIT-compiled
    ones also through the code that names the source file (``#include <pkg/impls/x.cuh>`` in a template
    string). A test that only imports a pure-Python part of the package (a gate, a config, a DSL kernel)
    runs none of it, though importing the package may load the extension. Empty when no such module is
    found: then every test importing the package counts. With ``bound`` (the Python names the changed code is
    bound as, ``_python_bindings``), only the code spelling one of them runs it, wherever the module comes from.
    """
    from runner.imports import Import, imports_of
    from runner.runnable import EXTENSION_NAME

    names = [posixpath.basename(src).encode() for src in srcs]
    bound_pattern = _spelled(bound) if bound else None
    out: dict[str, Changed] = {}
    files = sorted({m for m in users if m.endswith(".py")} | set(reached))
    for path in files:
        blob = graph.blob_sha(path) if graph.blob_sha else None
        loads = False
        for imp in imports_of(path, blob, graph.read):
            ext = None if imp.run else graph.extension(imp, path, extensions)
            leaf = ext.rsplit(".", 1)[-1] if ext else ""
            if ext and (ext.split(".", 1)[0] == pkg or ext in extensions) \
                    and (leaf in extensions or EXTENSION_NAME.search(leaf)):
                loads = True
                break
        data = graph.read(path) or b""
        mentions = [n for n in names if n in data]
        calls = [m.start() for m in bound_pattern.finditer(data)] if bound_pattern is not None else []
        if not loads and not mentions and not calls:
            continue
        mod = info(path)
        if mod.opaque:
            out[path] = ALL
            continue
        seeds: set[str] = set()
        if loads:
            for b in mod.bindings:
                imp = Import(b.module, (b.name,) if b.name else ())
                ext = graph.extension(imp, path, extensions)
                if ext and (EXTENSION_NAME.search(ext.rsplit(".", 1)[-1]) or ext.rsplit(".", 1)[-1] in extensions):
                    if bound_pattern is None or b.local in mod.dynamic:
                        seeds.add(b.local)  # every use of the extension (or getattr on it: any name)
        lines = {data.count(b"\n", 0, at) + 1 for n in mentions for at in _find_all(data, n)}
        lines |= {data.count(b"\n", 0, at) + 1 for at in calls}
        got = mod.changed_at(sorted(lines)) if lines else frozenset()
        if got == ALL:
            out[path] = ALL
            continue
        closed = _close_by_name(mod, seeds | set(got))
        if closed:
            out[path] = closed
    return out


def _close_by_name(mod, seeds: set[str]) -> frozenset[str]:
    """``ModuleInfo.close`` without module-level effects: a package that sets its extension up at import
    (``init_jit()``) runs that setup, not the kernels, for a test that never calls them."""
    changed = set(seeds)
    grew = bool(changed)
    while grew:
        grew = False
        for st in mod.stmts:
            uses = st.refs if st.uses is None else st.uses
            if not st.imports and not st.effect and uses & changed and not (st.names | st.registers) <= changed:
                changed |= st.names | st.registers
                grew = True
    return frozenset(changed)


# path parts that say nothing about which part of a package a file belongs to
_GENERIC_PARTS = {"csrc", "src", "source", "kernels", "kernel", "include", "cuda", "cpp", "ops", "op", "lib", "python",
                  "utils", "util", "common", "impl", "impls", "detail", "details", "core", "__init__", "api", "apis",
                  "jit", "backend", "backends", "buffers", "buffer", "third_party", "cutlass", "csrcs"}


def _parts(path: str, pkg: str) -> set[str]:
    stem = posixpath.splitext(posixpath.basename(path))[0]
    return {p for p in [*path.split("/")[:-1], stem] if p and p != pkg and p.lower() not in _GENERIC_PARTS}


def _same_part(seeds: dict[str, Changed], srcs: list[str], pkg: str) -> dict[str, Changed]:
    """The modules loading the extension that belong to the same part of the package as every changed source
    (``csrc/kernels/legacy/*.cu`` → ``pkg/buffers/legacy.py``, not ``pkg/buffers/elastic.py``), when some do;
    else all of them. The part is a path component or file stem other than generic ones (csrc, kernels, …)."""
    if len(seeds) < 2:
        return seeds
    wanted = [_parts(src, pkg) for src in srcs]
    if not all(wanted):
        return seeds
    kept = {path: names for path, names in seeds.items() if all(w & _parts(path, pkg) for w in wanted)}
    return kept or seeds


def _find_all(data: bytes, needle: bytes) -> list[int]:
    out: list[int] = []
    at = data.find(needle)
    while at >= 0 and len(out) < 64:
        out.append(at)
        at = data.find(needle, at + 1)
    return out


def _reaching(users: dict[str, list[str]], prefix: str, test_files: set[str]) -> list[str]:
    """The test files whose imports reach a module under ``prefix`` (one walk up the importers map)."""
    seen = {m for m in users if m.startswith(prefix)}
    queue = deque(seen)
    while queue:
        for user in users.get(queue.popleft(), []):
            if user not in seen:
                seen.add(user)
                queue.append(user)
    return sorted(seen & test_files)


def _need_of(head, head_paths: set[str], test_file: str) -> str | None:
    graph = ImportGraph(paths=head_paths, read=head.read, blob_sha=getattr(head, "blob_sha", None))
    return gpu_need(graph, test_file, _declared_extensions(head, head_paths))


@dataclass
class _Reach:
    """The test files and the import graph they are followed through, before any name is looked at."""

    graph: ImportGraph
    test_files: list[str]
    changed_py: set[str]
    gone: list[str]
    users: dict[str, list[str]]  # module → the files importing it, among those the tests reach


def _test_reach(config: Config, changes: ChangeSet, head, head_paths: set[str]) -> _Reach | None:
    """None when no test file is selected by imports (no import graph, no test files, no Python change)."""
    if not (config.settings.import_graph and config.settings.test_paths):
        return None
    changed_py = {f.path for f in changes.files if f.path.endswith(".py")}
    changed_py |= {f.old_path for f in changes.files if f.old_path and f.old_path.endswith(".py")}
    if not changed_py:
        return None
    tests = spec(tuple(config.settings.test_paths))
    test_files = sorted(p for p in head_paths if p.endswith(".py") and tests.match_file(p))
    if not test_files:
        return None
    gone = [p for p in changed_py if p not in head_paths]
    graph = ImportGraph(paths=head_paths, read=head.read, extra_paths=gone, blob_sha=getattr(head, "blob_sha", None))
    users = importers(graph, [t for t in test_files if t not in changed_py])
    return _Reach(graph, test_files, changed_py, gone, users)


def _import_graph(config: Config, reach: _Reach, head, head_paths: set[str], picks: _Picks,
                  changed: dict[str, Changed],
                  members: MemberChanges | None = None) -> dict[str, str]:
    """Select the test files a change reaches; returns {implicit test file: why it needs a GPU}."""
    graph, test_files, changed_py, gone = reach.graph, reach.test_files, reach.changed_py, reach.gone
    users = reach.users
    blob_sha = getattr(head, "blob_sha", None)
    impact = Impact(graph, unwrapping(graph, lambda p: info_of(p, blob_sha(p) if blob_sha else None, head.read)),
                    {**{p: ALL for p in gone}, **changed})
    impact.run([t for t in test_files if t not in changed_py], users)
    impact_keys = impact.string_keys()
    spelled = {p: n for p, n in _spelling_string_keys(impact, impact_keys, users, test_files, graph).items()
               if p not in changed_py}
    if spelled:  # ops a library registered under a name: the code spelling the name (torch.ops.ns.op) runs them
        changed = {**spelled, **changed}
        impact = Impact(graph, impact.info, {**{p: ALL for p in gone}, **changed})
        impact.run([t for t in test_files if t not in changed_py], users)
    by_member = _member_only_tests(impact, changed, members or {}, users, test_files, changed_py, gone, graph)
    unkeyed = None
    if impact.keyed:  # handlers registered for a class: a test reaching only them must name the class
        unkeyed = Impact(graph, impact.info, {**{p: ALL for p in gone}, **changed}, keyed_registries=False)
        unkeyed.run([t for t in test_files if t not in changed_py], users)
    covering = [(s, _command_paths(s.command)) for s in config.suites]
    extensions = _declared_extensions(head, head_paths)
    needs: dict[str, str] = {}
    for test_file in test_files:
        if test_file in by_member:
            continue  # reached only through classes changed in members it never spells
        chain = [test_file] if test_file in changed_py else impact.chain(test_file)
        if chain is None or (unkeyed is not None and test_file not in changed_py
                             and unkeyed.chain(test_file) is None and not impact.keys_spelled(chain[:-1])):
            continue  # reached only through a handler registered for a class it never names
        if chain[-1] in spelled:
            ops = ", ".join(sorted(impact_keys)[:4])
            reason = f"spells an op registered by name ({ops}) in {chain[-1]}" + \
                (" ← " + " → ".join(chain[:-1]) if len(chain) > 1 else "")
        else:
            reason = "changed test file" if len(chain) == 1 else "imports: " + " → ".join(chain)
        owners = [s for s, cmd_paths in covering if _covers(cmd_paths, test_file)]
        if owners:
            for s in owners:
                picks.add(s.id, reason)
        else:
            picks.add(f"{PYTEST_PREFIX}{test_file}", reason)
            need = gpu_need(graph, test_file, extensions)
            if need:
                needs[test_file] = need
    return needs


def unwrapping(graph: ImportGraph, info: Callable[[str], ModuleInfo]) -> Callable[[str], ModuleInfo]:
    """``info`` with the tree's wrapping decorators told apart from registering ones (``without_wrappers``)."""
    memo: dict[str, tuple[ModuleInfo, ModuleInfo]] = {}

    def read(path: str) -> ModuleInfo:
        raw = info(path)
        got = memo.get(path)
        if got is None or got[0] is not raw:
            got = memo[path] = (raw, without_wrappers(path, raw, graph, info))
        return got[1]
    return read


# members reached without being spelled: construction, operators, ``nn.Module.__call__`` → ``forward``
_IMPLICIT_MEMBERS = {"forward", "backward", "setup", "setUp", "tearDown", "setup_method", "teardown_method"}


MemberChanges = dict[str, tuple[dict[str, frozenset[str]], Changed]]


def member_changes(changes: ChangeSet, head, changed: dict[str, Changed]) -> MemberChanges:
    """{module: ({class: the members its change touches}, what else of the module changes)} for the classes a change touches only inside methods
    (or class-level assignments) that are reached by name: no dunder, no ``forward``, nothing else of the body,
    no registering decorator; closed over the members that spell a changed one (``self._helper()``). Such a
    class reaches only code that spells one of those members (``_member_only_tests``)."""
    out: MemberChanges = {}
    repo_path = getattr(head, "repo_path", None)
    for fc in changes.files:
        names = changed.get(fc.path)
        if fc.status != "modified" or not fc.path.endswith(".py") or names is None or names == ALL:
            continue
        head_data = head.read(fc.path)
        base_data = None
        if repo_path is not None and fc.old_blob:
            from checks.workspace import read_blob

            try:
                base_data = read_blob(repo_path, fc.old_blob)
            except ValueError:
                base_data = None
        if head_data is None or base_data is None:
            continue
        sides = [(head_data, [n for h in fc.hunks for n in h.added]), (base_data, [n for h in fc.hunks for n in h.removed])]
        touched: dict[str, set[str] | None] = {}
        for data, lines in sides:
            for cls, got in _class_members_at(data, lines).items():
                if got is None or touched.get(cls, set()) is None:
                    touched[cls] = None
                else:
                    touched.setdefault(cls, set()).update(got)  # type: ignore[union-attr]
        kept = {cls: frozenset(m) for cls, m in touched.items() if m is not None and m and cls in names}
        if not kept:
            continue
        info = info_of(fc.path, fc.new_blob, head.read)
        base_info = _base_info(repo_path, fc)
        if info.opaque or base_info is None or base_info.opaque:
            continue
        direct, old_side = info.changed_at(sides[0][1]), base_info.changed_at(sides[1][1])
        if direct == ALL or old_side == ALL:
            continue
        rest = (direct | old_side) - frozenset(kept)  # what changes besides them, and what uses that
        out[fc.path] = (kept, info.close(rest) if rest else frozenset())
    return out


def _class_members_at(data: bytes, lines: list[int]) -> dict[str, set[str] | None]:
    """{top-level class holding one of ``lines``: the members those lines touch, closed over the members that
    spell one; None when a line is elsewhere in the class or a member is reached implicitly}."""
    if not lines:
        return {}
    try:
        tree = ast.parse(data)
    except PARSE_ERRORS:
        return {}
    out: dict[str, set[str] | None] = {}
    rows = data.split(b"\n")
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        inside = [n for n in lines if start <= n <= (node.end_lineno or node.lineno)]
        if not inside:
            continue
        spans: list[tuple[str, int, int, ast.stmt]] = []
        for st in node.body:
            first = min([st.lineno] + [d.lineno for d in getattr(st, "decorator_list", [])])
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                spans.append((st.name, first, st.end_lineno or st.lineno, st))
            elif isinstance(st, (ast.Assign, ast.AnnAssign)):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        spans.append((t.id, first, st.end_lineno or st.lineno, st))
        touched: set[str] | None = set()
        for n in inside:
            if 0 < n <= len(rows) and (not rows[n - 1].strip() or rows[n - 1].lstrip().startswith(b"#")):
                continue
            hit = [name for name, a, b, _ in spans if a <= n <= b]
            if not hit:
                touched = None  # the class line, a base, a decorator, the docstring or a bare statement
                break
            touched.update(hit)  # type: ignore[union-attr]
        if touched is not None:
            grew = True
            while grew:
                grew = False
                for name, _a, _b, st in spans:
                    if name not in touched and _spells_attr(st, touched):
                        touched.add(name)
                        grew = True
            decorated = {name for name, _a, _b, st in spans if any(
                _decorator_name(d) not in PURE_DECORATORS for d in getattr(st, "decorator_list", []))}
            if any(m.startswith("__") or m in _IMPLICIT_MEMBERS or m in decorated for m in touched):
                touched = None
        out[node.name] = touched
    return out


def _spells_attr(node: ast.AST, names: set[str]) -> bool:
    return any((isinstance(sub, ast.Attribute) and sub.attr in names) or (isinstance(sub, ast.Name) and sub.id in names)
               for sub in ast.walk(node))


def _member_only_tests(impact: Impact, changed: dict[str, Changed], members: MemberChanges,
                       users: dict[str, list[str]], test_files: list[str], changed_py: set[str], gone: list[str],
                       graph: ImportGraph) -> set[str]:
    """The test files ``impact`` reaches only through classes changed in members (``member_changes``) that
    neither they nor any changed module they import spell, nor reach by ``getattr`` & co."""
    if not members:
        return set()
    without: dict[str, Changed] = {}
    for path, names in changed.items():
        if names != ALL and path in members:
            names = members[path][1]
            if not names:
                continue
        without[path] = names
    other = Impact(graph, impact.info, {**{p: ALL for p in gone}, **without})
    other.run([t for t in test_files if t not in changed_py], users)
    spelled = frozenset(m for classes, _rest in members.values() for ms in classes.values() for m in ms)
    pattern = _spelled(spelled)
    classes = sorted({c for cls, _rest in members.values() for c in cls}, key=len, reverse=True)
    # a class used as a value (passed on, asserted, annotated), not called nor read an attribute off: any of its
    # members may be called where it goes
    as_value = re.compile(rb"(?m)^(?![ \t]*(?:from|import)\b).*?(?<![\w\"'])(?:"
                          + b"|".join(re.escape(c.encode()) for c in classes) + rb")(?![\w\"'])(?!\s*[.(])")
    says: dict[str, bool] = {}

    def spells(path: str) -> bool:
        if path not in says:
            data = graph.read(path) or b""
            if path in members:  # the changed classes themselves spell their members: look at the rest
                data = _without_classes(data, set(members[path][0]))
            says[path] = bool(pattern.search(data)) or bool(as_value.search(data)) \
                or any(w in data for w in (b"getattr", b"__getattr__", b"vars("))
        return says[path]

    out = set()
    for test in test_files:
        if test in changed_py or impact.chain(test) is None or other.chain(test) is not None:
            continue
        # everything the test imports (duck typing: ``run(p)`` in a helper calls ``p.generate()``)
        seen, todo, found = {test}, [test], False
        while todo and not found:
            cur = todo.pop()
            if spells(cur):
                found = True
                break
            for nxt in graph.edges(cur):
                if nxt not in seen and nxt.endswith(".py"):
                    seen.add(nxt)
                    todo.append(nxt)
        if not found:
            out.add(test)
    return out


def _without_classes(data: bytes, classes: set[str]) -> bytes:
    """``data`` with the bodies of the named top-level classes blanked out."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return data
    rows = data.split(b"\n")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for i in range(node.lineno - 1, node.end_lineno or node.lineno):
                rows[i] = b""
    return b"\n".join(rows)


def _spelling_string_keys(impact: Impact, keys: frozenset[str], users: dict[str, list[str]], test_files: list[str],
                          graph: ImportGraph) -> dict[str, Changed]:
    """{module: its names that spell an op name (``keys``, ``impact.string_keys()``) a changed definition is
    registered under}, among the modules the tests reach and the tests themselves (nothing else changed in
    them: not already in ``impact.state``)."""
    if not keys:
        return {}
    pattern = _spelled(keys)
    out: dict[str, Changed] = {}
    for path in sorted({m for m in users if m.endswith(".py")} | set(test_files)):
        if path in impact.state:
            continue
        data = graph.read(path) or b""
        lines = sorted({data.count(b"\n", 0, m.start()) + 1 for m in pattern.finditer(data)})
        if not lines:
            continue
        info = impact.info(path)
        got = ALL if info.opaque else info.changed_at(lines)
        if got:
            out[path] = got
    return out


def changed_names(changes: ChangeSet, head, relevant: Callable[[str], bool] | None = None,
                  graph: ImportGraph | None = None) -> dict[str, Changed]:
    """Changed Python module → the top-level names its hunks touch (head side, and base side for removals).

    With the head's ``graph``, a definition under a decorator of the tree that only wraps (``@dispatch("op")``,
    ``@input_guard``) changes its own name, not the decorator's other users.

    A module for which ``relevant`` is false (no test file's imports reach it) only needs to be told
    inert or not: when its change provably touches a definition both sides have, it gets ALL without
    the full tables (its names would select nothing; ALL and those names are alike "not inert").
    """
    repo_path = getattr(head, "repo_path", None)
    blob_sha = getattr(head, "blob_sha", None)
    tree_info = None if graph is None else \
        unwrapping(graph, lambda p: info_of(p, blob_sha(p) if blob_sha else None, head.read))
    out: dict[str, Changed] = {}
    for fc in changes.files:
        if fc.status == "added" and not fc.binary and fc.path.endswith(".py") and fc.new_blob:
            new_info = info_of(fc.path, fc.new_blob, head.read)
            if tree_info is not None and graph is not None:
                new_info = without_wrappers(fc.path, new_info, graph, tree_info)
            names = _new_module_names(new_info)
            if names is not None:
                if names:
                    out[fc.path] = names
                continue
        if fc.status != "modified" or fc.binary:
            for p in (fc.path, fc.old_path):
                if p and p.endswith(".py"):
                    out[p] = ALL  # deleted, renamed, copied: importers start or stop working
            continue
        if not fc.path.endswith(".py") or not fc.hunks:
            continue
        added = [n for h in fc.hunks for n in h.added]
        removed = [n for h in fc.hunks for n in h.removed]
        if relevant is not None and not relevant(fc.path) and _observable(repo_path, fc, head, added, removed):
            out[fc.path] = ALL
            continue
        head_info = info_of(fc.path, fc.new_blob, head.read)
        base_info = _base_info(repo_path, fc)
        if head_info.opaque or base_info is None or base_info.opaque:
            out[fc.path] = ALL
            continue
        if tree_info is not None and graph is not None:
            head_info = without_wrappers(fc.path, head_info, graph, tree_info)
            base_info = without_wrappers(fc.path, base_info, graph, tree_info)
        touched: list[Changed] = [head_info.changed_at(added), base_info.changed_at(removed)]
        if ALL in touched:
            out[fc.path] = ALL
            continue
        names = frozenset().union(*touched)
        names -= _same_imports(head_info, base_info) - _registry_marks(names, head_info, base_info)
        if names:
            out[fc.path] = head_info.close(names)
    return out


def _new_module_names(info: ModuleInfo) -> frozenset[str] | None:
    """What a module the change adds brings its importers: every name it binds, when importing it does nothing
    else (no module-level effect, no import by name at run time, no registration of the tree); None (all of
    it) otherwise. Code that was there before can reach only what it imports from it, or the tables it fills."""
    if info.opaque or info.imports_by_name or info.registries or any(st.effect for st in info.stmts):
        return None
    return frozenset(n for st in info.stmts for n in st.names)


def _registry_marks(names: frozenset[str], head_info, base_info) -> frozenset[str]:
    """The registries among ``names`` that a changed registered definition brought in (not the import itself)."""
    return frozenset(n for info in (head_info, base_info) for st in info.stmts if st.names & names
                     for n in st.registers)


def _same_imports(head_info, base_info) -> frozenset[str]:
    """Names both sides bind only by imports, to the same targets: a duplicate import removed, a name added to
    ``from m import a, b`` or an import moved leaves them as they were."""
    def targets(info) -> tuple[dict[str, set[tuple[str, str | None]]], set[str]]:
        by_import: dict[str, set[tuple[str, str | None]]] = {}
        for b in info.bindings:
            if info.stmts[b.stmt].imports:
                by_import.setdefault(b.local, set()).add((b.module, b.name))
        defined = {n for st in info.stmts if not st.imports for n in st.names}
        return by_import, defined

    head_imports, head_defined = targets(head_info)
    base_imports, base_defined = targets(base_info)
    return frozenset(n for n, got in head_imports.items()
                     if base_imports.get(n) == got and n not in head_defined and n not in base_defined)


def _observable(repo_path: str | None, fc, head, added: list[int], removed: list[int]) -> bool:
    """Whether the change provably is not inert, from the statements around its lines alone."""
    if repo_path is None or not fc.old_blob:
        return False
    from checks.workspace import read_blob

    head_data = head.read(fc.path)
    try:
        base_data = read_blob(repo_path, fc.old_blob)
    except ValueError:
        return False
    if head_data is None:
        return False
    try:
        return touches_kept_definition(Outline(head_data, fc.new_blob), Outline(base_data, fc.old_blob), added, removed)
    except (RecursionError, MemoryError):  # nesting too deep to parse: the full tables decide (opaque: all)
        return False


def _base_info(repo_path: str | None, fc):
    if repo_path is None or not fc.old_blob:
        return None
    from checks.workspace import read_blob

    try:
        return info_of(fc.path, fc.old_blob, lambda _p: read_blob(repo_path, fc.old_blob))
    except ValueError:
        return None


COMMENTS_ONLY = "only comments or blank lines change"
DOCSTRING_ONLY = "only its docstring changes, which nothing reads"


def inert_files(changes: ChangeSet, head, head_paths: set[str], changed: dict[str, Changed]) -> dict[str, str]:
    """Changed modules whose change cannot reach any code: comments only, or names added or removed that
    nothing uses.

    Such a name is unused when no definition that exists on both sides refers
    to it and no importer anywhere in the head tree takes it (``from m import
    name``, or ``m.name`` after importing ``m``). A changed definition that
    exists on both sides is never inert: a command line (``python -m``) or a
    harness reaches it without any import.
    """
    out: dict[str, str] = {}
    removed: dict[str, frozenset[str]] = {}
    blob_sha = getattr(head, "blob_sha", None)
    for fc in changes.files:
        if fc.status != "modified" or fc.binary or not fc.path.endswith(".py") or not fc.hunks:
            continue
        names = changed.get(fc.path, frozenset())
        if names == ALL:
            continue
        if not names:
            out[fc.path] = COMMENTS_ONLY
            continue
        info = info_of(fc.path, fc.new_blob, head.read)
        base = _base_info(getattr(head, "repo_path", None), fc)
        if base is None:
            continue
        # a module docstring is only seen by who reads __doc__: the module itself (closed over above) or an
        # importer (checked below), so it does not count as a definition present on both sides
        kept = (_bound_names(info) & _bound_names(base)) - {"__doc__"}
        if names & kept:
            continue  # an existing definition changed: commands and harnesses reach it without imports
        removed[fc.path] = names
    if not removed:
        return out
    graph = ImportGraph(paths=head_paths, read=head.read, blob_sha=blob_sha)
    impact = Impact(graph, lambda p: info_of(p, blob_sha(p) if blob_sha else None, head.read), {})
    impact.state.update(removed)
    for user in sorted(head_paths):
        if not removed or not user.endswith(".py"):
            continue
        quick = static_bindings(user, head.read(user))
        for mod in list(removed):
            if user == mod:
                continue
            if quick is not None and not any(_may_reach(graph, user, b, mod) for b in quick):
                continue  # none of its imports leads to mod: the full table could find no use either
            info = impact.info(user)
            if info.opaque or info.may_load(mod, removed[mod]) \
                    or any(impact._binding_hit(user, b, mod, removed[mod], info) for b in info.bindings) \
                    or _through_package(graph, user, info, mod, removed[mod]):
                del removed[mod]
    for mod, names in removed.items():
        if names == {"__doc__"}:
            out[mod] = DOCSTRING_ONLY
        else:
            out[mod] = "only adds or removes " + ", ".join(sorted(names - {"__doc__"})) + ", which nothing uses"
    return out


def _may_reach(graph: ImportGraph, user: str, b: Binding, mod: str) -> bool:
    """Whether binding ``b`` could reach ``mod`` the ways ``Impact._binding_hit`` and ``_through_package`` look
    for: the module itself, a submodule imported from a package, a package run on the way, or an
    ``import pkg`` whose package holds ``mod``."""
    if b.name is not None and b.name != "*" and graph.module_file(f"{b.module}.{b.name}", user) == mod:
        return True
    if graph.module_file(b.module, user) == mod or mod in graph.resolve(b.module, user):
        return True
    if b.name is None:
        inits = graph.resolve(b.module.split(".", 1)[0], user)
        return any(mod.startswith(init.rsplit("/", 1)[0] + "/") for init in inits if "/" in init)
    return False


def _through_package(graph: ImportGraph, user: str, info, mod: str, names: frozenset[str]) -> bool:
    """``import pkg`` then ``pkg.mod.name``: the attribute chain off a package binding reaches ``mod``'s names."""
    for b in info.bindings:
        if b.name is not None or mod in graph.resolve(b.module, user):
            continue
        package_inits = graph.resolve(b.module.split(".", 1)[0], user)
        if not any(mod.startswith(init.rsplit("/", 1)[0] + "/") for init in package_inits if "/" in init):
            continue
        seen = info.refs if b.local in info.escapes else info.attrs.get(b.local, frozenset())
        if names & seen:
            return True
    return False


def _bound_names(info) -> frozenset[str]:
    return frozenset().union(*(st.names for st in info.stmts)) if info.stmts else frozenset()


BUILD_FILES = ("setup.py", "CMakeLists.txt", "csrc/CMakeLists.txt", "build.sh")


def _declared_extensions(head, head_paths: set[str], project: str = "") -> frozenset[str]:
    """The compiled extensions the build files of a project (the tree's, or a sub-project's ``sub/``) declare."""
    names: set[str] = set()
    for path in BUILD_FILES:
        if project + path in head_paths:
            names |= extension_names((head.read(project + path) or b"").decode("utf-8", "replace"))
    return frozenset(names)
