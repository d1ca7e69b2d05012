"""Replay histories through test selection: suite-minutes selected, and whether seeded breaks are still caught.

Two histories:

* this repository's own commits (each against its parent), with the suites
  proposed for its ``.github/drift-audit.toml`` (below) and estimated costs;
* a generated 200-commit history of a small DeepSeek-style engine (kernels,
  engine, runtime, shared helpers, tests), with seeded breaking commits, each
  followed by its fix. The tests there are real: every breaking commit is
  checked out and its whole test tree run once, so "the suite that catches
  it" is whatever actually fails, not what a selector predicts.

Selectors compared, with run-all (every suite on every runner) as the anchor:

* drift-audit: ``runner.select.select_tests`` (path globs, pillars, symbols,
  static import graph, run-all globs);
* path-prefix: a step runs when a changed path starts with one of its
  ``source_file_dependencies`` prefixes, the way vLLM's CI picks steps.

Run: ``python benchmarks/selection_replay.py [--commits 200] [--seed 7]``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from checks.config import parse_config  # noqa: E402
from checks.diff import build_changeset  # noqa: E402
from checks.model import AuditOptions, AuditRequest, Findings  # noqa: E402
from checks.pillars import map_pillars  # noqa: E402
from checks.workspace import Tree, checkout  # noqa: E402
from runner.select import _command_paths, _covers, select_tests  # noqa: E402
from tests.gitrepo import GitRepo  # noqa: E402

# --------------------------------------------------------------------------- this repository



def _own_toml() -> str:
    """The suites proposed for this repo: the toml block under docs/runners.md's last heading."""
    doc = ROOT / "docs" / "runners.md"
    if not doc.exists():
        return ""
    section = doc.read_text().split("## This repository's suites", 1)[-1]
    return section.split("```toml\n", 1)[1].split("```", 1)[0] if "```toml\n" in section else ""


OWN_TOML = _own_toml()

# Estimated minutes per run of each suite (CPU suites from this machine's timings, GPU ones from H200 runs).
OWN_COST = {
    "unit-spine": 1.0, "unit-checks": 1.5, "unit-bot": 1.5, "unit-runner": 1.0, "unit-engine": 2.0,
    "unit-kernels": 2.5, "parity-elementwise": 2.0, "parity-fp8": 2.0, "parity-mla": 2.0, "parity-moe": 2.0,
    "decode-tiny": 4.0,
}
# vLLM-style source_file_dependencies: directory prefixes per step.
OWN_PREFIXES = {
    "unit-spine": ["checks/", "bot/", "tests/spine/"],
    "unit-checks": ["checks/", "tests/checks/"],
    "unit-bot": ["bot/", "tests/bot/", "tests/ghstub/"],
    "unit-runner": ["runner/", "tests/runner/"],
    "unit-engine": ["engine/", "tests/engine/"],
    "unit-kernels": ["kernels/", "tests/kernels/"],
    "parity-elementwise": ["kernels/"],
    "parity-fp8": ["kernels/"],
    "parity-mla": ["kernels/"],
    "parity-moe": ["kernels/"],
    "decode-tiny": ["engine/", "kernels/"],
}

# --------------------------------------------------------------------------- the synthetic engine

SYN_TOML = '''
[[pillar]]
id = "weights"
title = "Weight pipeline"
paths = ["engine/loader.py", "common/fp8.py"]

[[pillar]]
id = "topology"
title = "Topology and KV cache"
paths = ["engine/**"]

[[pillar]]
id = "wiring"
title = "Kernel wiring"
paths = ["kernels/**"]

[[pillar]]
id = "runtime"
title = "Runtime"
paths = ["runtime/**"]
{suites}
[settings]
run_all = ["pyproject.toml"]
'''

OPS = ["rmsnorm", "rope", "silu_mul", "fp8_gemm", "mla_decode", "moe_route"]

MODULES = {
    "common/__init__.py": "",
    "common/fp8.py": "SCALE = {SCALE}\n\n\ndef quant(x):\n    return round(x / SCALE, 6)\n",
    "common/mathutil.py": "BASE = {BASE}\n\n\ndef inv_freq(d):\n    return [round(1.0 / BASE ** (i / d), 9) for i in range(0, d, 2)]\n",
    "kernels/__init__.py": "",
    "kernels/rmsnorm.py": "EPS = {EPS}\n\n\ndef rmsnorm(xs):\n    ms = sum(x * x for x in xs) / len(xs)\n    return [round(x / (ms + EPS) ** 0.5, 6) for x in xs]\n",
    "kernels/rope.py": "from common.mathutil import inv_freq\n\n\ndef rope(d):\n    return inv_freq(d)\n",
    "kernels/silu_mul.py": "import math\n\nCLAMP = {CLAMP}\n\n\ndef silu_mul(a, b):\n    a = min(a, CLAMP)\n    return round(a / (1 + math.exp(-a)) * b, 6)\n",
    "kernels/fp8_gemm.py": "from common.fp8 import quant\n\n\ndef fp8_gemm(xs, ws):\n    return round(sum(quant(x) * w for x, w in zip(xs, ws)), 6)\n",
    "kernels/mla_decode.py": "KV_LORA = {KV_LORA}\nROPE_DIM = 64\n\n\ndef cache_width():\n    return KV_LORA + ROPE_DIM\n",
    "kernels/moe_route.py": "TOPK = {TOPK}\n\n\ndef route(scores):\n    return sorted(range(len(scores)), key=lambda i: -scores[i])[:TOPK]\n",
    "engine/__init__.py": "",
    "engine/cache.py": "from kernels.mla_decode import cache_width\n\n\ndef bytes_per_token(layers):\n    return cache_width() * layers * 2\n",
    "engine/model.py": (
        "from engine.cache import bytes_per_token\nfrom kernels.rmsnorm import rmsnorm\nfrom kernels.rope import rope\n\n\n"
        "def forward(xs):\n    return rmsnorm(xs) + rope(4)\n\n\ndef footprint(layers):\n    return bytes_per_token(layers)\n"
    ),
    "engine/loader.py": "from common.fp8 import quant\n\n\ndef load(values):\n    return [quant(v) for v in values]\n",
    "runtime/__init__.py": "",
    "runtime/scheduler.py": (
        "from engine.model import footprint\n\nMAX_BATCH = {MAX_BATCH}\n\n\n"
        "def plan(n):\n    out = []\n    while n > 0:\n        out.append(min(n, MAX_BATCH))\n        n -= out[-1]\n    return out\n\n\n"
        "def kv_bytes(layers):\n    return footprint(layers)\n"
    ),
}
CONSTANTS = {"SCALE": "448.0", "BASE": "10000.0", "EPS": "1e-06", "CLAMP": "20.0", "KV_LORA": "512", "TOPK": "8",
             "MAX_BATCH": "64"}
BREAKS = {  # constant → (module, broken value)
    "SCALE": ("common/fp8.py", "240.0"),
    "BASE": ("common/mathutil.py", "50000.0"),
    "EPS": ("kernels/rmsnorm.py", "0.001"),
    "CLAMP": ("kernels/silu_mul.py", "0.5"),
    "KV_LORA": ("kernels/mla_decode.py", "256"),
    "TOPK": ("kernels/moe_route.py", "2"),
    "MAX_BATCH": ("runtime/scheduler.py", "32"),
}
# test file → (imports, calls whose values are pinned at generation time)
TESTS = {
    "tests/kernels/test_rmsnorm.py": ("from kernels.rmsnorm import rmsnorm", ["rmsnorm([1.0, 2.0, 3.0])"]),
    "tests/kernels/test_rope.py": ("from kernels.rope import rope", ["rope(8)"]),
    "tests/kernels/test_silu_mul.py": ("from kernels.silu_mul import silu_mul", ["silu_mul(1.5, 2.0)"]),
    "tests/kernels/test_fp8_gemm.py": ("from kernels.fp8_gemm import fp8_gemm", ["fp8_gemm([448.0, 224.0], [1.0, 2.0])"]),
    "tests/kernels/test_mla_decode.py": ("from kernels.mla_decode import cache_width", ["cache_width()"]),
    "tests/kernels/test_moe_route.py": ("from kernels.moe_route import route", ["route([0.1 * i for i in range(16)])"]),
    "tests/engine/test_model.py": ("from engine.model import forward, footprint", ["forward([1.0, 2.0])", "footprint(61)"]),
    "tests/engine/test_loader.py": ("from engine.loader import load", ["load([448.0, 896.0])"]),
    "tests/runtime/test_scheduler.py": ("from runtime.scheduler import plan, kv_bytes", ["plan(100)", "kv_bytes(2)"]),
}
SYN_COST = {**{f"parity-{op}": 3.0 for op in OPS}, "decode": 12.0, "engine-unit": 1.0, "runtime-unit": 1.0}
SYN_PREFIXES = {
    **{f"parity-{op}": [f"kernels/{op}.py", f"tests/kernels/test_{op}.py"] for op in OPS},
    "decode": ["engine/", "kernels/"],
    "engine-unit": ["engine/", "tests/engine/"],
    "runtime-unit": ["runtime/", "tests/runtime/"],
}


def syn_suites() -> str:
    out = []
    for op in OPS:
        out.append(f'[[suite]]\nid = "parity-{op}"\nkind = "parity"\ncommand = "python -m pytest -q tests/kernels/test_{op}.py"\n'
                   f'runners = ["sm90", "sm120"]\npaths = ["kernels/{op}.py"]\n')
    out.append('[[suite]]\nid = "decode"\nkind = "decode"\ncommand = "python -m pytest -q tests/engine/test_model.py"\n'
               'runners = ["sm90"]\npillars = ["topology", "weights"]\n')
    out.append('[[suite]]\nid = "engine-unit"\nkind = "unit"\ncommand = "python -m pytest -q tests/engine"\n'
               'runners = ["cpu"]\npaths = ["engine/**"]\n')
    out.append('[[suite]]\nid = "runtime-unit"\nkind = "unit"\ncommand = "python -m pytest -q tests/runtime"\n'
               'runners = ["cpu"]\npaths = ["runtime/**"]\n')
    return "\n".join(out)


def render_modules(consts: dict[str, str]) -> dict[str, str]:
    return {path: text.format(**consts) for path, text in MODULES.items()}


def pinned_tests(modules: dict[str, str]) -> dict[str, str]:
    """Test files asserting the values the healthy code returns (computed now, by running it)."""
    with tempfile.TemporaryDirectory() as tmp:
        for path, text in modules.items():
            Path(tmp, path).parent.mkdir(parents=True, exist_ok=True)
            Path(tmp, path).write_text(text)
        out = {}
        for test, (imports, calls) in TESTS.items():
            code = imports + "\nprint(repr([" + ", ".join(calls) + "]))\n"
            values = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True, check=True).stdout
            body = [imports, "", ""]
            for i, call in enumerate(calls):
                body += [f"def test_{i}():", f"    assert {call} == {values.strip()}[{i}]", "", ""]
            out[test] = "\n".join(body).rstrip() + "\n"
    return out


@dataclass
class Commit:
    sha: str
    kind: str  # benign / break / fix / base
    broken: str | None = None  # which constant a break changes


def generate(path: Path, n: int, seed: int) -> tuple[GitRepo, list[Commit]]:
    rng = random.Random(seed)
    repo = GitRepo(path)
    consts = dict(CONSTANTS)
    modules = render_modules(consts)
    base_files = {**modules, **pinned_tests(modules), ".github/drift-audit.toml": SYN_TOML.format(suites=syn_suites()),
                  "README.md": "# engine\n", "docs/design.md": "design\n", "pyproject.toml": "[project]\nname = 'engine'\n"}
    history = [Commit(repo.commit_files(base_files, "base"), "base")]
    edits = {path: 0 for path in modules if path.endswith(".py") and not path.endswith("__init__.py")}
    areas = [("docs", 0.2), ("kernels", 0.28), ("engine", 0.16), ("runtime", 0.08), ("common", 0.08), ("tests", 0.1),
             ("pyproject", 0.02), ("break", 0.08)]
    pending_fix: str | None = None
    while len(history) < n:
        if pending_fix:  # the fix lands in the next commit
            consts[pending_fix] = CONSTANTS[pending_fix]
            module = BREAKS[pending_fix][0]
            history.append(Commit(repo.commit_files({module: _with_edits(module, consts, edits)}, f"fix {pending_fix}"), "fix"))
            pending_fix = None
            continue
        area = rng.choices([a for a, _ in areas], [w for _, w in areas])[0]
        if area == "break":
            name = rng.choice(sorted(BREAKS))
            module, value = BREAKS[name]
            consts[name] = value
            history.append(Commit(repo.commit_files({module: _with_edits(module, consts, edits)}, f"tune {name}"), "break", name))
            pending_fix = name
            continue
        if area == "docs":
            files = {f"docs/note{rng.randrange(8)}.md": f"note {len(history)}\n"}
        elif area == "pyproject":
            files = {"pyproject.toml": f"[project]\nname = 'engine'\nversion = '0.{len(history)}'\n"}
        elif area == "tests":
            test = rng.choice(sorted(TESTS))
            text = (repo.path / test).read_text()
            files = {test: text + f"\n\ndef test_extra_{len(history)}():\n    assert True\n"}
        else:
            choices = [p for p in edits if p.startswith(area + "/")]
            module = rng.choice(choices)
            edits[module] += 1
            files = {module: _with_edits(module, consts, edits)}
        history.append(Commit(repo.commit_files(files, f"{area} change {len(history)}"), "benign"))
    return repo, history


def _with_edits(module: str, consts: dict[str, str], edits: dict[str, int]) -> str:
    """The module's text plus the benign helpers added so far (new functions nobody calls)."""
    text = MODULES[module].format(**consts)
    for i in range(edits.get(module, 0)):
        text += f"\n\ndef _helper_{i}():\n    return {i}\n"
    return text


def failing_tests(repo: GitRepo, sha: str, scratch: Path) -> set[str]:
    """Run the whole test tree at ``sha`` once; the test files with a failure."""
    repo.git("checkout", "-q", sha)
    junit = scratch / f"{sha[:12]}.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "tests"],
                   cwd=repo.path, capture_output=True, text=True, env={**os.environ, "PYTEST_ADDOPTS": ""})
    failed = set()
    for tc in ET.parse(junit).getroot().iter("testcase"):
        if tc.find("failure") is not None or tc.find("error") is not None:
            failed.add(tc.get("classname", "").replace(".", "/") + ".py")
    repo.git("checkout", "-q", "main")
    return failed


# --------------------------------------------------------------------------- replay


@dataclass
class Tally:
    commits: int = 0
    run_all: float = 0.0
    ours: float = 0.0
    prefix: float = 0.0
    breaks: int = 0
    caught_ours: int = 0
    caught_prefix: int = 0
    seconds: float = 0.0
    missed: list[str] = field(default_factory=list)


def _prefix_select(prefixes: dict[str, list[str]], paths: list[str]) -> set[str]:
    return {sid for sid, pre in prefixes.items() if any(p.startswith(x) for p in paths for x in pre)}


def replay(repo_path: str, commits: list[Commit], toml: str, cost: dict[str, float], prefixes: dict[str, list[str]],
           truth: dict[str, set[str]] | None = None) -> Tally:
    config = parse_config(toml, "replay config")
    runners = {s.id: s.runners for s in config.suites}
    all_minutes = sum(cost.get(s.id, 1.0) * len(s.runners) for s in config.suites)
    t = Tally()
    for c in commits:
        co = checkout(AuditRequest(repo=repo_path, base=c.sha + "~1", head=c.sha))
        start = time.perf_counter()
        changes = build_changeset(co)
        pillars = map_pillars(co, config, changes)
        plan = select_tests(config, changes, pillars, Findings(), AuditOptions(), Tree(co.repo, co.head_sha), "bench")
        t.seconds += time.perf_counter() - start
        picked = {s.id for s in plan.suites}
        by_prefix = _prefix_select(prefixes, [p for f in changes.files for p in (f.path, f.old_path) if p])
        t.commits += 1
        t.run_all += all_minutes
        t.ours += sum(cost.get(s.id, 1.0) for s in plan.suites)
        t.prefix += sum(cost.get(sid, 1.0) * len(runners[sid]) for sid in by_prefix)
        if truth is not None and c.kind == "break":
            catching = truth[c.sha]
            t.breaks += 1
            t.caught_ours += bool(catching) and catching <= picked
            t.caught_prefix += bool(catching) and catching <= by_prefix
            if not catching <= picked:
                t.missed.append(f"{c.sha[:10]} {c.broken}: needs {sorted(catching)}, picked {sorted(picked)}")
    return t


def suites_of(config_toml: str, test_files: set[str]) -> set[str]:
    config = parse_config(config_toml, "replay config")
    return {s.id for s in config.suites for f in test_files if _covers(_command_paths(s.command), f)}


def own_history(limit: int) -> list[Commit]:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--no-merges", f"--max-count={limit}", "HEAD"],
                         capture_output=True, text=True, check=True).stdout.split()
    roots = set(subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"],
                               capture_output=True, text=True, check=True).stdout.split())
    return [Commit(sha, "benign") for sha in reversed(out) if sha not in roots]


def row(name: str, t: Tally) -> str:
    ours = f"{t.ours:8.1f} ({t.ours / t.run_all:6.1%})"
    prefix = f"{t.prefix:8.1f} ({t.prefix / t.run_all:6.1%})"
    caught = f"{t.caught_ours}/{t.breaks}" if t.breaks else "-"
    caught_p = f"{t.caught_prefix}/{t.breaks}" if t.breaks else "-"
    per = f"{1000 * t.seconds / max(t.commits, 1):7.1f}"
    return f"| {name:<22} | {t.commits:7d} | {t.run_all:9.1f} | {ours} | {prefix} | {caught:>10} | {caught_p:>11} | {per} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=200, help="length of the synthetic history")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--own-limit", type=int, default=500, help="at most this many of this repo's commits")
    args = ap.parse_args(argv)

    rows = []
    if OWN_TOML:
        own = own_history(args.own_limit)
        rows.append(row("this repo", replay(str(ROOT), own, OWN_TOML, OWN_COST, OWN_PREFIXES)))
    else:
        print("docs/runners.md has no ```toml block with this repo's suites; skipping the own-history replay")

    scratch = Path(tempfile.mkdtemp(prefix="drift-audit-replay-"))
    try:
        t0 = time.perf_counter()
        repo, history = generate(scratch / "engine", args.commits, args.seed)
        gen_s = time.perf_counter() - t0
        toml = SYN_TOML.format(suites=syn_suites())
        truth = {c.sha: suites_of(toml, failing_tests(repo, c.sha, scratch)) for c in history if c.kind == "break"}
        syn = replay(str(repo.path), history[1:], toml, SYN_COST, SYN_PREFIXES, truth)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows.append(row(f"synthetic (seed {args.seed})", syn))

    print("Suite-minutes selected per history; anchor: run-all (every suite on every runner label), same run.")
    print(f"Synthetic history generated in {gen_s:.1f} s; {syn.breaks} seeded breaking commits, "
          f"ground truth from running the whole test tree at each.\n")
    print("| history                | commits | run-all min | drift-audit min (share) | path-prefix min (share) | "
          "breaks caught | prefix caught | ms/commit |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(r)
    if syn.missed:
        print("\nMissed by drift-audit:")
        for m in syn.missed:
            print("  " + m)
    return 0 if not syn.missed else 1


if __name__ == "__main__":
    sys.exit(main())
