"""Nothing to run here costs nothing: no worktree, no torch import, when every suite needs another machine."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from checks.model import AuditOptions, AuditRequest, PlannedSuite
from checks.model import TestPlan as Plan
from runner import device, pipeline
from runner.local import run_plan

CONFIG = '''
[[suite]]
id = "parity"
kind = "parity"
command = "test -f pkg/a.py"
runners = ["cpu"]
requires = "cc >= 99.0"
paths = ["pkg/**"]
'''


def test_the_tree_is_made_only_for_a_suite_that_runs(tmp_path):
    made: list[str] = []

    def tree() -> str:
        made.append(str(tmp_path))
        return str(tmp_path)

    gpu_only = Plan("a", "h", [PlannedSuite("parity", "parity", "true", "sm90"),
                               PlannedSuite("decode", "decode", "true", "sm120")])
    results = run_plan(gpu_only, tree, capability="cpu")
    assert [(r.suite, r.outcome, r.reason) for r in results.suites] == [
        ("parity", "skipped", "needs sm90"), ("decode", "skipped", "needs sm120")]
    assert made == []

    both = Plan("a", "h", [PlannedSuite("unit", "unit", "true", "cpu"), PlannedSuite("u2", "unit", "true", "cpu")])
    assert [r.outcome for r in run_plan(both, tree, capability="cpu").suites] == ["passed", "passed"]
    assert made == [str(tmp_path)]  # once, for both


def test_review_run_with_nothing_runnable_makes_no_worktree(git_repo, monkeypatch):
    from runner import worktree

    made: list[str] = []
    real = worktree.head_worktree

    def recording(repo, sha):
        made.append(sha)
        return real(repo, sha)

    monkeypatch.setattr(worktree, "head_worktree", recording)
    base = git_repo.commit_files({".github/drift-audit.toml": CONFIG, "pkg/a.py": "X = 1\n"}, "base")
    head = git_repo.commit_files({"pkg/a.py": "X = 2\n"}, "head")
    audit = pipeline.review(AuditRequest(repo=str(git_repo.root), base=base, head=head,
                                         options=AuditOptions(run=True)))
    assert audit.results is not None
    assert [(r.suite, r.outcome) for r in audit.results.suites] == [("parity", "skipped")]
    assert audit.results.suites[0].reason.startswith("needs cc >= 99.0")
    assert made == []

    git_repo.commit_files({".github/drift-audit.toml": CONFIG.replace('requires = "cc >= 99.0"\n', "")}, "cpu")
    base = git_repo.git("rev-parse", "HEAD")
    head = git_repo.commit_files({"pkg/a.py": "X = 3\n"}, "head")
    audit = pipeline.review(AuditRequest(repo=str(git_repo.root), base=base, head=head,
                                         options=AuditOptions(run=True)))
    assert audit.results is not None and [r.outcome for r in audit.results.suites] == ["passed"]
    assert made == [head]  # a suite that runs here gets the head's tree


def test_gpu_node_check(tmp_path):
    if sys.platform != "linux":
        pytest.skip("device nodes are read on Linux only")
    assert device.has_gpu_node(str(tmp_path)) is False
    (tmp_path / "dxg").touch()
    assert device.has_gpu_node(str(tmp_path)) is True
    (tmp_path / "dxg").unlink()
    (tmp_path / "nvidiactl").touch()
    assert device.has_gpu_node(str(tmp_path)) is True


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_detecting_no_gpu_does_not_import_torch(tmp_path):
    if device.has_gpu_node():
        pytest.skip("this machine has a GPU device node; torch is the right thing to ask")
    probe = ("import sys; from runner import device; assert device.detect_gpu() is None; "
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={"PATH": str(tmp_path), "PYTHONPATH": ":".join(sys.path)})  # no nvidia-smi
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
