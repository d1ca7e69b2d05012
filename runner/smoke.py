"""Plan every suite of one runner label straight from the TOML, and print Results as a table.

For GPU machines that have torch and triton but none of the review-side
dependencies (pathspec, tree-sitter, git bindings): no selection, just "run
this label's suites", with the standard library's tomllib.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

from runner.compat import model, structure, unstructure

CONFIG = ".github/drift-audit.toml"
DOC = "docs/runners.md"


def suites_toml(repo: Path) -> tuple[str, str]:
    """(toml text, where it came from): the repo config if it declares suites, else the runners guide's block."""
    cfg = repo / CONFIG
    if cfg.is_file():
        text = cfg.read_text()
        if tomllib.loads(text).get("suite"):
            return text, CONFIG
    doc = repo / DOC
    if doc.is_file():
        section = doc.read_text().split("## This repository's suites", 1)[-1]
        if "```toml\n" in section:
            return section.split("```toml\n", 1)[1].split("```", 1)[0], f"{DOC} (proposed suites)"
    raise SystemExit(f"error: no [[suite]] entries in {CONFIG} or {DOC}")


def plan_for_label(repo: Path, label: str, audit_id: str, head_sha: str):
    m = model()
    text, source = suites_toml(repo)
    suites = []
    for s in tomllib.loads(text).get("suite", []):
        if label not in s.get("runners", ["cpu"]):
            continue
        suites.append(
            m.PlannedSuite(
                id=s["id"], kind=s["kind"], command=s["command"], runner=label, timeout=float(s.get("timeout", 900)),
                requires=s.get("requires"), reasons=[f"every {label} suite of {source}"], golden=s.get("golden"),
            )
        )
    return m.TestPlan(audit_id=audit_id, head_sha=head_sha, suites=suites)


def summary(results) -> str:
    lines = []
    for d in results.devices:
        lines.append(f"device: {d.label} {d.gpu or 'no GPU'} cc={d.compute_capability} driver={d.driver} "
                     f"cuda={d.cuda} torch={d.torch} triton={d.triton} python={d.python}")
    lines.append(f"{'suite':<24} {'runner':<7} {'outcome':<10} {'time':>8}  metrics / reason")
    for s in results.suites:
        shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in s.metrics.items())
        lines.append(f"{s.suite:<24} {s.runner:<7} {s.outcome:<10} {s.duration:7.1f}s  {shown or s.reason}")
        for c in s.cases:
            if c.outcome not in ("passed", "skipped"):
                lines.append(f"    {c.outcome:<9} {c.name}: {c.message[:160]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runner.smoke", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="write a TestPlan with every suite of LABEL")
    p.add_argument("--label", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--repo", default=".")
    p.add_argument("--audit-id", default="smoke")
    p.add_argument("--head-sha", default="")
    s = sub.add_parser("summary", help="print a Results JSON file as a table")
    s.add_argument("results")
    args = ap.parse_args(argv)
    if args.cmd == "plan":
        plan = plan_for_label(Path(args.repo), args.label, args.audit_id, args.head_sha)
        Path(args.out).write_text(json.dumps(unstructure(plan), indent=2) + "\n")
        print(f"{len(plan.suites)} {args.label} suite(s): {', '.join(x.id for x in plan.suites) or 'none'}", file=sys.stderr)
        return 0
    results = structure(json.loads(Path(args.results).read_text()), model().Results)
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
