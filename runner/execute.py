"""The runner-side entry point: a TestPlan in, Results out, on whatever machine this is.

This is what ``drift-audit-gpu.yml`` runs on a self-hosted GPU runner. It
needs only the standard library plus runner/compat, so it also works from a
plain ``PYTHONPATH=.`` checkout on an image with torch and triton but none of
the review-side dependencies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from runner.compat import model, structure, unstructure

MAX_PLAN_BYTES = 8 * 1024 * 1024


class PlanError(ValueError):
    pass


def read_plan(path: str):
    """A TestPlan from a JSON file (``-`` for stdin), with errors that say what is wrong."""
    m = model()
    try:
        if path == "-":
            text = sys.stdin.read(MAX_PLAN_BYTES + 1)
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(MAX_PLAN_BYTES + 1)
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the plan: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PlanError(f"{path}: the plan is not UTF-8 JSON") from None
    if len(text) > MAX_PLAN_BYTES:
        raise PlanError(f"{path}: the plan is over {MAX_PLAN_BYTES} bytes; pass a smaller plan")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{path}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if isinstance(data, dict) and "plan" in data and "audit_id" not in data:
        data = data["plan"]  # an Audit's JSON: take its plan
    if not isinstance(data, dict) or "suites" not in data or "audit_id" not in data:
        raise PlanError(f"{path}: not a TestPlan (expected an object with 'audit_id', 'head_sha' and 'suites')")
    try:
        return structure(data, m.TestPlan)
    except (ValueError, TypeError) as exc:
        raise PlanError(f"{path}: not a valid TestPlan: {exc}") from None


def write_results(results: Any, path: str) -> None:
    """Write atomically: a half-written results.json must never be uploaded."""
    text = json.dumps(unstructure(results), indent=2)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".results-", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    os.replace(tmp, path)


def head_of(repo_dir: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", repo_dir, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


FAILED = {"failed", "error", "timeout", "segfault", "abort", "cuda-error"}


def execute(
    plan_path: str,
    out_path: str,
    *,
    label: str | None = None,
    repo_dir: str = ".",
    capability: Any = None,
    allow_other_head: bool = False,
    log=print,
) -> int:
    """Run a plan's suites for ``label`` (all labels when None). Exit code: 0 ok, 1 a suite failed, 2 bad input."""
    from runner.local import run_plan

    try:
        plan = read_plan(plan_path)
    except PlanError as exc:
        log(f"error: {exc}")
        return 2
    if not os.path.isdir(repo_dir):
        log(f"error: {repo_dir}: not a directory; pass --repo with the checkout of the head commit")
        return 2
    here = head_of(repo_dir)
    if here and plan.head_sha and not here.startswith(plan.head_sha) and not allow_other_head:
        log(
            f"error: {repo_dir} is at {here[:12]} but the plan is for {plan.head_sha[:12]}; "
            "check out the plan's head commit (or pass --allow-other-head)"
        )
        return 2
    if label and not plan.for_runner(label):
        log(f"note: the plan has no suites for runner '{label}' (it has: {', '.join(plan.runners) or 'none'})")
    try:
        results = run_plan(plan, repo_dir, labels=[label] if label else None, capability=capability, progress=log)
    except ValueError as exc:
        log(f"error: {exc}")
        return 2
    write_results(results, out_path)
    failed = [s for s in results.suites if s.outcome in FAILED]
    log(f"wrote {out_path}: {len(results.suites)} suite(s), {len(failed)} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.execute`` for images without the console script installed."""
    import argparse

    from runner.cli import add_execute_arguments

    parser = argparse.ArgumentParser(prog="python -m runner.execute", description=__doc__.splitlines()[0])
    add_execute_arguments(parser)
    args = parser.parse_args(argv)
    return run_from_args(args)


def run_from_args(args) -> int:
    return execute(
        args.plan,
        args.out,
        label=args.label,
        repo_dir=args.repo,
        capability=args.capability,
        allow_other_head=args.allow_other_head,
        log=lambda s: print(s, file=sys.stderr, flush=True),
    )


if __name__ == "__main__":
    sys.exit(main())
