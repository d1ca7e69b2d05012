#!/usr/bin/env python3
"""The call check (checks/infer/calls.py) replayed over real history: recall on fixes of calls left on an old
signature, findings on ordinary commits with their judged verdicts, and its cost against the diff stage.

    python benchmarks/call_fit_replay.py [--commits 300] [--out FILE]     # the fetched mirrors
    python benchmarks/call_fit_replay.py --only --repo OWNER/NAME ...      # other repos, forward only
    python benchmarks/call_fit_replay.py --smoke                           # a synthetic repo, seconds

- recall: each fix of benchmarks/inference_commits_calls.toml as the reverse PR (base = the fix, head = its
  parent); caught = a finding at a file the fix touched.
- ordinary commits: the last ``--commits`` non-merge commits of each repo of that file and of ``--repo``,
  forward (base = parent). Each finding is looked up in benchmarks/inference_commits_judged.toml
  (``drift`` or ``noise``, read by a person).
- time: the check per commit against ``build_changeset`` (the diff every audit builds first) on the same
  commit in the same run: the ratio is what the check adds to that stage.

Only the call check runs, not the whole audit: benchmarks/inference_replay.py measures zero-config audits whole.
Repos come from the mirrors the search tool's fetch brings (/work/.mirror/OWNER+NAME/repo), cloned to --repos.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from checks.diff import build_changeset  # noqa: E402
from checks.infer import calls  # noqa: E402
from checks.model import Checkout  # noqa: E402

FIXES = ROOT / "benchmarks" / "inference_commits_calls.toml"
JUDGED = ROOT / "benchmarks" / "inference_commits_judged.toml"
MIRRORS = Path("/work/.mirror")
MORE = ["AutoGPTQ/AutoGPTQ", "ModelCloud/GPTQModel", "ModelTC/lightllm", "deepseek-ai/DeepGEMM", "GeeeekExplorer/nano-vllm",
        "fla-org/flash-linear-attention", "huggingface/optimum-quanto", "intel/auto-round", "linkedin/Liger-Kernel",
        "mit-han-lab/nunchaku", "pytorch/ao", "tile-ai/tilelang", "turboderp-org/exllamav2", "InternLM/lmdeploy",
        "bitsandbytes-foundation/bitsandbytes", "deepspeedai/DeepSpeed", "vllm-project/llm-compressor",
        "turboderp-org/exllamav3", "ROCm/aiter", "huggingface/text-generation-inference", "NVIDIA/TransformerEngine",
        "kvcache-ai/ktransformers"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def clone(name: str, into: Path) -> Path | None:
    dest = into / name.replace("/", "+")
    if dest.exists():
        return dest
    mirror = MIRRORS / name.replace("/", "+") / "repo"
    if not mirror.exists():
        return None
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "-c", "safe.directory=*", "clone", "-q", "--no-checkout", str(mirror), str(dest)], check=True)
    return dest


def run(repo: Path, base: str, head: str) -> tuple[list, float, float, list[str]]:
    """(findings, check seconds, diff seconds, files the change touches)."""
    co = Checkout(repo=str(repo), base_sha=base, head_sha=head, merge_base_sha=base)
    t0 = time.perf_counter()
    changes = build_changeset(co)
    t1 = time.perf_counter()
    found = calls.findings(str(repo), changes, base, head)
    return found, time.perf_counter() - t1, t1 - t0, [f.path for f in changes.files]


def report(recall: list, forward: list, judged: dict, n_commits: int) -> list[str]:
    lines = [f"# Call check replay, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC", ""]
    caught = sum(1 for r in recall if r["caught"])
    if recall:
        lines += [f"## Recall on fixes of calls left on an old signature: **{caught}/{len(recall)}**", "",
                  "| repo | fix | subject | caught | first finding |", "|---|---|---|---|---|"]
    for r in recall:
        lines.append(f"| {r['repo']} | {r['sha'][:10]} | {r['subject'][:60]} | {'yes' if r['caught'] else 'no'} | "
                     f"{r['first'][:160]} |")
    total = sum(f["commits"] for f in forward) or 1
    found = [(f, x) for f in forward for x in f["findings"]]
    verdicts = [judged.get((x["sha"][:12], x["fingerprint"]), {}).get("verdict", "UNJUDGED") for _, x in found]
    check = sum(f["check_s"] for f in forward)
    diff = sum(f["diff_s"] for f in forward)
    lines += ["", f"## Ordinary commits (last {n_commits} non-merge commits per repo, forward)", "",
              f"{total} commits, {len(found)} findings = {100 * len(found) / total:.2f} per 100: "
              f"{verdicts.count('drift')} judged drift, {verdicts.count('noise')} judged noise, "
              f"{verdicts.count('UNJUDGED')} unjudged. Time: the check {check:.1f} s in all against the diff stage's "
              f"{diff:.1f} s on the same commits (ratio {check / diff if diff else float('nan'):.2f}); worst commit "
              f"{max((f['worst_s'] for f in forward), default=0):.2f} s.", "",
              "| repo | HEAD | commits | findings | check s | diff s | check / diff | worst s |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for f in forward:
        ratio = f["check_s"] / f["diff_s"] if f["diff_s"] else float("nan")
        lines.append(f"| {f['repo']} | {f['head'][:12]} | {f['commits']} | {len(f['findings'])} | {f['check_s']:.1f} | "
                     f"{f['diff_s']:.1f} | {ratio:.2f} | {f['worst_s']:.2f} |")
    lines += ["", "| repo | commit | subject | finding | verdict | note |", "|---|---|---|---|---|---|"]
    for (f, x), v in zip(found, verdicts, strict=True):
        note = judged.get((x["sha"][:12], x["fingerprint"]), {}).get("note", "")
        lines.append(f"| {f['repo']} | {x['sha'][:10]} | {x['subject'][:50]} | {x['message'][:220]} | {v} | {note} |")
    return lines + [""]


def replay(repos_dir: Path, names: list[str], fixes: list[dict], n: int) -> tuple[list, list]:
    recall = []
    for fx in fixes:
        repo = clone(fx["repo"], repos_dir)
        if repo is None:
            print(f"section error: {fx['repo']} has no mirror; fetch github:{fx['repo']} first")
            continue
        sha = git(repo, "rev-parse", fx["sha"]).strip()
        found, _, _, files = run(repo, sha, git(repo, "rev-parse", f"{sha}^").strip())
        hit = [f for f in found if any(loc.path in files for loc in f.locations)]
        recall.append({"repo": fx["repo"], "sha": sha, "subject": fx["subject"], "caught": bool(hit),
                       "first": hit[0].message if hit else ""})
    forward = []
    for name in names:
        repo = clone(name, repos_dir)
        if repo is None:
            print(f"{name}: no mirror, skipped")
            continue
        row = {"repo": name, "head": git(repo, "rev-parse", "HEAD").strip(), "commits": 0, "findings": [],
               "check_s": 0.0, "diff_s": 0.0, "worst_s": 0.0}
        for line in git(repo, "log", "--no-merges", "--format=%H\t%P\t%s", "-n", str(n)).splitlines():
            sha, parents, subject = line.split("\t", 2)
            if not parents:
                continue
            found, check_s, diff_s, _ = run(repo, parents.split()[0], sha)
            row["commits"] += 1
            row["check_s"] += check_s
            row["diff_s"] += diff_s
            row["worst_s"] = max(row["worst_s"], check_s)
            row["findings"] += [{"sha": sha, "subject": subject, "fingerprint": f.fingerprint, "message": f.message}
                                for f in found]
        forward.append(row)
    return recall, forward


def smoke(out: Path | None) -> int:
    """A repo whose commit B adds a required parameter and leaves a caller behind, and whose commit C fixes the
    caller: B forward and C reversed must each give the finding."""
    from tests.gitrepo import GitRepo

    with tempfile.TemporaryDirectory() as tmp:
        r = GitRepo(Path(tmp) / "eng")
        use = "from pkg.ops import norm\n\n\ndef f(x, w):\n    return norm(x, w)\n"
        a = r.commit_files({"pkg/__init__.py": "", "pkg/ops.py": "def norm(x, w):\n    return x\n",
                            "pkg/use.py": use}, "a")
        b = r.commit_files({"pkg/ops.py": "def norm(x, w, eps):\n    return x\n"}, "a required eps")
        c = r.commit_files({"pkg/use.py": use.replace("norm(x, w)", "norm(x, w, 1e-6)")}, "the fix")
        repo = Path(r.path)
        found, check_s, diff_s, _ = run(repo, a, b)
        back, _, _, files = run(repo, c, b)
        recall = [{"repo": "smoke/eng", "sha": c, "subject": "the fix", "first": back[0].message if back else "",
                   "caught": any(loc.path in files for f in back for loc in f.locations)}]
        forward = [{"repo": "smoke/eng", "head": b, "commits": 1, "check_s": check_s, "diff_s": diff_s,
                    "worst_s": check_s, "findings": [{"sha": b, "subject": "a required eps", "fingerprint":
                                                      f.fingerprint, "message": f.message} for f in found]}]
        text = "\n".join(report(recall, forward, {}, 1))
        print(text)
        if len(found) != 1 or "needs `eps`" not in found[0].message or not recall[0]["caught"]:
            print("section error: the smoke repo's stale caller was not found")
            return 1
    if out:
        out.write_text(text)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a synthetic repo, in seconds")
    ap.add_argument("--repos", default="/tmp/call-fit-replay", help="where to clone the fetched mirrors")
    ap.add_argument("--commits", type=int, default=300, help="ordinary commits per repo, forward")
    ap.add_argument("--repo", action="append", default=[], metavar="OWNER/NAME", help="another repo, forward only")
    ap.add_argument("--only", action="store_true", help="replay the --repo repos alone, forward (no recall section)")
    ap.add_argument("--out", help="write the markdown here (default benchmarks/results/call_fit_replay_DATE.md)")
    args = ap.parse_args()
    if args.smoke:
        return smoke(Path(args.out) if args.out else None)
    data = tomllib.loads(FIXES.read_text())
    judged = {(j["sha"][:12], j["fingerprint"]): j for j in tomllib.loads(JUDGED.read_text()).get("judged", [])}
    names = args.repo if args.only else list(dict.fromkeys([*data.get("noise_repos", []), *MORE, *args.repo]))
    recall, forward = replay(Path(args.repos), names, [] if args.only else data["fix"], args.commits)
    text = "\n".join(report(recall, forward, judged, args.commits))
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"call_fit_replay_{dt.date.today()}.md"
    out.write_text(text)
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
