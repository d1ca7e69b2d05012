"""Wall time of `drift-audit review` on a bring-up-sized PR, against `git diff --stat` as the floor.

    python benchmarks/review_bench.py [--files 2000] [--repeat 5] [--smoke]

Builds the synthetic repo (benchmarks/synth_repo.py: ≥ 2000 files, one change
of 129 files and ~50k lines), then measures, in one run:
- the floor: `git diff --stat base..head`;
- cold: a fresh `drift-audit review` process (imports, parses, nothing cached);
- warm: the same review again inside one process (parse and blob caches hot);
and the stage times of each. Medians of --repeat runs. ``--smoke`` runs every
section on a 200-file repo once (a CI check that the benchmark still works).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.synth_repo import git_diff_floor, make_synthetic_repo, shortstat  # noqa: E402

STAGES = ("checkout", "diff", "pillars", "checks", "select", "report")


def _timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return wall, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one run of each section")
    args = ap.parse_args()
    if args.smoke:
        args.files, args.repeat = 200, 1

    root = Path(tempfile.mkdtemp(prefix="drift-audit-bench-")) / "synth"
    change = {"change_files": 20, "change_lines": 2000} if args.smoke else {}
    base, head = make_synthetic_repo(root, n_files=args.files, **change)
    print(f"repo: {args.files} files; change: {shortstat(root, base, head)}")

    anchor = git_diff_floor(root, base, head, args.repeat)
    review = [sys.executable, "-m", "bot.cli", "review", str(root), "--base", base, "--head", head,
              "--format", "json"]
    cold_wall, cold_stages = [], []
    for _ in range(args.repeat):
        wall, out = _timed(review, Path(__file__).resolve().parents[1])
        cold_wall.append(wall)
        cold_stages.append(json.loads(out)["timings"])

    from checks.model import AuditRequest
    from runner.pipeline import plan
    from runner.report import report

    request = AuditRequest(repo=str(root), base=base, head=head)
    report(plan(request))  # fill the caches
    warm_wall, warm_stages = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        audit = plan(request)
        report(audit)
        warm_wall.append(time.perf_counter() - start)
        warm_stages.append(audit.timings)

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    def stage(rows: list[dict], name: str) -> float:
        return med([r.get(name, 0.0) for r in rows])

    core_cold = med([sum(r.get(s, 0.0) for s in ("checkout", "diff", "pillars", "report")) for r in cold_stages])
    core_warm = med([sum(r.get(s, 0.0) for s in ("checkout", "diff", "pillars", "report")) for r in warm_stages])
    print()
    print(f"{'measure':<34}{'seconds':>10}{'× git diff --stat':>20}")
    print("-" * 64)
    rows = [
        ("git diff --stat (floor)", anchor),
        ("review, cold process, wall", med(cold_wall)),
        ("review, cold: diff+pillars+render", core_cold),
        ("review, warm in-process, wall", med(warm_wall)),
        ("review, warm: diff+pillars+render", core_warm),
    ]
    for name, value in rows:
        print(f"{name:<34}{value:>10.3f}{value / anchor:>20.1f}")
    print()
    print(f"{'stage':<12}{'cold s':>10}{'warm s':>10}")
    for s in STAGES:
        print(f"{s:<12}{stage(cold_stages, s):>10.3f}{stage(warm_stages, s):>10.3f}")
    print(f"\ntarget: diff + pillars + render ≤ 1.0 s cold → {'met' if core_cold <= 1.0 else 'MISSED'}"
          f" ({core_cold:.3f} s)")


if __name__ == "__main__":
    main()
