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

import fnmatch
import shlex
from collections import OrderedDict
from functools import lru_cache

import pathspec

from checks.config import CONFIG_PATH, Config, Suite
from checks.model import AuditOptions, ChangeSet, Findings, PillarMap, PlannedSuite, TestPlan
from runner.imports import ImportGraph

PYTEST_PREFIX = "pytest:"


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


def pytest_suite(test_file: str, reasons: list[str], timeout: float = 900.0) -> PlannedSuite:
    return PlannedSuite(
        id=f"{PYTEST_PREFIX}{test_file}",
        kind="unit",
        command=f"python -m pytest -q {shlex.quote(test_file)}",
        runner="cpu",
        timeout=timeout,
        reasons=list(reasons),
    )


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

    if not options.suites:  # asking for suites by id runs just those
        _automatic(config, changes, paths, pillars, findings, options, head, head_paths, picks)

    planned: list[PlannedSuite] = []
    for sid, reasons in picks.reasons.items():
        if sid in suites:
            s = suites[sid]
            for runner in s.runners:
                planned.append(_planned(s, runner, reasons))
        else:
            planned.append(pytest_suite(sid[len(PYTEST_PREFIX) :], reasons))
    if options.runner:
        planned = [p for p in planned if p.runner == options.runner]
    not_affected = [s.id for s in config.suites if s.id not in picks.reasons]
    return TestPlan(audit_id=audit_id, head_sha=changes.head_sha, suites=planned, not_affected=not_affected)


def _automatic(config: Config, changes: ChangeSet, paths: list[str], pillars: PillarMap, findings: Findings,
               options: AuditOptions, head, head_paths: set[str], picks: _Picks) -> None:
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

    for s in config.suites:
        _declared_reasons(s, paths, pillars, findings, picks)

    if config.settings.import_graph and config.settings.test_paths:
        _import_graph(config, changes, head, head_paths, picks)


def _import_graph(config: Config, changes: ChangeSet, head, head_paths: set[str], picks: _Picks) -> None:
    changed_py = {f.path for f in changes.files if f.path.endswith(".py")}
    changed_py |= {f.old_path for f in changes.files if f.old_path and f.old_path.endswith(".py")}
    if not changed_py:
        return
    tests = spec(tuple(config.settings.test_paths))
    test_files = sorted(p for p in head_paths if p.endswith(".py") and tests.match_file(p))
    if not test_files:
        return
    gone = [p for p in changed_py if p not in head_paths]
    graph = ImportGraph(paths=head_paths, read=head.read, extra_paths=gone, blob_sha=getattr(head, "blob_sha", None))
    covering = [(s, _command_paths(s.command)) for s in config.suites]
    for test_file in test_files:
        chain = graph.chain_to(test_file, changed_py)
        if chain is None:
            continue
        reason = "changed test file" if len(chain) == 1 else "imports: " + " → ".join(chain)
        owners = [s for s, cmd_paths in covering if _covers(cmd_paths, test_file)]
        if owners:
            for s in owners:
                picks.add(s.id, reason)
        else:
            picks.add(f"{PYTEST_PREFIX}{test_file}", reason)
