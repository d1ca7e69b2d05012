"""The pipeline's ``dispatch`` hook for the bot: suites go to self-hosted runners, never the bot's host.

The bot never executes a PR's code itself. Each runner label in the plan is
either dispatched to the repo's GPU workflow through ``runner.actions`` (and
its results arrive later with ``workflow_run``), or listed as not run with the
reason: a missing writer's ``/audit``, no dispatcher installed, or a dispatch
that failed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from bot.security import Gate
from checks.model import Results, SuiteResult, TestPlan


def actions_module() -> Any | None:
    try:
        return importlib.import_module("runner.actions")
    except ModuleNotFoundError as exc:
        if exc.name == "runner.actions":
            return None
        raise


class GpuDispatch:
    def __init__(self, repo, *, gate: Gate, head_sha: str, workflow: str, ref: str,
                 redact: Callable[[str], str] = lambda text: text, earlier: Results | None = None,
                 awaited: set[str] | None = None, on_plan: Callable[[str], None] | None = None):
        self.repo, self.gate, self.head_sha, self.workflow, self.ref = repo, gate, head_sha, workflow, ref
        self.redact = redact  # a failed dispatch's reason is published: no secret in it
        self.earlier = earlier  # what earlier audits of this commit ran: kept when this one may not run it
        self.awaited = awaited or set()  # labels an earlier audit of this commit dispatched, results not back
        self.pending: list[str] = []  # labels dispatched, results not back yet
        self.dispatched: list[str] = []
        self.unapproved: list[str] = []  # suites selected for runners this audit may not send code to
        self.on_plan = on_plan  # told the audit id before anything is dispatched (the bot routes its results)

    def __call__(self, plan: TestPlan) -> Results:
        results = Results(audit_id=plan.audit_id, head_sha=plan.head_sha)
        if self.on_plan is not None and plan.runners:
            self.on_plan(plan.audit_id)
        actions = actions_module()
        ran = {(s.suite, s.runner): s for s in (self.earlier.suites if self.earlier else [])}
        for label in plan.runners:
            if not self.gate.allowed:
                # An audit that may not run a suite never reports less than one that did on this commit: GitHub
                # shows the newest check run, so a not-run row here would hide a failure (a reopened fork PR, a
                # command that approves nothing). The earlier outcome stands.
                kept = [ran[(s.id, label)] for s in plan.for_runner(label) if (s.id, label) in ran]
                results.suites.extend(kept)
                results.devices.extend(d for d in (self.earlier.devices if self.earlier and kept else [])
                                       if d.label == label)
                missing = [s for s in plan.for_runner(label) if (s.id, label) not in ran]
                waiting = bool(missing) and label in self.awaited
                if waiting:  # the run an earlier audit started will report here too (bot.worker._collect)
                    self.pending.append(label)
                if not waiting:
                    self.unapproved.extend(s.id for s in missing)
                for suite in missing:
                    why = "an earlier audit of this commit dispatched it; results pending" if waiting else \
                        self.gate.reason
                    results.suites.append(SuiteResult(suite=suite.id, runner=label, outcome="not-run", reason=why))
                continue
            if actions is None:
                reason = f"no {label} runner dispatcher is installed on this bot"
            else:
                try:
                    actions.Dispatcher(self.repo, workflow=self.workflow, ref=self.ref).dispatch(plan, labels=[label])
                except Exception as exc:  # a failed dispatch is a reported outcome, not a crashed audit
                    reason = f"dispatch to the {label} runners failed: {self.redact(str(exc))[:300]}"
                else:
                    self.pending.append(label)
                    self.dispatched.append(label)
                    reason = f"dispatched to the {label} runners; results pending"
            for suite in plan.for_runner(label):
                results.suites.append(SuiteResult(suite=suite.id, runner=label, outcome="not-run", reason=reason))
        return results


def merge_results(current: Results | None, incoming: Results, labels: set[str] | None = None) -> Results:
    """Replace the placeholder rows of ``labels`` (default: the labels ``incoming`` reports on)."""
    labels = labels or ({s.runner for s in incoming.suites} | {d.label for d in incoming.devices})
    if current is None:
        return incoming
    kept = [s for s in current.suites if s.runner not in labels]
    devices = [d for d in current.devices if d.label not in labels]
    return Results(current.audit_id, current.head_sha, kept + incoming.suites, devices + incoming.devices)


def failed_suites(results: Results | None) -> list[str]:
    bad = {"failed", "error", "timeout", "segfault", "abort", "cuda-error"}
    return sorted({s.suite for s in (results.suites if results else []) if s.outcome in bad})
