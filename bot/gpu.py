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
                 redact: Callable[[str], str] = lambda text: text):
        self.repo, self.gate, self.head_sha, self.workflow, self.ref = repo, gate, head_sha, workflow, ref
        self.redact = redact  # a failed dispatch's reason is published: no secret in it
        self.pending: list[str] = []  # labels dispatched, results not back yet
        self.dispatched: list[str] = []

    def __call__(self, plan: TestPlan) -> Results:
        results = Results(audit_id=plan.audit_id, head_sha=plan.head_sha)
        actions = actions_module()
        for label in plan.runners:
            if not self.gate.allowed:
                reason = self.gate.reason
            elif actions is None:
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
