"""One audit, GitHub-free: every front end (CLI, runner planner, bot worker) calls these stages.

``plan`` runs workspace → diff → pillars → checks → select and returns the
``Audit``; ``run`` hands its test plan to a ``Backend`` (this machine by
default, the bot passes Actions dispatch) and returns the ``Audit`` with
results. Rendering is ``runner.report``'s job. Each stage is a plain function
from one typed object to the next; this module only opens the workspace once,
times the stages and threads the objects through.

Dependencies point one way: bot → runner → checks. Nothing here imports bot.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import git

from checks.audit import run_checks
from checks.config import CONFIG_PATH, Config, ConfigError, load_config, parse_config
from checks.diff import build_changeset
from checks.model import Audit, AuditOptions, AuditRequest, ChangeSet, Checkout, Results, TestPlan
from checks.pillars import map_pillars
from checks.scope import add_finding_pillars, check_pillar_ids, restrict_pillars
from checks.workspace import Tree, WorkspaceError, default_base, merge_base_of, open_repo, resolve
from runner.select import select_tests

Progress = Callable[[str], None]
# Labels a suite may name without the config using them yet (runner/device.py reads them as GPU families).
STANDARD_LABELS = ("cpu", "sm90", "sm100", "sm120")


class RequestError(WorkspaceError, ValueError):
    """The request does not fit the repo (an unknown runner label, a reversed range): the user's to fix,
    never worth a retry (the worker treats ValueError so)."""


class Backend(Protocol):
    """Where a TestPlan's suites run. ``bot.gpu.GpuDispatch`` is one (Actions runners)."""

    def __call__(self, plan: TestPlan) -> Results: ...


def audit_id_for(request: AuditRequest, head_sha: str) -> str:
    """Stable id for (repo, head, PR, trigger, nonce): the GPU artifact and details-page name."""
    key = f"{request.repo}\0{head_sha}\0{request.pr}\0{request.trigger}\0{request.nonce}"
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"da-{head_sha[:12]}-{digest[:8]}"


def wants_run(options: AuditOptions) -> bool:
    """``--run``, and ``--suite`` / ``--all`` (asking for suites means running them)."""
    return bool(options.run or options.suites or options.all_suites)


@contextmanager
def _stage(timings: dict[str, float], name: str, progress: Progress | None) -> Iterator[None]:
    if progress:
        progress(name)
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round(time.perf_counter() - start, 4)


# --------------------------------------------------------------------------- stages


def workspace(request: AuditRequest, *, config_override: str | None = None) -> Checkout:
    """Resolve the range once and keep the open repo and the loaded config on the Checkout.

    The config is the base commit's (a PR cannot weaken its own audit) unless
    ``config_override`` names a file to try, which the footer then says.
    """
    repo = open_repo(request.repo)
    where = repo.working_dir or repo.git_dir
    if request.head in ("", "HEAD") and not repo.head.is_valid():
        kind = "a bare repository" if repo.bare else "a repository"
        raise WorkspaceError(f"{where}: {kind} with no commits yet (HEAD is unborn); commit first, or pass --head REV")
    head = resolve(repo, request.head)
    base = resolve(repo, request.base) if request.base else default_base(repo, head)
    merge_base = merge_base_of(repo, base, head)
    if request.trigger == "cli" and base != head and merge_base == head:  # a PR merged into its base is empty
        raise RequestError(
            f"reversed range: base {base[:12]} is a descendant of head {head[:12]} in {where}, so the diff "
            f"would be empty; swap them (--base {request.head} --head {request.base})"
        )
    co = Checkout(repo=str(where), base_sha=base, head_sha=head, merge_base_sha=merge_base)
    return co.attach(git=repo, config=_config(repo, base, config_override))


def _config(repo: git.Repo, base: str, override: str | None) -> Config:
    if override is None:
        return load_config(repo, base)
    path = Path(override)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RequestError(f"--config {override}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RequestError(f"--config {override}: cannot read it ({exc})") from None
    config = parse_config(text, str(path))
    config.source = f"{path} (--config, not the base's committed config)"
    return config


def _check_runner(options: AuditOptions, config: Config) -> None:
    if not options.runner:
        return
    known = sorted(set(STANDARD_LABELS) | {label for s in config.suites for label in s.runners})
    if options.runner not in known:
        raise RequestError(f"unknown runner label '{options.runner}'; known labels: {', '.join(known)}")


def head_config_error(co: Checkout, changes: ChangeSet) -> str | None:
    """Why the head's config does not load, when this change touches it. The audit runs on the base's
    config (a PR cannot weaken its own audit), so without this a PR that breaks the file passes, and
    every audit after the merge stops on it."""
    if not any(f.path == CONFIG_PATH and f.status != "deleted" for f in changes.files):
        return None
    try:
        load_config(co.git or open_repo(co.repo), co.head_sha)
    except ConfigError as exc:
        return str(exc)
    return None


def plan(request: AuditRequest, *, progress: Progress | None = None, config_override: str | None = None) -> Audit:
    """workspace → diff → pillars → checks → select. Bad names in the request fail before any work."""
    timings: dict[str, float] = {}
    with _stage(timings, "checkout", progress):
        co = workspace(request, config_override=config_override)
    config: Config = co.config
    check_pillar_ids(request.options.pillars, config)
    _check_runner(request.options, config)
    with _stage(timings, "diff", progress):
        changes = build_changeset(co)
    with _stage(timings, "pillars", progress):
        pillars = map_pillars(co, config, changes)
    audit = Audit(request=request, checkout=co, config_source=config.source, changes=changes, pillars=pillars,
                  timings=timings, head_config_error=head_config_error(co, changes))
    with _stage(timings, "checks", progress):
        audit.findings = run_checks(co, config, changes)
    add_finding_pillars(audit.pillars, audit.findings, config)
    with _stage(timings, "select", progress):
        everywhere = dataclasses.replace(request.options, runner=None)
        audit.plan = filter_runner(select_tests(config, changes, pillars, audit.findings, everywhere,
                                                Tree(co.repo, co.head_sha), audit_id_for(request, co.head_sha)),
                                   request.options.runner)
    if request.options.pillars:  # after selection: a suite is picked by every pillar the change touches
        restrict_pillars(audit.pillars, audit.findings, request.options.pillars)
    return audit


def filter_runner(test_plan: TestPlan, runner: str | None) -> TestPlan:
    """Keep the suites of one runner label; the others stay on the plan as ``filtered``, so the report
    can say what ``--runner`` left out and how to run it, instead of "no suite is affected"."""
    if not runner:
        return test_plan
    kept = [s for s in test_plan.suites if s.runner == runner]
    left = [s for s in test_plan.suites if s.runner != runner]
    return dataclasses.replace(test_plan, suites=kept, filtered=[*test_plan.filtered, *left])


class LocalBackend:
    """This machine: a detached worktree of the head, each suite in its own process group."""

    def __init__(self, checkout: Checkout, *, runner: str | None = None, progress: Progress | None = None):
        self.checkout, self.runner, self.progress = checkout, runner, progress

    def __call__(self, plan: TestPlan) -> Results:
        from contextlib import ExitStack

        from runner.local import run_plan
        from runner.worktree import head_worktree

        labels = [self.runner] if self.runner else None
        with ExitStack() as stack:  # the worktree is made only once a suite can run here
            def tree() -> str:
                return stack.enter_context(head_worktree(self.checkout.git or self.checkout.repo,
                                                         self.checkout.head_sha))

            return run_plan(plan, tree, labels=labels, progress=self.progress)


def run(audit: Audit, backend: Backend | None = None, *, progress: Progress | None = None) -> Audit:
    """Run the plan's suites on ``backend`` (default: this machine). Nothing to run costs nothing:
    an empty plan makes no worktree and dispatches nothing."""
    test_plan = audit.plan
    if test_plan is None:
        raise ValueError("run() needs an audit from plan(): it has no test plan")
    if not test_plan.suites:
        audit.results = Results(audit_id=test_plan.audit_id, head_sha=test_plan.head_sha)
        return audit
    chosen = backend or LocalBackend(audit.checkout, runner=audit.request.options.runner, progress=progress)
    with _stage(audit.timings, "dispatch", progress):
        audit.results = chosen(test_plan)
    return audit


def review(request: AuditRequest, *, backend: Backend | None = None, progress: Progress | None = None,
           config_override: str | None = None) -> Audit:
    """``plan``, then ``run`` when the request asks for suites to run: what ``drift-audit review`` does."""
    audit = plan(request, progress=progress, config_override=config_override)
    return run(audit, backend, progress=progress) if wants_run(request.options) else audit
