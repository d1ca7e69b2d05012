"""``drift-audit runner plan``: the TestPlan of a local range, as JSON, without running anything.

Useful for CI systems that schedule suites themselves, and to see why a suite
was (or was not) picked.
"""

from __future__ import annotations

import importlib

from checks.config import load_config
from checks.diff import build_changeset
from checks.model import AuditOptions, AuditRequest, Findings, to_json
from checks.pillars import map_pillars
from checks.workspace import Tree, checkout, open_repo
from runner.select import select_tests


def _findings(co, config, changes) -> Findings:
    try:
        run_checks = importlib.import_module("checks.audit").run_checks
    except ModuleNotFoundError:
        return Findings()
    return run_checks(co, config, changes)


def plan_for(args) -> str:
    options = AuditOptions(all_suites=args.all, suites=list(args.suite), runner=args.runner)
    request = AuditRequest(repo=args.path, base=args.base or "", head=args.head, options=options)
    co = checkout(request)
    config = load_config(open_repo(co.repo), co.base_sha)
    changes = build_changeset(co)
    pillars = map_pillars(co, config, changes)
    findings = _findings(co, config, changes)
    audit_id = args.audit_id or f"local-{co.head_sha[:12]}"
    plan = select_tests(config, changes, pillars, findings, options, Tree(co.repo, co.head_sha), audit_id)
    return to_json(plan)
