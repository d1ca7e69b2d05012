"""Wall time of the checks stage (facts + rules on base and head) on a bring-up-sized PR.

    python benchmarks/checks_bench.py [--files 2000] [--repeat 3]

Builds the synthetic repo (benchmarks/synth_repo.py: ≥ 2000 files, one change
of 129 files and ~50k lines), with a persistent-kernel engine of 150 tasks laid
over it (checks/packs/sample.py) to which the change adds 10 tasks
consistently. Two configs:
- ``pack``: the persistent_kernel rule pack plus shard-table, gate, pinned and
  derived rules, as a real repo would configure it (facts read ~20 files);
- ``every-file``: facts that read every header, C++, CUDA and Python file
  (~2200 files per side), the worst case.
For each, in one run:
- the anchor: ``git diff --stat`` of the same range (a fresh process);
- cold: ``run_checks`` with every cache emptied (grammars loaded, nothing parsed);
- cold process: a fresh Python process that imports and runs the stage once;
- cached, nothing new: the same audit again in one process;
- cached, few files changed: a new head that edits 3 files on top of the audited one.
Medians of --repeat runs; ratios against the anchor.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.synth_repo import git_diff_floor, make_synthetic_repo, shortstat  # noqa: E402
from checks.packs import sample as shape  # noqa: E402
from checks.packs.sample import git as _git  # noqa: E402
from tests.gitrepo import commit  # noqa: E402

EVERY_FILE = '''
[[fact]]
id = "task_enum"
lang = "cpp"
files = ["include/**/*.h"]
query = "(enumerator name: (identifier) @key value: (_) @value)"
ignore = ["*_BEGIN", "*_END"]

[[fact]]
id = "task_enum_text"
lang = "regex"
files = ["include/**/*.h"]
regex = '^\\s+(?P<key>[A-Z0-9_]+) = (?P<value>\\d+),'

[[fact]]
id = "cc_functions"
lang = "cpp"
files = ["src/**/*.cc"]
query = "(function_definition declarator: (function_declarator declarator: (identifier) @key) body: (compound_statement (return_statement (identifier) @returns)))"

[[fact]]
id = "cu_kernels"
lang = "cuda"
files = ["kernels/**/*.cu"]
query = "(function_definition type: (_) @type declarator: (function_declarator declarator: (identifier) @key))"

[[fact]]
id = "py_layers"
lang = "python"
files = ["python/**/*.py"]
query = """
(call function: (attribute object: (identifier) @_m attribute: (identifier) @_f) (#eq? @_m "math") (#eq? @_f "sqrt")) @sqrt
(function_definition name: (identifier) @key (#match? @key "_layer$"))
"""
count = "sqrt"

[[rule]]
id = "enum-query-vs-text"
kind = "same-set"
facts = ["task_enum", "task_enum_text"]

[[rule]]
id = "enum-values"
kind = "join-equal"
facts = ["task_enum", "task_enum_text"]
equal = ["task_enum.value", "task_enum_text.value"]

[[rule]]
id = "cc-returns-n"
kind = "pinned"
facts = ["cc_functions"]
value = "n"
field = "returns"

[[rule]]
id = "kernels-return-void"
kind = "pinned"
facts = ["cu_kernels"]
value = "void"
field = "type"

[[rule]]
id = "layer-sqrt-count"
kind = "arity"
facts = ["py_layers", "task_enum"]
count = "py_layers.count"
declared = ["task_enum.value"]
'''


def _clear() -> None:
    """Empty every cache the stage uses, so the next run parses and reads everything again."""
    from checks import audit, facts, syntax, workspace

    syntax._cache.clear()
    facts._rows_cache.clear()
    facts._compiled.clear()
    facts._files_cache.clear()
    facts._results.clear()
    audit._rule_cache.clear()
    workspace._blob_index.cache_clear()
    workspace.read_blob.cache_clear()
    workspace._repo.cache_clear()


def _audit(repo: Path, base: str, head: str, config):
    from checks.audit import run_checks
    from checks.diff import build_changeset
    from checks.model import AuditRequest
    from checks.workspace import checkout

    co = checkout(AuditRequest(repo=str(repo), base=base, head=head))
    changes = build_changeset(co)
    start = time.perf_counter()
    found = run_checks(co, config, changes)
    return time.perf_counter() - start, found


def _overlay(repo: Path, base: str, head: str, n_tasks: int = 150) -> tuple[str, str]:
    """Commit the engine shape onto base, then head's tree plus 10 more tasks on top of that."""
    # (name, enum value: compute tasks below 200, communication tasks above, inputs, outputs, params)
    tasks = [(f"op{i:03d}", 101 + i if i < 90 else 210 + i, 1 + i % 3, 1 + i % 2, 1 + i % 4) for i in range(n_tasks)]
    more = tasks + [(f"new{i:02d}", 400 + i, 2, 1, 2) for i in range(10)]
    _git(repo, "checkout", "-q", "-f", "-B", "bench", base)
    base2 = commit(repo, shape.files_for(tasks), "engine")
    _git(repo, "read-tree", "-u", "--reset", head)
    return base2, commit(repo, shape.files_for(more), "bring-up")


def _few_files_head(repo: Path, head: str) -> str:
    """A commit on top of ``head`` that edits 3 files (one the engine's graph.cc), as after one more push."""
    _git(repo, "checkout", "-q", "-f", head)
    paths = [p for p in _git(repo, "ls-files", "src/kernel", "python/engine/models").splitlines()][:2] + ["src/graph.cc"]

    def touched(p: str) -> str:
        return (repo / p).read_text() + ("\n# touched\n" if p.endswith(".py") else "\n// touched\n")

    return commit(repo, {p: touched(p) for p in paths}, "touch")


def _measure(name, root, base, head, head2, config, repeat):
    from checks.facts import compile_fact

    cold, cached, few = [], [], []
    found = None
    for _ in range(repeat):
        _clear()
        for f in config.facts:  # grammar load and query compile happen once per process, not per audit
            compile_fact(f)
        t, found = _audit(root, base, head, config)
        cold.append(t)
        t, _ = _audit(root, base, head, config)
        cached.append(t)
        t, _ = _audit(root, base, head2, config)
        few.append(t)
    code = (
        "import sys,time;sys.path.insert(0,%r);t=time.perf_counter();"
        "from benchmarks import checks_bench as b;from checks.config import parse_config;"
        "from pathlib import Path;w,_=b._audit(Path(%r),%r,%r,parse_config(b.CONFIGS[%r]));print(time.perf_counter()-t, w)"
    ) % (str(Path(__file__).resolve().parents[1]), str(root), base, head, name)
    proc = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
        proc.append((float(out[0]), float(out[1])))
    n = {s: len(found.with_status(s)) for s in ("new", "pre-existing", "fixed")}
    summary = f"{n['new']} new, {n['pre-existing']} pre-existing, {n['fixed']} fixed, {len(found.unchecked)} unchecked"
    return summary, [
        ("cold (caches empty, grammars loaded)", statistics.median(cold)),
        ("fresh process: stage only", statistics.median(p[1] for p in proc)),
        ("fresh process: imports + stage", statistics.median(p[0] for p in proc)),
        ("cached, same range again", statistics.median(cached)),
        ("cached, 3 files changed since", statistics.median(few)),
    ]


CONFIGS = {"pack": shape.CONFIG, "every-file": EVERY_FILE}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from checks.config import parse_config
    from checks.facts import extract
    from checks.workspace import Tree

    root = Path(tempfile.mkdtemp(prefix="drift-audit-checks-bench-")) / "synth"
    base, head = make_synthetic_repo(root, n_files=args.files)
    base, head = _overlay(root, base, head)
    head2 = _few_files_head(root, head)
    tree = Tree(str(root), head)
    print(f"repo: {len(tree.paths())} files; change: {shortstat(root, base, head)}")

    a = git_diff_floor(root, base, head, max(3, args.repeat))
    print(f"anchor: git diff --stat of the range, fresh process: {a:.3f} s (median)")
    print(f"{'config':<11} {'measure':<38} {'seconds':>8} {'× anchor':>9}")
    for name, text in CONFIGS.items():
        config = parse_config(text, f"{name}.toml")
        read = sum(len(extract(f, tree).files) for f in config.facts)
        summary, rows = _measure(name, root, base, head, head2, config, args.repeat)
        for label, v in rows:
            print(f"{name:<11} {label:<38} {v:>8.3f} {v / a:>9.1f}")
        print(f"{name:<11} ({len(config.facts)} facts reading {read} file(s) per side, {len(config.rules)} rules; {summary})")
    print(f"medians of {args.repeat}; targets: cold ≤ 1.0 s, cached with a few files changed ≤ 0.3 s")


if __name__ == "__main__":
    main()
