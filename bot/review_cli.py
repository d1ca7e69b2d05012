"""``drift-audit review`` and ``drift-audit demo``: the whole audit from a terminal, no GitHub, no GPU.

Exit codes make it usable as a plain CI step: 0 pass, 1 the verdict failed,
2 the input was wrong (not a repo, unknown revision or name, bad config, an
output path that cannot be written). Bad input is said in one line naming the
known values or the fix, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_FAIL = 1
EXIT_USAGE = 2
FORMATS = ("markdown", "json", "sarif", "junit", "html", "check-run")

_EPILOG = """\
formats (--format):
  markdown   the PR comment (default)
  json       every stage object; loads back into checks/model.py's dataclasses
  sarif      SARIF 2.1.0 for GitHub code scanning
  junit      JUnit XML: findings and suites as test cases, for any CI
  html       the details page (inline SVG, no script)
  check-run  the check run's title, summary, text and annotations, as JSON

running suites:
  --run runs the selected suites; --suite ID and --all imply --run.

exit codes:
  0  the verdict passed
  1  the verdict failed (a failing finding under [settings] fail_on, or a failed suite)
  2  bad input: not a repository, unknown revision, pillar, runner, suite or format,
     a reversed range, a bad config, an output path that cannot be written
  141  stdout was closed early (`drift-audit … | head`): nothing is wrong, nothing more is said
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "review", help="audit a local git range and print the review",
        description="Audit BASE..HEAD of a local repository: pillars, drift findings, selected suites.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", nargs="?", default=".", help="repository path (default: .)")
    p.add_argument("--base", help="base revision (default: merge-base with the default branch, else HEAD~1)")
    p.add_argument("--head", default="HEAD", help="head revision (default: HEAD)")
    p.add_argument("--format", choices=FORMATS, default="markdown", help="output format (default: markdown)")
    p.add_argument("--output", "-o", metavar="FILE", help="write the review here instead of stdout")
    p.add_argument("--config", metavar="FILE",
                   help="try this config file instead of the base commit's (the footer says so)")
    p.add_argument("--run", action="store_true", help="run the selected test suites locally")
    p.add_argument("--all", dest="all_suites", action="store_true", help="select every suite (implies --run)")
    p.add_argument("--suite", action="append", default=[], metavar="ID",
                   help="run only this suite (repeatable; implies --run)")
    p.add_argument("--runner", metavar="LABEL", help="run only the suites of this runner label (cpu, sm90, sm120)")
    p.add_argument("--pillars", metavar="A,B", help="comma-separated pillar ids to report on")
    p.set_defaults(handler=review)

    r = sub.add_parser("report", help="render a saved audit (review --format json) in another format",
                       description="Render AUDIT.json, written by `drift-audit review --format json`, in any format "
                       "without auditing again: one review, then markdown for a job summary and SARIF for code "
                       "scanning.")
    r.add_argument("audit", metavar="AUDIT.json", help="the JSON of one audit")
    r.add_argument("--format", choices=FORMATS, default="markdown", help="output format (default: markdown)")
    r.add_argument("--output", "-o", metavar="FILE", help="write it here instead of stdout")
    r.set_defaults(handler=report)

    d = sub.add_parser("demo", help="build a sample engine repo with a drifting change and review it",
                       description="Build a sample engine repository with a drifting PR, review it, and remove "
                       "the repository again unless --keep or --dir.")
    d.add_argument("--dir", help="build the sample repo here and keep it (default: a temporary directory)")
    d.add_argument("--keep", action="store_true", help="keep the temporary sample repo and print its path")
    d.add_argument("--format", choices=FORMATS, default="markdown", help="output format (default: markdown)")
    d.add_argument("--output", "-o", metavar="FILE", help="write the review here instead of stdout")
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


def _output_problem(output: str | None) -> str | None:
    """Checked before the audit runs, so a typo in -o does not cost a whole review."""
    if not output:
        return None
    target = Path(output)
    if target.is_dir():
        return f"--output {output}: is a directory; name a file in it"
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return f"--output {output}: directory {parent} does not exist; create it or write elsewhere"
    return None


def _emit(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _fail(message: str) -> int:
    print(f"drift-audit: {message}", file=sys.stderr)
    return EXIT_USAGE


def run_review(path: str, base: str | None, head: str, fmt: str, output: str | None, options,
               config: str | None = None) -> int:
    from checks.config import ConfigError
    from checks.diff import DiffError
    from checks.model import AuditRequest
    from checks.scope import ScopeError
    from checks.workspace import WorkspaceError
    from runner import pipeline
    from runner.report import context_for, render
    from runner.report.markdown import verdict_of
    from runner.select import SelectionError
    from runner.worktree import WorktreeError

    problem = _output_problem(output)
    if problem:
        return _fail(problem)
    request = AuditRequest(repo=str(Path(path).resolve()), base=base or "", head=head, options=options)
    status, progress = _progress()
    try:
        audit = pipeline.review(request, progress=progress, config_override=config)
    except (WorkspaceError, ConfigError, DiffError, WorktreeError, ScopeError, pipeline.RequestError,
            SelectionError) as exc:  # each message names the known values or the fix
        return _fail(str(exc))
    finally:
        if status:
            status.stop()
    try:
        _emit(render(audit, fmt, context_for(audit)), output)
    except OSError as exc:
        return _fail(f"--output {output}: {exc.strerror or exc}")
    return EXIT_FAIL if verdict_of(audit)[0] == "fail" else 0


def _options(args):
    from checks.model import AuditOptions

    return AuditOptions(
        run=bool(getattr(args, "run", False)),
        all_suites=bool(getattr(args, "all_suites", False)),
        suites=list(getattr(args, "suite", []) or []),
        pillars=[p.strip() for p in (getattr(args, "pillars", None) or "").split(",") if p.strip()],
        runner=getattr(args, "runner", None),
    )


def review(args) -> int:
    return run_review(args.path, args.base, args.head, args.format, args.output, _options(args), args.config)


def report(args) -> int:
    """Re-render a saved audit: the JSON round-trips into checks.model's dataclasses."""
    from checks.model import Audit, from_json
    from runner.report import context_for, render
    from runner.report.markdown import verdict_of

    problem = _output_problem(args.output)
    if problem:
        return _fail(problem)
    try:
        audit = from_json(Audit, Path(args.audit).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return _fail(f"{args.audit}: no such file")
    except (OSError, ValueError, TypeError, KeyError, ExceptionGroup) as exc:  # cattrs groups its errors
        return _fail(f"{args.audit}: not the JSON of an audit (`drift-audit review --format json`): {_why(exc)}")
    audit.report = None  # rendered anew, with this environment's links
    try:
        _emit(render(audit, args.format, context_for(audit)), args.output)
    except OSError as exc:
        return _fail(f"--output {args.output}: {exc.strerror or exc}")
    return EXIT_FAIL if verdict_of(audit)[0] == "fail" else 0


def _why(exc: BaseException) -> str:
    """The first few concrete problems of a (possibly grouped) structuring error, on one line."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(exc)
    said = [f"missing field {e.args[0]!r}" if isinstance(e, KeyError) else str(e).splitlines()[0] for e in leaves[:4]]
    return "; ".join(said)[:300] + ("; …" if len(leaves) > 4 else "")


def demo(args) -> int:
    import shutil
    import tempfile

    from bot.demo import build_demo_repo

    temporary = not args.dir
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="drift-audit-demo-"))
    try:
        base, head = build_demo_repo(root)
        print(f"drift-audit demo: sample engine repo at {root} (base {base[:12]}, head {head[:12]})",
              file=sys.stderr)
        code = run_review(str(root), base, head, args.format, args.output, _options(args))
    finally:
        if temporary and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    kept = not temporary or args.keep
    if code == EXIT_FAIL:  # the sample PR drifts on purpose: a failing verdict is the demo working
        how = f"`drift-audit review {root} --base {base[:12]}`" if kept else "`drift-audit review`"
        print(f"drift-audit demo: verdict fail, as intended; {how} exits 1 on this change, so it can gate CI"
              + ("" if kept else " (sample repo removed; --keep keeps it)"), file=sys.stderr)
        return 0
    return code
