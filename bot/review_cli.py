"""``drift-audit review`` and ``drift-audit demo``: the whole audit from a terminal, no GitHub, no GPU.

Exit codes make it usable as a plain CI step: 0 pass, 1 the verdict failed,
2 the input was wrong (not a repo, unknown revision, bad config).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_FAIL = 1
EXIT_USAGE = 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("review", help="audit a local git range and print the review")
    p.add_argument("path", nargs="?", default=".", help="repository path (default: .)")
    p.add_argument("--base", help="base revision (default: merge-base with the default branch, else HEAD~1)")
    p.add_argument("--head", default="HEAD", help="head revision (default: HEAD)")
    p.add_argument("--format", choices=["markdown", "json", "sarif"], default="markdown")
    p.add_argument("--output", "-o", help="write the review here instead of stdout")
    p.add_argument("--run", action="store_true", help="run the selected test suites locally")
    p.add_argument("--all", dest="all_suites", action="store_true", help="select every suite")
    p.add_argument("--suite", action="append", default=[], metavar="ID", help="run this suite (repeatable)")
    p.add_argument("--runner", help="run only the suites of this runner label (cpu, sm90, sm120)")
    p.add_argument("--pillars", help="comma-separated pillar ids to report on")
    p.set_defaults(handler=review)

    d = sub.add_parser("demo", help="build a sample engine repo with a drifting change and review it")
    d.add_argument("--dir", help="where to build the sample repo (default: a new temporary directory)")
    d.add_argument("--format", choices=["markdown", "json", "sarif"], default="markdown")
    d.add_argument("--output", "-o", help="write the review here instead of stdout")
    d.add_argument("--no-run", dest="run", action="store_false", help="select suites but do not run them")
    d.set_defaults(handler=demo)


def _progress():
    """A rich status line on a terminal; silence otherwise (logs, pipes, CI)."""
    if not sys.stderr.isatty():
        return None, None
    from rich.console import Console

    status = Console(stderr=True).status("auditing…")
    status.start()
    return status, lambda stage: status.update(f"drift-audit: {stage}…")


def _emit(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def run_review(path: str, base: str | None, head: str, fmt: str, output: str | None, options) -> int:
    from bot.pipeline import run_audit
    from checks.config import ConfigError
    from checks.diff import DiffError
    from checks.model import AuditRequest, to_json
    from checks.workspace import WorkspaceError

    request = AuditRequest(repo=str(Path(path).resolve()), base=base or "", head=head, options=options)
    status, progress = _progress()
    try:
        audit = run_audit(request, progress=progress)
    except (WorkspaceError, ConfigError, DiffError) as exc:
        print(f"drift-audit: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if status:
            status.stop()
    if fmt == "json":
        _emit(to_json(audit), output)
    elif fmt == "sarif":
        import json

        from checks.sarif import to_sarif

        _emit(json.dumps(to_sarif(audit), indent=2), output)
    else:
        _emit(audit.report.markdown, output)
    return EXIT_FAIL if audit.report.verdict == "fail" else 0


def _options(args):
    from checks.model import AuditOptions

    return AuditOptions(
        run=bool(getattr(args, "run", False)),
        all_suites=bool(getattr(args, "all_suites", False)),
        suites=list(getattr(args, "suite", []) or []),
        pillars=[p for p in (getattr(args, "pillars", None) or "").split(",") if p],
        runner=getattr(args, "runner", None),
    )


def review(args) -> int:
    return run_review(args.path, args.base, args.head, args.format, args.output, _options(args))


def demo(args) -> int:
    import tempfile

    from bot.demo import build_demo_repo

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="drift-audit-demo-"))
    base, head = build_demo_repo(root)
    print(f"drift-audit demo: sample engine repo at {root} (base {base[:12]}, head {head[:12]})", file=sys.stderr)
    code = run_review(str(root), base, head, args.format, args.output, _options(args))
    if code == EXIT_FAIL:  # the sample PR drifts on purpose: a failing verdict is the demo working
        print(f"drift-audit demo: verdict fail, as intended; `drift-audit review {root} --base {base[:12]}` "
              "exits 1 on it, so it can gate CI", file=sys.stderr)
        return 0
    return code
