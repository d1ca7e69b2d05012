"""Recall and noise of zero-config inference on real engine and kernel repos, replayed from their history.

    python benchmarks/inference_replay.py [--repos DIR] [--ordinary N] [--out FILE]
    python benchmarks/inference_replay.py --anchor-rev REV   # also replay this product at REV, same run
    python benchmarks/inference_replay.py --smoke

Sections (each one's failure makes the run exit non-zero):
- timings: inference over each repo's HEAD, cold (empty caches, fresh process) and warm (same cache dir,
  fresh process), against an anchor measured in the same run: reading every source blob of the tree
  with one ``git cat-file --batch`` (the I/O floor any tree-wide analysis pays).
- recall: each real historical commit that fixed cross-file drift (benchmarks/inference_commits.toml) is
  replayed as the reverse PR: base = the fixed tree, head = its buggy parent. Caught = a new finding whose
  locations or message name a file the fix touched. Two configs: zero config (inferred rules), and the
  config ``drift-audit init`` proposes from the fixed tree, unedited.
- noise: the last N ordinary commits of each repo replayed forward (base = parent) with zero config; every
  new inferred finding is looked up in benchmarks/inference_commits_judged.toml (read by a person: true
  drift or noise); co-change notes are counted apart (warnings that never fail).

Repos come from the mirrors the search tool's fetch brings (/work/.mirror/OWNER+NAME/repo), cloned to
--repos at run time; their code is never committed here. ``--smoke`` runs every section on the synthetic
persistent-kernel repo of checks/packs/sample.py in a few seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from checks.audit import run_checks  # noqa: E402
from checks.config import default_config, parse_config  # noqa: E402
from checks.diff import build_changeset  # noqa: E402
from checks.model import Checkout, Finding  # noqa: E402

COMMITS = ROOT / "benchmarks" / "inference_commits.toml"
JUDGED = ROOT / "benchmarks" / "inference_commits_judged.toml"
MIRRORS = Path("/work/.mirror")
TARGETS = {"recall": 0.5, "false_per_100": 2.0, "cold_s": 5.0, "warm_s": 0.3}


# --------------------------------------------------------------------------- repos


def clone(name: str, into: Path) -> Path:
    """A no-checkout clone of a fetched mirror (objects only; the audit reads git objects)."""
    dest = into / name.replace("/", "+")
    if (dest / ".git").is_dir() or (dest / "HEAD").is_file():
        return dest
    mirror = MIRRORS / name.replace("/", "+") / "repo"
    if not mirror.exists():
        raise SystemExit(f"{name}: no mirror at {mirror}; fetch github:{name} with the search tool first")
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "-c", "safe.directory=*", "clone", "-q", "--no-checkout", str(mirror), str(dest)], check=True)
    return dest


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def audit(repo: Path, base: str, head: str, config_text: str | None = None):
    """The checks stage with base as the merge base (a reverse PR's base is a descendant of its head)."""
    co = Checkout(repo=str(repo), base_sha=base, head_sha=head, merge_base_sha=base)
    config = parse_config(config_text) if config_text else default_config()
    return run_checks(co, config, build_changeset(co)), config


def touched(repo: Path, a: str, b: str) -> set[str]:
    return set(git(repo, "diff", "--name-only", a, b).split())


def relevant(f: Finding, files: set[str], reads: dict[str, list[str]]) -> bool:
    """The finding is about the fix: it points at a file the fix touched, or its rule reads one."""
    from checks.globs import matches

    if any(loc.path in files for loc in f.locations) or any(p in f.message for p in files):
        return True
    return any(matches(reads.get(f.rule, []), p) for p in files) if reads.get(f.rule) else False


def rule_reads(found_config) -> dict[str, list[str]]:
    facts = {x.id: x.files for x in found_config.facts}
    return {r.id: [g for fid in r.facts for g in facts.get(fid, [])] for r in found_config.rules}


# --------------------------------------------------------------------------- timings


TIMER = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from checks.infer import infer
from checks.workspace import Tree
from pathlib import Path
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
c0, t0 = cpu(), time.perf_counter()
out = infer(Tree({repo!r}, {sha!r}), cache_dir=Path({cache!r}), verify={verify!r})
print(json.dumps({{"s": time.perf_counter() - t0, "cpu": cpu() - c0, "rules": len(out.rules), "cached": out.cached,
                  **out.timings}}))
"""


def time_inference(repo: Path, cache: Path) -> dict:
    """Cold then warm, each a fresh process sharing only the cache dir: the audit's path (no separate
    verification: the audit's own base evaluation drops a rule that does not hold)."""
    sha = git(repo, "rev-parse", "HEAD").strip()
    env = {**os.environ, "DRIFT_AUDIT_CACHE": str(cache)}
    runs = []
    for _ in range(2):
        code = TIMER.format(root=str(ROOT), repo=str(repo), sha=sha, cache=str(cache), verify=False)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    from checks.infer.families import source_files
    from checks.workspace import Tree

    files = source_files(Tree(str(repo), sha))
    t0 = time.perf_counter()
    blobs = subprocess.run(["git", "cat-file", "--batch"], cwd=repo, input="\n".join(b for _, _, b in files).encode() + b"\n",
                           capture_output=True, check=True).stdout
    anchor = time.perf_counter() - t0
    return {"files": len(files), "bytes": len(blobs), "anchor": anchor, "cold": runs[0], "warm": runs[1],
            "load": os.getloadavg()[0]}


REVIEW = r"""
import json, resource, subprocess, sys, time
sys.path.insert(0, {root!r})
from checks.audit import run_checks
from checks.config import default_config
from checks.diff import build_changeset
from checks.model import Checkout
def cpu():
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
out = []
for _ in range(2):
    c0, t0 = cpu(), time.perf_counter()
    co = Checkout(repo={repo!r}, base_sha={base!r}, head_sha={head!r}, merge_base_sha={base!r})
    found = run_checks(co, default_config(), build_changeset(co))
    out.append({{"s": time.perf_counter() - t0, "cpu": cpu() - c0, "rules": len(found.rules_run),
                "new": len([f for f in found.with_status("new") if f.source == "inferred"])}})
print(json.dumps(out))
"""


def time_review(repo: Path, sha: str, tree: Path = ROOT) -> dict:
    """The zero-config checks stage of one commit (forward: base = its parent) in a fresh process with an empty
    cache: cold (inference mines base and head), then warm (the same audit again in that process)."""
    head = git(repo, "rev-parse", sha).strip()
    base = git(repo, "rev-parse", f"{head}^").strip()
    files = len(git(repo, "diff", "--name-only", base, head).split())
    with tempfile.TemporaryDirectory(prefix="infer-review-") as cache:
        env = {**os.environ, "DRIFT_AUDIT_CACHE": cache, "PYTHONPATH": str(tree)}
        code = REVIEW.format(root=str(tree), repo=str(repo), base=base, head=head)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                              cwd=tree)
    cold, warm = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"files": files, "cold": cold, "warm": warm, "load": os.getloadavg()[0]}


def review_lines(reviews: dict[str, dict], anchors: dict[str, dict], rev: str) -> list[str]:
    lines = ["## Review time of big PRs (zero-config checks stage, fresh process, empty cache; anchor = this product at "
             f"{rev or 'none'}, same run)", "",
             "| PR | files | anchor cold s | anchor cpu s | cold s | cold cpu s | warm s | rules | new inferred | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, t in reviews.items():
        a = anchors.get(name, {}).get("cold", {})
        lines.append(f"| {name} | {t['files']} | {a.get('s', float('nan')):.2f} | {a.get('cpu', float('nan')):.2f} | "
                     f"{t['cold']['s']:.2f} | {t['cold']['cpu']:.2f} | {t['warm']['s']:.2f} | {t['cold']['rules']} | "
                     f"{t['cold']['new']} | {t['load']:.1f} |")
    return lines + [""]


# --------------------------------------------------------------------------- recall and noise


@dataclass
class Replay:
    repo: str
    sha: str
    subject: str
    drift: str = ""  # what was out of step, as read from the fix (the data file)
    parsed: bool = True  # false: the fix is in files no grammar here reads
    zero: list[str] = field(default_factory=list)  # relevant new inferred findings, zero config
    init: list[str] = field(default_factory=list)  # relevant new findings, init's config
    error: str = ""


def recall(repos: dict[str, Path], fixes: list[dict], with_init: bool = True) -> list[Replay]:
    from checks.infer_cli import propose
    from checks.workspace import Tree

    out = []
    for fx in fixes:
        repo = repos[fx["repo"]]
        sha = git(repo, "rev-parse", fx["sha"]).strip()
        parent = git(repo, "rev-parse", f"{sha}^").strip()
        r = Replay(fx["repo"], sha, fx["subject"], fx.get("drift", ""), bool(fx.get("parsed", True)))
        try:
            files = touched(repo, parent, sha)
            found, _ = audit(repo, sha, parent)
            r.zero = [f.message for f in found.with_status("new") if f.source == "inferred" and relevant(f, files, {})]
            if with_init:
                text, _ = propose(Tree(str(repo), sha))
                found, config = audit(repo, sha, parent, text)
                reads = rule_reads(config)
                r.init = [f.message for f in found.with_status("new") if f.source == "declared" and relevant(f, files, reads)]
        except Exception as exc:  # one replay's failure is reported in the table, the others still run
            r.error = f"{type(exc).__name__}: {exc}"
        out.append(r)
    return out


@dataclass
class Forward:
    repo: str
    sha: str
    subject: str
    inferred: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)  # co-change warnings
    seconds: float = 0.0

    @property
    def cochange(self) -> int:
        return len(self.notes)


def ordinary(repo: Path, n: int, skip: set[str]) -> list[tuple[str, str]]:
    """The last ``n`` non-merge commits that change a source file, the drift fixes left out."""
    out = []
    for line in git(repo, "log", "--no-merges", "--format=%H\t%s", "-n", str(n * 4)).splitlines():
        sha, _, subject = line.partition("\t")
        if sha in skip:
            continue
        files = git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", sha).split()
        if any(f.endswith((".py", ".c", ".h", ".cpp", ".cc", ".cu", ".cuh", ".hpp")) for f in files) and len(files) <= 40:
            out.append((sha, subject))
        if len(out) == n:
            break
    return out


def noise(repos: dict[str, Path], n: int, skip: set[str]) -> list[Forward]:
    out = []
    for name, repo in repos.items():
        for sha, subject in ordinary(repo, n, skip):
            t0 = time.perf_counter()
            found, _ = audit(repo, git(repo, "rev-parse", f"{sha}^").strip(), sha)
            fw = Forward(name, sha, subject, seconds=time.perf_counter() - t0)
            fw.inferred = [f for f in found.with_status("new") if f.source == "inferred"]
            fw.notes = [f for f in found.findings if f.source == "cochange"]
            out.append(fw)
    return out


def _verdict(verdicts: dict, fw: Forward, f: Finding) -> str:
    return verdicts.get((fw.sha[:12], f.fingerprint), {}).get("verdict", "")


def judged() -> dict[tuple[str, str], dict]:
    if not JUDGED.is_file():
        return {}
    data = tomllib.loads(JUDGED.read_text())
    return {(j["sha"][:12], j["fingerprint"]): j for j in data.get("judged", [])}


# --------------------------------------------------------------------------- report


def report(repos, times, replays, forwards, verdicts, started) -> tuple[str, list[str]]:
    lines = [f"# Inference replay, {started:%Y-%m-%d %H:%M} UTC", ""]
    lines += ["Repos: " + ", ".join(f"{n} ({git(p, 'rev-parse', 'HEAD')[:12]})" for n, p in repos.items()), ""]
    problems: list[str] = []
    lines += ["## Timings (inference over HEAD; fresh process each; anchor = one git cat-file --batch of every source blob)",
              "", f"Targets: cold ≤ {TARGETS['cold_s']} s on a 2,000-file repo, warm ≤ {TARGETS['warm_s']} s. "
              "cpu = user+sys of the process and its parse workers; load = the box's 1-minute load average "
              "(the 2-core box is shared, so wall time includes waiting for a core).", "",
              "| repo | source files | MB | anchor s | cold s | cold cpu s | cold/anchor | warm s | warm/anchor | rules | load |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, t in times.items():
        a = t["anchor"] or 1e-9
        lines.append(f"| {name} | {t['files']} | {t['bytes'] / 1e6:.1f} | {t['anchor']:.3f} | {t['cold']['s']:.2f} | "
                     f"{t['cold'].get('cpu', 0):.2f} | {t['cold']['s'] / a:.0f}x | {t['warm']['s']:.3f} | "
                     f"{t['warm']['s'] / a:.1f}x | {t['cold']['rules']} | {t.get('load', 0):.1f} |")
    lines.append("")
    if replays:
        zero = sum(1 for r in replays if r.zero)
        init = sum(1 for r in replays if r.init)
        n = len(replays)
        lines += ["## Recall on real cross-file drift fixes (reverse PR: base = fix, head = its parent)", "",
                  f"zero config: **{zero}/{n} = {zero / n:.0%}** (target ≥ {TARGETS['recall']:.0%}); "
                  f"`drift-audit init` config unedited: **{init}/{n} = {init / n:.0%}**", "",
                  "| repo | fix | subject | what drifted | zero config | init config |", "|---|---|---|---|---|---|"]
        for r in replays:
            z = "caught" if r.zero else ("error: " + r.error if r.error else "missed")
            i = "caught" if r.init else ("—" if r.error else "missed")
            drift = r.drift + ("" if r.parsed else " (file type not parsed)")
            lines.append(f"| {r.repo} | {r.sha[:10]} | {r.subject[:70]} | {drift} | {z} | {i} |")
        lines += ["", "Caught findings (first per fix):", ""]
        lines += [f"- {r.sha[:10]}: {(r.zero or r.init)[0][:300]}" for r in replays if r.zero or r.init]
        lines.append("")
        problems += [f"recall replay {r.sha[:10]}: {r.error}" for r in replays if r.error]
    if forwards:
        total = len(forwards)
        found = [(fw, f) for fw in forwards for f in fw.inferred]
        false = [(fw, f) for fw, f in found if verdicts.get((fw.sha[:12], f.fingerprint), {}).get("verdict") == "noise"]
        true = [(fw, f) for fw, f in found if verdicts.get((fw.sha[:12], f.fingerprint), {}).get("verdict") == "drift"]
        unjudged = [(fw, f) for fw, f in found if (fw.sha[:12], f.fingerprint) not in verdicts]
        co = sum(fw.cochange for fw in forwards)
        per = {name: sum(1 for fw in forwards if fw.repo == name) for name in repos}
        lines += ["## Noise on ordinary commits (forward: base = parent, zero config)", "",
                  "Commits replayed: " + ", ".join(f"{k} {v}" for k, v in per.items()) + f" (total {total})", "",
                  f"new inferred findings: {len(found)} = {100 * len(found) / total:.1f} per 100 commits; "
                  f"judged noise: **{len(false)} = {100 * len(false) / total:.1f} per 100** "
                  f"(target ≤ {TARGETS['false_per_100']:.0f}); judged true drift: {len(true)}; unjudged: {len(unjudged)}",
                  "",
                  f"co-change notes (warnings, never failing): {co} = {100 * co / total:.1f} per 100 commits; "
                  f"judged noise: {sum(1 for fw in forwards for f in fw.notes if _verdict(verdicts, fw, f) == 'noise')}, "
                  f"judged a real missed change: "
                  f"{sum(1 for fw in forwards for f in fw.notes if _verdict(verdicts, fw, f) == 'drift')} "
                  "(table below)", "",
                  f"median audit time per commit: {sorted(fw.seconds for fw in forwards)[total // 2]:.2f} s", "",
                  "| repo | commit | subject | finding | verdict | note |", "|---|---|---|---|---|---|"]
        for fw, f in found:
            v = verdicts.get((fw.sha[:12], f.fingerprint), {})
            lines.append(f"| {fw.repo} | {fw.sha[:10]} | {fw.subject[:50]} | {f.message[:160]} | "
                         f"{v.get('verdict', 'UNJUDGED')} | {v.get('note', '')} |")
        lines += ["", "Co-change notes:", "", "| repo | commit | subject | note | verdict | why |", "|---|---|---|---|---|---|"]
        for fw in forwards:
            for f in fw.notes:
                v = verdicts.get((fw.sha[:12], f.fingerprint), {})
                lines.append(f"| {fw.repo} | {fw.sha[:10]} | {fw.subject[:50]} | {f.message[:160]} | "
                             f"{v.get('verdict', 'UNJUDGED')} | {v.get('note', '')} |")
                if not v:
                    print(f"UNJUDGED-NOTE {fw.repo} {fw.sha[:12]} {f.fingerprint} {f.message[:200]}", file=sys.stderr)
        lines += ["", "Commits replayed:", ""]
        lines += [f"- {fw.repo} {fw.sha[:10]} {fw.subject[:80]}" for fw in forwards]
        lines.append("")
        for fw, f in unjudged:
            print(f"UNJUDGED {fw.repo} {fw.sha[:12]} {f.fingerprint} {f.message[:200]}", file=sys.stderr)
    return "\n".join(lines) + "\n", problems


# --------------------------------------------------------------------------- anchor: an earlier revision, same run


@dataclass
class Anchor:
    """The same replay by this product at an earlier revision, run inside this run (same repos, same box)."""

    rev: str
    zero: dict[str, bool] = field(default_factory=dict)  # fix sha[:10] → caught with zero config
    noise: int = 0  # new inferred findings judged noise
    found: int = 0  # new inferred findings
    commits: int = 0
    error: str = ""


_ROW = re.compile(r"^\| [^|]+ \| ([0-9a-f]{10}) \| .* \| (caught|missed|error[^|]*) \| [^|]* \|$")
_NOISE = re.compile(r"new inferred findings: (\d+) = [\d.]+ per 100 commits; judged noise: \*\*(\d+) = ")
_TOTAL = re.compile(r"Commits replayed: .*\(total (\d+)\)")


def anchor_run(rev: str, repos_dir: Path, ordinary_n: int, with_init: bool, noise_repos: list[str] | None = None,
               commits: Path = COMMITS) -> Anchor:
    """Recall and noise of revision ``rev`` of this product: its tree (``git archive``, read-only for this
    checkout) runs its own replay script in a subprocess with a cache of its own, on this run's commit lists
    (the data files are copied in), so before and after are measured on the same commits."""
    out = Anchor(rev)
    with tempfile.TemporaryDirectory(prefix="infer-anchor-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for data, name in ((commits, COMMITS.name), (JUDGED, JUDGED.name)):
            if data.is_file():
                (tree / "benchmarks" / name).write_text(data.read_text())
        result = Path(tmp) / "anchor.md"
        args = [sys.executable, str(tree / "benchmarks" / "inference_replay.py"), "--repos", str(repos_dir),
                "--ordinary", str(ordinary_n), "--skip", "timings", "--out", str(result)]
        for name in noise_repos or []:
            args += ["--noise-repo", name]
        if not with_init:
            args += ["--skip", "init"]
        env = {**os.environ, "DRIFT_AUDIT_CACHE": str(Path(tmp) / "cache"), "PYTHONPATH": str(tree)}
        proc = subprocess.run(args, cwd=tree, capture_output=True, text=True, env=env)
        if proc.returncode != 0 or not result.is_file():
            out.error = f"anchor {rev} exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
            return out
        return parse_anchor(rev, result.read_text())


def parse_anchor(rev: str, text: str) -> Anchor:
    """Per-fix verdicts and noise counts from a report this script wrote (at any revision since 2026-12-01)."""
    out = Anchor(rev)
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            out.zero[m.group(1)] = m.group(2) == "caught"
    m = _NOISE.search(text)
    t = _TOTAL.search(text)
    if m is None or t is None or not out.zero:
        out.error = f"anchor {rev}: its report has no recall table or noise line"
        return out
    out.found, out.noise, out.commits = int(m.group(1)), int(m.group(2)), int(t.group(1))
    return out


def anchor_lines(anchor: Anchor, replays: list[Replay], forwards: list[Forward], verdicts: dict) -> list[str]:
    """Before (the anchor revision) and after (this tree), measured in this run."""
    if anchor.error:
        return ["## Before / after", "", f"anchor failed: {anchor.error}", ""]
    n = len(replays)
    now = sum(1 for r in replays if r.zero)
    then = sum(1 for r in replays if anchor.zero.get(r.sha[:10]))
    found = sum(len(fw.inferred) for fw in forwards)
    false = sum(1 for fw in forwards for f in fw.inferred if _verdict(verdicts, fw, f) == "noise")
    total = len(forwards) or 1
    lines = [f"## Before / after (anchor = this product at {anchor.rev}, replayed inside this run)", "",
             "| measure | anchor | this tree | ratio |", "|---|---:|---:|---:|",
             f"| zero-config recall | {then}/{n} = {then / n:.0%} | {now}/{n} = {now / n:.0%} | "
             + (f"{now / then:.2f}x |" if then else "— (anchor caught none) |"),
             f"| new inferred findings / 100 ordinary commits | {100 * anchor.found / (anchor.commits or 1):.1f} | "
             f"{100 * found / total:.1f} | — |",
             f"| judged false / 100 ordinary commits | {100 * anchor.noise / (anchor.commits or 1):.1f} | "
             f"{100 * false / total:.1f} | — |", ""]
    changed = [r for r in replays if bool(r.zero) != anchor.zero.get(r.sha[:10], False)]
    lines += [f"- {r.sha[:10]} {r.subject[:70]}: {'missed → caught' if r.zero else 'caught → missed'}" for r in changed]
    return lines + [""]


# --------------------------------------------------------------------------- smoke


def smoke() -> int:
    """Every section on the synthetic persistent-kernel repo (seeded drifts as the fixes)."""
    from checks.packs import sample as shape

    started = dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DRIFT_AUDIT_CACHE"] = str(Path(tmp) / "cache")
        repo = shape.init_repo(Path(tmp) / "engine")
        files = shape.base_files()
        base = shape.commit(repo, files, "Engine with five tasks")
        fixes = []
        for kind in ("missing-name-map-entry", "shard-tables-differ"):
            shape.git(repo, "checkout", "-q", "--detach", base)
            buggy = shape.commit(repo, shape.DRIFTS[kind][1](files), f"Seed {kind}")
            fixed = shape.commit(repo, files, f"Fix {kind}")
            fixes.append({"repo": "synthetic/engine", "sha": fixed, "subject": f"Fix {kind}", "buggy": buggy})
        shape.git(repo, "checkout", "-q", "main")
        shape.commit(repo, shape.clean_change(files), "Add the topk_softmax task")
        repos = {"synthetic/engine": repo}
        times = {"synthetic/engine": time_inference(repo, Path(tmp) / "timing-cache")}
        replays = recall(repos, fixes)
        forwards = noise(repos, 2, {f["sha"] for f in fixes})
        text, problems = report(repos, times, replays, forwards, judged(), started)
        print(text)
        if sum(1 for r in replays if r.zero) < 1:
            problems.append("smoke: zero-config inference caught none of the seeded drifts")
        if any(fw.inferred for fw in forwards):
            problems.append("smoke: a clean change gave an inferred finding")
        parsed = parse_anchor("smoke", text)  # the before/after section reads reports like this one
        if parsed.error or parsed.zero != {r.sha[:10]: bool(r.zero) for r in replays}:
            problems.append(f"smoke: the anchor parser misread this run's report: {parsed.error or parsed.zero}")
        print("\n".join(anchor_lines(parsed, replays, forwards, judged())))
    for p in problems:
        print(f"ERROR {p}", file=sys.stderr)
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="every section on a synthetic repo, in seconds")
    ap.add_argument("--repos", default="/tmp/inference-replay", help="where to clone the fetched mirrors")
    ap.add_argument("--ordinary", type=int, default=35, help="ordinary commits per repo to replay forward")
    ap.add_argument("--timing", action="append", help="extra repo (OWNER/NAME) timed only, e.g. a 2,000-file one")
    ap.add_argument("--skip", action="append", default=[], help="section to leave out: timings, recall, init, noise")
    ap.add_argument("--more", action="store_true", help="also replay the data file's more_noise_repos forward")
    ap.add_argument("--noise-repo", action="append", metavar="OWNER/NAME",
                    help="replay these repos forward instead of the data file's noise_repos")
    ap.add_argument("--out", help="write the markdown table here (default benchmarks/results/inference_replay_DATE.md)")
    ap.add_argument("--fix-repo", action="append", metavar="OWNER/NAME",
                    help="replay only the fixes of these repos (a quick look at new corpus entries)")
    ap.add_argument("--review", action="append", metavar="OWNER/NAME@SHA",
                    help="time the zero-config checks stage of this commit (a big PR), and of the anchor revision")
    ap.add_argument("--commits", metavar="FILE", default=str(COMMITS),
                    help="the fixes (and noise repos) to replay: default the corpus; e.g. a held-out set "
                         "(benchmarks/inference_commits_heldout.toml)")
    ap.add_argument("--anchor-rev", metavar="REV",
                    help="also replay this product at an earlier git revision in this run and report before/after")
    args = ap.parse_args()
    if args.smoke:
        return smoke()
    started = dt.datetime.now(dt.UTC)
    commits = Path(args.commits)
    data = tomllib.loads(commits.read_text())
    fixes = [f for f in data["fix"] if not args.fix_repo or f["repo"] in args.fix_repo]
    noise_names = args.noise_repo or data.get("noise_repos", []) + (data.get("more_noise_repos", []) if args.more else [])
    names = sorted({f["repo"] for f in fixes} | set(noise_names)) if "recall" not in args.skip else sorted(
        set(noise_names))
    root = Path(args.repos)
    repos = {n: clone(n, root) for n in names}
    os.environ.setdefault("DRIFT_AUDIT_CACHE", str(root / "cache"))
    times = {}
    if "timings" not in args.skip:
        for n in [*names, *(args.timing or [])]:
            times[n] = time_inference(clone(n, root), Path(tempfile.mkdtemp(prefix="infer-timing-")))
    replays = recall(repos, fixes, with_init="init" not in args.skip) if "recall" not in args.skip else []
    skip = set()
    for f in fixes:
        if f["repo"] in repos:
            skip.add(git(repos[f["repo"]], "rev-parse", f["sha"]).strip())
    noise_repos = {n: repos[n] for n in noise_names}
    forwards = noise(noise_repos, args.ordinary, skip) if "noise" not in args.skip else []
    verdicts = judged()
    text, problems = report(repos, times, replays, forwards, verdicts, started)
    if args.anchor_rev and replays and forwards:
        anchor = anchor_run(args.anchor_rev, root, args.ordinary, with_init="init" not in args.skip,
                            noise_repos=noise_names, commits=commits)
        head, _, rest = text.partition("\n## ")
        text = head + "\n" + "\n".join(anchor_lines(anchor, replays, forwards, verdicts)) + "\n## " + rest
        problems += [anchor.error] if anchor.error else []
    if args.review:
        reviews, anchors = {}, {}
        with tempfile.TemporaryDirectory(prefix="infer-review-tree-") as tmp:
            if args.anchor_rev:
                archive = subprocess.run(["git", "archive", args.anchor_rev], cwd=ROOT, capture_output=True,
                                         check=True).stdout
                subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            for spec in args.review:
                name, _, sha = spec.partition("@")
                repo = clone(name, root)
                if args.anchor_rev:
                    anchors[spec] = time_review(repo, sha, Path(tmp))
                reviews[spec] = time_review(repo, sha)
        head, _, rest = text.partition("\n## ")
        text = head + "\n" + "\n".join(review_lines(reviews, anchors, args.anchor_rev or "")) + "\n## " + rest
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"inference_replay_{started:%Y-%m-%d}.md"
    out.write_text(text)
    print(text)
    print(f"wrote {out}", file=sys.stderr)
    for p in problems:
        print(f"ERROR {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
