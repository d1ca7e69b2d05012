"""``drift-audit runner plan``: the TestPlan of a local range, as JSON, without running anything.

Useful for CI systems that schedule suites themselves, and to see why a suite
was (or was not) picked. The stages are ``runner.pipeline.plan``'s, the same
the review and the bot run.
"""

from __future__ import annotations

from checks.model import AuditOptions, AuditRequest, to_json
from runner.pipeline import plan


def plan_for(args) -> str:
    options = AuditOptions(all_suites=args.all, suites=list(args.suite), runner=args.runner)
    request = AuditRequest(repo=args.path, base=args.base or "", head=args.head, options=options)
    audit = plan(request)
    assert audit.plan is not None  # plan() always selects
    audit.plan.audit_id = args.audit_id or f"local-{audit.checkout.head_sha[:12]}"
    return to_json(audit.plan)
