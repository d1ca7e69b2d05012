"""One audit: every trigger (webhook, /audit, merge queue, CLI) runs these stages in this order.

Each stage is a plain function from one typed object to the next; this module
only times them and threads the objects through, so any stage can be run,
tested or cached on its own.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from contextlib import contextmanager

from bot.report import render as render_report
from checks.audit import run_checks
from checks.config import load_config
from checks.diff import build_changeset
from checks.model import Audit, AuditRequest, PillarHit
from checks.pillars import map_pillars
from checks.workspace import Tree, checkout, open_repo
from runner.select import select_tests

Progress = Callable[[str], None]


def audit_id_for(request: AuditRequest, head_sha: str) -> str:
    """Stable id for (repo, head, PR, trigger, nonce): the GPU artifact and details-page name."""
    key = f"{request.repo}\0{head_sha}\0{request.pr}\0{request.trigger}\0{request.nonce}"
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"da-{head_sha[:12]}-{digest[:8]}"


@contextmanager
def _stage(timings: dict[str, float], name: str, progress: Progress | None):
    if progress:
        progress(name)
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round(time.perf_counter() - start, 4)


def run_audit(request: AuditRequest, *, progress: Progress | None = None, render: bool = True,
              blob_url: str | None = None, details_url: str | None = None, dispatch=None) -> Audit:
    """Run every stage. ``dispatch`` (plan → Results) replaces local execution, e.g. Actions runners."""
    timings: dict[str, float] = {}
    with _stage(timings, "checkout", progress):
        co = checkout(request)
        config = load_config(open_repo(co.repo), co.base_sha)
    with _stage(timings, "diff", progress):
        changes = build_changeset(co)
    with _stage(timings, "pillars", progress):
        pillars = map_pillars(co, config, changes)
    audit = Audit(request=request, checkout=co, config_source=config.source, changes=changes, pillars=pillars,
                  timings=timings)

    with _stage(timings, "checks", progress):
        audit.findings = run_checks(co, config, changes)
    _add_finding_pillars(audit, config)

    with _stage(timings, "select", progress):
        audit.plan = select_tests(config, changes, pillars, audit.findings, request.options, Tree(co.repo, co.head_sha),
                                  audit_id_for(request, co.head_sha))
    if request.options.run or request.options.suites or request.options.all_suites:
        with _stage(timings, "dispatch", progress):
            audit.results = dispatch(audit.plan) if dispatch else _run_locally(co, audit, request, progress)

    if request.options.pillars:
        restrict_pillars(audit, request.options.pillars)
    if render:
        with _stage(timings, "report", progress):
            audit.report = render_report(audit, blob_url=blob_url, details_url=details_url)
    return audit


def restrict_pillars(audit: Audit, pillar_ids: list[str]) -> None:
    """``--pillars a,b`` / ``/audit pillars=a,b``: the report shows only these pillars and their findings."""
    keep = set(pillar_ids)
    audit.pillars.pillars = [p for p in audit.pillars.pillars if p.id in keep]
    audit.pillars.hunks = [h for h in audit.pillars.hunks if keep & set(h.pillars)]
    audit.findings.findings = [f for f in audit.findings.findings if f.pillar in keep]


def _add_finding_pillars(audit: Audit, config) -> None:
    """A finding can sit in a pillar the diff did not touch (a table edited in one file drifts from
    its copy in another): give that pillar a row so the finding shows in the table."""
    present = {p.id for p in audit.pillars.pillars}
    for pid in dict.fromkeys(f.pillar for f in audit.findings.findings if f.status != "fixed"):
        if pid not in present:
            pillar = config.pillar(pid)
            audit.pillars.pillars.append(PillarHit(id=pid, title=pillar.title if pillar else pid))
            present.add(pid)


def _run_locally(co, audit: Audit, request: AuditRequest, progress: Progress | None):
    from runner.local import run_plan
    from runner.worktree import head_worktree

    with head_worktree(co.repo, co.head_sha) as tree_dir:
        labels = [request.options.runner] if request.options.runner else None
        return run_plan(audit.plan, tree_dir, labels=labels, progress=progress)
