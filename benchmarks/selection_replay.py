"""Replay histories through test selection: how precise it is, what it costs, and whether breaks are caught.

Two histories, each commit against its parent:

* this repository's own commits, with the suites of its ``.github/drift-audit.toml``
  at HEAD and estimated costs;
* a generated history of a small DeepSeek-style engine (kernels, engine,
  runtime, shared helpers, tests) with seeded breaking commits (each followed
  by its fix), helpers added and deleted again, docs, tests and packaging edits.

Selectors, with run-all (every suite on every runner) as the anchor:

* names: ``runner.select.select_tests`` as shipped (path globs, pillars,
  symbols, run-all globs, the import graph followed name by name, inert changes
  select nothing);
* modules: the same with ``symbol_selection`` off: every importer of a
  changed module is affected (the selector before name-level impact);
* path-prefix: a step runs when a changed path starts with one of its
  ``source_file_dependencies`` prefixes, the way vLLM's CI picks steps.

Ground truth ("the suites whose tests exercise the change"):

* synthetic history: measured. Every commit's test files run once each, in a
  forked child under a line tracer; a suite exercises a commit when one of its
  test files executes an added line at the commit or a removed line at the
  parent (blank, comment and ``def``/``class`` header lines do not count: a new
  function nobody calls is defined, never run). Failing test files give the
  suites that catch each seeded break.
* this repository: running every test file per commit under a tracer would
  take hours, so the reference is static: a suite is "reached" when one of its
  test files imports a changed module (transitively, conftest.py included), a
  non-Python changed path matches its globs, or a run-all glob matched. A test
  cannot exercise a module it never imports, so precision against this
  reference is an upper bound on true precision; the synthetic history checks
  the name-level selector's recall against measured coverage.

Run: ``python benchmarks/selection_replay.py [--commits 200] [--seed 7] [--own-limit 500] [--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from checks.config import CONFIG_PATH, Config, parse_config  # noqa: E402
from checks.diff import build_changeset  # noqa: E402
from checks.model import AuditOptions, AuditRequest, ChangeSet, Findings  # noqa: E402
from checks.pillars import map_pillars  # noqa: E402
from checks.workspace import Tree, checkout  # noqa: E402
from runner.imports import ImportGraph  # noqa: E402
from runner.select import _command_paths, _covers, first_match, select_tests, spec  # noqa: E402
from tests.gitrepo import GitRepo  # noqa: E402

# --------------------------------------------------------------------------- this repository


def own_toml() -> str:
    """This repo's config at HEAD (the one its own reviews use)."""
    out = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{CONFIG_PATH}"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else ""


# Estimated minutes per run of each suite (CPU suites from this machine's timings, GPU ones from H200 runs).
OWN_COST = {
    "unit-spine": 1.0, "unit-checks": 1.5, "unit-bot": 1.5, "unit-runner": 1.5, "unit-engine": 2.0,
    "unit-kernels": 2.5, "parity-elementwise": 2.0, "parity-fp8": 2.0, "parity-mla": 2.0, "parity-moe": 2.0,
    "decode-tiny": 4.0, "parity-hf-engine": 1.5, "unit-selection": 0.5, "unit-cli": 1.0, "unit-report": 0.5,
}
# vLLM-style source_file_dependencies: directory prefixes per step.
OWN_PREFIXES = {
    "unit-spine": ["checks/", "bot/", "tests/spine/"],
    "unit-checks": ["checks/", "tests/checks/"],
    "unit-bot": ["bot/", "tests/bot/", "tests/ghstub/"],
    "unit-runner": ["runner/", "tests/runner/"],
    "unit-selection": ["runner/", "tests/selection/"],
    "unit-engine": ["engine/", "tests/engine/"],
    "unit-kernels": ["kernels/", "tests/kernels/"],
    "parity-elementwise": ["kernels/"],
    "parity-fp8": ["kernels/"],
    "parity-mla": ["kernels/"],
    "parity-moe": ["kernels/"],
    "decode-tiny": ["engine/", "kernels/"],
    "parity-hf-engine": ["engine/"],
    "unit-cli": ["bot/", "runner/", "tests/cli/"],
    "unit-report": ["runner/report/", "tests/report/"],
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
    areas = [("docs", 0.14), ("kernels", 0.28), ("engine", 0.16), ("runtime", 0.08), ("common", 0.08), ("tests", 0.1),
             ("pyproject", 0.02), ("break", 0.08), ("cleanup", 0.06)]
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
        elif area == "cleanup":  # delete the newest helper nobody calls: a deletion-only commit
            grown = [p for p, n in edits.items() if n]
            if not grown:
                continue
            module = rng.choice(sorted(grown))
            edits[module] -= 1
            files = {module: _with_edits(module, consts, edits)}
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



# --------------------------------------------------------------------------- measured ground truth

TRACER = r"""
import importlib.util, json, os, sys, traceback
repo, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, repo)
sys.dont_write_bytecode = True
results = {}
for rel in sys.argv[3:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        hits, failed = {}, False
        prefix = repo.rstrip("/") + "/"
        def tracer(frame, event, arg):
            f = frame.f_code.co_filename
            if not f.startswith(prefix):
                return None
            key = f[len(prefix):]
            if event in ("line", "call"):
                hits.setdefault(key, set()).add(frame.f_lineno)
            return tracer
        sys.settrace(tracer)
        try:
            spec = importlib.util.spec_from_file_location("t_" + rel.replace("/", "_")[:-3], os.path.join(repo, rel))
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            for name in sorted(vars(mod)):
                if name.startswith("test_") and callable(getattr(mod, name)):
                    try:
                        getattr(mod, name)()
                    except Exception:
                        failed = True
        except Exception:
            failed = True
        sys.settrace(None)
        os.write(w, json.dumps({"failed": failed, "lines": {k: sorted(v) for k, v in hits.items()}}).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        got = os.read(r, 1 << 16)
        if not got:
            break
        chunks.append(got)
    os.close(r)
    os.waitpid(pid, 0)
    results[rel] = json.loads(b"".join(chunks) or b"{}")
json.dump(results, open(out, "w"))
"""


def trace_tests(repo: GitRepo, sha: str, scratch: Path) -> dict[str, dict]:
    """Run every test file at ``sha`` once, each in a forked child under a line tracer."""
    repo.git("checkout", "-q", sha)
    tests = sorted(str(p.relative_to(repo.path)) for p in (repo.path / "tests").rglob("test_*.py"))
    out = scratch / f"{sha[:12]}.json"
    script = scratch / "trace_tests.py"
    if not script.exists():
        script.write_text(TRACER)
    subprocess.run([sys.executable, str(script), str(repo.path), str(out), *tests], check=True,
                   capture_output=True, text=True)
    repo.git("checkout", "-q", "main")
    return json.loads(out.read_text())


def _meaningful(text: list[str], lines: list[int]) -> set[int]:
    keep = set()
    for n in lines:
        line = text[n - 1].strip() if 0 < n <= len(text) else ""
        if line and not line.startswith(("#", "def ", "async def ", "class ", "@")):
            keep.add(n)
    return keep


def exercised(repo: GitRepo, changes: ChangeSet, head_trace: dict[str, dict], base_trace: dict[str, dict]) -> set[str]:
    """Test files that executed an added line at head, or a removed line at the parent."""
    out: set[str] = set()
    for f in changes.files:
        if not f.path.endswith(".py"):
            continue
        for side, trace, rev, pick in (("head", head_trace, changes.head_sha, "added"),
                                       ("base", base_trace, changes.base_sha, "removed")):
            path = f.path if side == "head" else (f.old_path or f.path)
            lines = [n for h in f.hunks for n in getattr(h, pick)]
            if not lines:
                continue
            shown = subprocess.run(["git", "-C", str(repo.path), "show", f"{rev}:{path}"], capture_output=True,
                                   text=True)
            wanted = _meaningful(shown.stdout.splitlines(), lines)
            for test, got in trace.items():
                if wanted & set(got.get("lines", {}).get(path, [])):
                    out.add(test)
    return out


# --------------------------------------------------------------------------- replay


@dataclass
class Tally:
    commits: int = 0
    run_all: float = 0.0
    minutes: float = 0.0
    selected: int = 0  # (commit, suite) pairs selected
    truth: int = 0  # (commit, suite) pairs in the ground truth
    hit: int = 0  # pairs in both
    breaks: int = 0
    caught: int = 0
    seconds: float = 0.0
    missed: list[str] = field(default_factory=list)  # seeded breaks not caught
    unselected: list[str] = field(default_factory=list)  # ground-truth pairs not selected

    def add(self, picked: set[str], truth: set[str], minutes: float, commit: str = "") -> None:
        self.selected += len(picked)
        self.truth += len(truth)
        self.hit += len(picked & truth)
        self.minutes += minutes
        if truth - picked:
            self.unselected.append(f"{commit}: {sorted(truth - picked)}")

    @property
    def precision(self) -> float:
        return self.hit / self.selected if self.selected else 1.0

    @property
    def recall(self) -> float:
        return self.hit / self.truth if self.truth else 1.0


def _prefix_select(prefixes: dict[str, list[str]], paths: list[str]) -> set[str]:
    return {sid for sid, pre in prefixes.items() if any(p.startswith(x) for p in paths for x in pre)}


def _config(toml: str, by_name: bool) -> Config:
    config = parse_config(toml, "replay config")
    setattr(config.settings, "symbol_selection", by_name)  # noqa: B010  # the switch select_tests reads
    return config


def reference(config: Config, changes: ChangeSet, head: Tree) -> set[str]:
    """Suites a change reaches at module granularity (the static reference, see the module docstring)."""
    paths = [p for f in changes.files for p in (f.path, f.old_path) if p]
    if any(first_match(config.settings.run_all, p) for p in paths) or CONFIG_PATH in paths:
        return {s.id for s in config.suites}
    changed_py = {p for p in paths if p.endswith(".py")}
    head_paths = set(head.paths())
    gone = [p for p in changed_py if p not in head_paths]
    graph = ImportGraph(paths=head_paths, read=head.read, extra_paths=gone, blob_sha=head.blob_sha)
    tests = spec(tuple(config.settings.test_paths))
    test_files = sorted(p for p in head_paths if p.endswith(".py") and tests.match_file(p))
    out = set()
    for s in config.suites:
        cmd = _command_paths(s.command)
        mine = [t for t in test_files if _covers(cmd, t)]
        if any(first_match(s.paths, p) for p in paths if not p.endswith(".py")) if s.paths else False:
            out.add(s.id)
        elif not mine and s.paths and any(first_match(s.paths, p) for p in changed_py):
            out.add(s.id)  # no test files to follow (a harness command): its globs are all there is
        elif changed_py and any(graph.chain_to(t, changed_py) is not None for t in mine):
            out.add(s.id)
    owned = [_command_paths(s.command) for s in config.suites]
    for t in test_files:  # test files no declared suite runs become suites of their own, pytest:<path>
        if changed_py and not any(_covers(cmd, t) for cmd in owned) and graph.chain_to(t, changed_py) is not None:
            out.add(f"pytest:{t}")
    return out


def plan_ids(config: Config, co, changes: ChangeSet, head: Tree) -> tuple[set[str], float, float]:
    start = time.perf_counter()
    pillars = map_pillars(co, config, changes)
    plan = select_tests(config, changes, pillars, Findings(), AuditOptions(), head, "bench")
    return {s.id for s in plan.suites}, sum(OWN_COST.get(s.id, 1.0) for s in plan.suites), time.perf_counter() - start


def replay_own(limit: int) -> dict[str, Tally]:
    toml = own_toml()
    configs = {"names": _config(toml, True), "modules": _config(toml, False)}
    base_config = configs["names"]
    runners = {s.id: s.runners for s in base_config.suites}
    all_minutes = sum(OWN_COST.get(s.id, 1.0) * len(s.runners) for s in base_config.suites)
    tallies = {k: Tally() for k in ("names", "modules", "path-prefix")}
    for sha in own_history(limit):
        co = checkout(AuditRequest(repo=str(ROOT), base=sha + "~1", head=sha))
        changes = build_changeset(co)
        head = Tree(co.repo, co.head_sha)
        truth = reference(base_config, changes, head)
        for name, config in configs.items():
            picked, minutes, secs = plan_ids(config, co, changes, head)
            t = tallies[name]
            t.add(picked, truth, minutes, sha[:10])
            t.seconds += secs
        paths = [p for f in changes.files for p in (f.path, f.old_path) if p]
        by_prefix = _prefix_select(OWN_PREFIXES, paths) & set(runners)
        tallies["path-prefix"].add(by_prefix, truth, sum(OWN_COST.get(s, 1.0) * len(runners[s]) for s in by_prefix))
        for t in tallies.values():
            t.commits += 1
            t.run_all += all_minutes
    return tallies


def suites_of(config: Config, test_files: set[str]) -> set[str]:
    return {s.id for s in config.suites for f in test_files if _covers(_command_paths(s.command), f)}


def replay_synthetic(n: int, seed: int, scratch: Path) -> tuple[dict[str, Tally], float]:
    t0 = time.perf_counter()
    repo, history = generate(scratch / "engine", n, seed)
    gen_s = time.perf_counter() - t0
    toml = SYN_TOML.format(suites=syn_suites())
    configs = {"names": _config(toml, True), "modules": _config(toml, False)}
    runners = {s.id: s.runners for s in configs["names"].suites}
    all_minutes = sum(SYN_COST.get(s.id, 1.0) * len(s.runners) for s in configs["names"].suites)
    tallies = {k: Tally() for k in ("names", "modules", "path-prefix")}
    traces = {history[0].sha: trace_tests(repo, history[0].sha, scratch)}
    for c in history[1:]:
        traces[c.sha] = trace_tests(repo, c.sha, scratch)
        co = checkout(AuditRequest(repo=str(repo.path), base=c.sha + "~1", head=c.sha))
        changes = build_changeset(co)
        head = Tree(co.repo, co.head_sha)
        truth = suites_of(configs["names"], exercised(repo, changes, traces[c.sha], traces[changes.base_sha]))
        catching = suites_of(configs["names"], {t for t, r in traces[c.sha].items() if r.get("failed")})
        paths = [p for f in changes.files for p in (f.path, f.old_path) if p]
        picks = {}
        for name, config in configs.items():
            start = time.perf_counter()
            plan = select_tests(config, changes, map_pillars(co, config, changes), Findings(), AuditOptions(), head,
                                "bench")
            tallies[name].seconds += time.perf_counter() - start
            picks[name] = ({s.id for s in plan.suites}, sum(SYN_COST.get(s.id, 1.0) for s in plan.suites))
        by_prefix = _prefix_select(SYN_PREFIXES, paths)
        picks["path-prefix"] = (by_prefix, sum(SYN_COST.get(s, 1.0) * len(runners[s]) for s in by_prefix))
        subject = repo.git("log", "-1", "--format=%h %s", c.sha).strip()
        for name, (picked, minutes) in picks.items():
            t = tallies[name]
            t.commits += 1
            t.run_all += all_minutes
            t.add(picked, truth, minutes, subject)
            if c.kind == "break":
                t.breaks += 1
                t.caught += bool(catching) and catching <= picked
                if not catching <= picked:
                    t.missed.append(f"{c.sha[:10]} {c.broken}: needs {sorted(catching)}, picked {sorted(picked)}")
    return tallies, gen_s


def own_history(limit: int) -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--no-merges", f"--max-count={limit}", "HEAD"],
                         capture_output=True, text=True, check=True).stdout.split()
    roots = set(subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"],
                               capture_output=True, text=True, check=True).stdout.split())
    return [sha for sha in reversed(out) if sha not in roots]


def rows(history: str, tallies: dict[str, Tally]) -> list[str]:
    out = []
    for name, t in tallies.items():
        caught = f"{t.caught}/{t.breaks}" if t.breaks else "-"
        per = f"{1000 * t.seconds / max(t.commits, 1):.1f}" if name != "path-prefix" else "-"
        out.append(f"| {history} | {name} | {t.commits} | {t.selected} | {t.truth} | {t.precision:.1%} | "
                   f"{t.recall:.1%} | {t.minutes:.1f} ({t.minutes / max(t.run_all, 1e-9):.1%}) | {caught} | {per} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=200, help="length of the synthetic history")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--own-limit", type=int, default=500, help="at most this many of this repo's commits")
    ap.add_argument("--smoke", action="store_true", help="tiny histories, every section once (< 30 s)")
    ap.add_argument("--show-unselected", action="store_true",
                    help="list the ground-truth (commit, suite) pairs the name-level selector left out")
    args = ap.parse_args(argv)
    if args.smoke:
        args.commits, args.own_limit = 14, 4

    table, errors, notes = [], [], []
    own: dict[str, Tally] = {}
    try:
        if own_toml():
            own = replay_own(args.own_limit)
            table += rows("this repo", own)
        else:
            notes.append(f"no {CONFIG_PATH} at HEAD; own-history replay skipped")
    except Exception as exc:  # a section error fails the run, after the other section ran
        errors.append(f"own history: {type(exc).__name__}: {exc}")
    scratch = Path(tempfile.mkdtemp(prefix="drift-audit-replay-"))
    syn: dict[str, Tally] = {}
    try:
        syn, gen_s = replay_synthetic(args.commits, args.seed, scratch)
        table += rows(f"synthetic (seed {args.seed})", syn)
        notes.append(f"synthetic history of {args.commits} commits generated in {gen_s:.1f} s, "
                     f"{syn['names'].breaks} seeded breaks; ground truth traced per test file per commit")
    except Exception as exc:
        errors.append(f"synthetic history: {type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print("Selection precision and recall over (commit, suite) pairs; suite-minutes against the run-all anchor "
          "(every suite on every runner label), same run.")
    print("Ground truth: measured line coverage per test file on the synthetic history; on this repo, the "
          "module import closure (an upper bound: see the module docstring).\n")
    print("| history | selector | commits | selected | truth | precision | recall | suite-min (share of run-all) | "
          "breaks caught | ms/commit |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(r)
    for n in notes:
        print(f"\n{n}")
    if args.show_unselected:
        for history, tallies in (("this repo", own), ("synthetic", syn)):
            if tallies:
                print(f"\n{history}: ground-truth pairs the name-level selector left out:")
                for line in tallies["names"].unselected:
                    print("  " + line)
    missed = syn["names"].missed if syn else []
    for m in missed:
        print("missed by drift-audit: " + m)
    for e in errors:
        print(f"section error: {e}", file=sys.stderr)
    return 1 if errors or missed else 0


if __name__ == "__main__":
    sys.exit(main())
