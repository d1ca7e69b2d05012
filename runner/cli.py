"""``drift-audit runner ...``: plan a change's suites, execute a plan, show this machine.

Import-light on purpose: everything heavy is imported inside the handlers.
"""

from __future__ import annotations

import argparse
import sys


def add_execute_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", required=True, help="TestPlan JSON file (or an audit's JSON; '-' for stdin)")
    p.add_argument("--out", required=True, help="where to write Results JSON")
    p.add_argument("--label", help="run only this runner label's suites (sm90, sm120, cpu); default: all")
    p.add_argument("--repo", default=".", help="checkout of the plan's head commit (default: .)")
    p.add_argument(
        "--capability",
        help="state the compute capability instead of detecting it ('9.0', or 'cpu' for none)",
    )
    p.add_argument("--allow-other-head", action="store_true", help="run even if --repo is not at the plan's head")


def register(subparsers) -> None:
    runner = subparsers.add_parser("runner", help="test plans and their execution (CI and GPU runners)")
    sub = runner.add_subparsers(dest="runner_command", metavar="ACTION", required=True)

    ex = sub.add_parser("execute", help="run a TestPlan's suites here and write Results JSON")
    add_execute_arguments(ex)
    ex.set_defaults(handler=_execute)

    pl = sub.add_parser("plan", help="select the suites a change needs and write the TestPlan JSON")
    pl.add_argument("path", nargs="?", default=".", help="repository (default: .)")
    pl.add_argument("--base", help="base revision (default: merge-base with the default branch, or HEAD~1)")
    pl.add_argument("--head", default="HEAD", help="head revision (default: HEAD)")
    pl.add_argument("--all", action="store_true", help="select every suite")
    pl.add_argument("--suite", action="append", default=[], help="select this suite id only (repeatable)")
    pl.add_argument("--runner", help="keep only this runner label's suites")
    pl.add_argument("--audit-id", help="id to stamp on the plan (default: local-<head sha>)")
    pl.add_argument("--out", help="write the plan here instead of stdout")
    pl.set_defaults(handler=_plan)

    dv = sub.add_parser("device", help="print this machine's device fingerprint as JSON")
    dv.add_argument("--label", help="the runner label to stamp on it")
    dv.set_defaults(handler=_device)


def _execute(args) -> int:
    from runner.execute import run_from_args

    return run_from_args(args)


def _plan(args) -> int:
    from checks.config import ConfigError
    from checks.workspace import WorkspaceError
    from runner.plan_cli import plan_for
    from runner.select import SelectionError

    try:
        text = plan_for(args)
    except (WorkspaceError, ConfigError, SelectionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0


def _device(args) -> int:
    import json

    from runner.compat import unstructure
    from runner.device import fingerprint

    print(json.dumps(unstructure(fingerprint(args.label)), indent=2))
    return 0
