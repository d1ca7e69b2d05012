"""The runner-side entry point, its plain-JSON fallback, the head worktree and the plan command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import main as cli
from checks.model import (
    CaseResult,
    DeviceFingerprint,
    PlannedSuite,
    Results,
    SuiteResult,
    from_json,
    to_dict,
    to_json,
)
from checks.model import (
    TestPlan as Plan,
)
from runner import compat
from runner.worktree import WorktreeError, head_worktree

ROOT = Path(__file__).resolve().parents[2]


def write_plan(path, head, suites):
    path.write_text(to_json(Plan(audit_id="da-1", head_sha=head, suites=suites)))
    return str(path)


@pytest.fixture
def head(git_repo):
    sha = git_repo.commit_files({"check.py": "import sys\nsys.exit(int(sys.argv[1]))\n"}, "head")
    return git_repo, sha


def test_execute_writes_results_for_its_label(head, tmp_path, capsys):
    repo, sha = head
    plan = write_plan(tmp_path / "plan.json", sha, [
        PlannedSuite("ok", "unit", "python check.py 0", "cpu"),
        PlannedSuite("gpu-only", "parity", "python check.py 1", "sm90"),
    ])
    out = tmp_path / "out" / "results.json"
    rc = cli(["runner", "execute", "--plan", plan, "--out", str(out), "--label", "cpu", "--repo", str(repo.path)])
    assert rc == 0
    results = from_json(Results, out.read_text())
    assert [(s.suite, s.outcome) for s in results.suites] == [("ok", "passed")]
    assert results.audit_id == "da-1" and results.head_sha == sha and results.devices[0].label == "cpu"
    assert "wrote" in capsys.readouterr().err

    rc = cli(["runner", "execute", "--plan", plan, "--out", str(out), "--label", "sm90", "--repo", str(repo.path),
              "--capability", "9.0"])
    assert rc == 1  # the suite failed; results are still written
    results = from_json(Results, out.read_text())
    assert [(s.suite, s.outcome, s.reason) for s in results.suites] == [("gpu-only", "error", "exit code 1")]
    assert results.devices[0].label == "sm90" and results.devices[0].compute_capability == "9.0"


def test_execute_rejects_bad_input(head, tmp_path, capsys):
    repo, sha = head
    out = tmp_path / "results.json"
    cases = {
        "missing.json": None,
        "garbage.json": "{not json",
        "shape.json": json.dumps({"suites": []}),
        "types.json": json.dumps({"audit_id": "a", "head_sha": sha, "suites": [{"id": "x", "kind": "bogus",
                                  "command": "true", "runner": "cpu"}]}),
        "other-head.json": to_json(Plan(audit_id="a", head_sha="0" * 40, suites=[])),
    }
    expect = {
        "missing.json": "cannot read the plan",
        "garbage.json": "not JSON: Expecting property name enclosed in double quotes at line 1 column 2",
        "shape.json": "not a TestPlan (expected an object with 'audit_id', 'head_sha' and 'suites')",
        "types.json": "not a valid TestPlan:",
        "other-head.json": f"is at {sha[:12]} but the plan is for 000000000000",
    }
    for name, text in cases.items():
        p = tmp_path / name
        if text is not None:
            p.write_text(text)
        rc = cli(["runner", "execute", "--plan", str(p), "--out", str(out), "--repo", str(repo.path)])
        err = capsys.readouterr().err
        assert rc == 2 and expect[name] in err, (name, err)
    assert not out.exists()


def test_execute_without_cattrs(head, tmp_path):
    """The GPU image has torch and triton but not cattrs: the entry point must still work there."""
    repo, sha = head
    plan = write_plan(tmp_path / "plan.json", sha, [PlannedSuite("ok", "unit", "python check.py 0", "cpu")])
    out = tmp_path / "results.json"
    code = (
        "import sys; sys.modules['cattrs'] = None\n"
        "from runner.execute import main\n"
        "rc = main(sys.argv[1:])\n"
        "assert getattr(sys.modules['cattrs'], 'DRIFT_AUDIT_SHIM', False)\n"
        "sys.exit(rc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code, "--plan", plan, "--out", str(out), "--repo", str(repo.path), "--capability", "cpu"],
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    results = from_json(Results, out.read_text())
    assert [(s.suite, s.outcome) for s in results.suites] == [("ok", "passed")]


def test_plain_converter_matches_cattrs():
    results = Results(
        audit_id="a", head_sha="h",
        suites=[SuiteResult("s", "sm90", "cuda-error", 1.5, "r", "tail",
                            [CaseResult("c", "failed", 0.1, "m", {"max_abs": 0.5, "shape": [1, 2]})], {"rel": 0.1})],
        devices=[DeviceFingerprint(label="sm90", gpu="H200", compute_capability="9.0")],
    )
    data = to_dict(results)
    assert compat.unstructure(results) == data
    assert compat.structure(data, Results) == results
    plan = Plan("a", "h", [PlannedSuite("x", "decode", "c", "cpu", 5.0, "cc >= 9.0", ["r"], "g.jsonl")], ["y"])
    assert compat.structure(json.loads(to_json(plan)), Plan) == plan
    with pytest.raises(ValueError, match="SuiteResult.outcome: 'melted' is not one of"):
        compat.structure({**data, "suites": [{**data["suites"][0], "outcome": "melted"}]}, Results)
    with pytest.raises(ValueError, match="missing required field 'head_sha'"):
        compat.structure({"audit_id": "a"}, Results)


def test_head_worktree_holds_exactly_the_head_tree(git_repo):
    first = git_repo.commit_files({"a.txt": "one\n"}, "one")
    git_repo.commit_files({"a.txt": "two\n", "b.txt": "b\n"}, "two")
    (git_repo.path / "a.txt").write_text("uncommitted\n")
    with head_worktree(str(git_repo.path), first) as tree:
        assert Path(tree, "a.txt").read_text() == "one\n"
        assert not Path(tree, "b.txt").exists()
        kept = tree
    assert not Path(kept).exists()
    assert "uncommitted" in (git_repo.path / "a.txt").read_text()
    assert len(git_repo.git("worktree", "list").splitlines()) == 1
    with pytest.raises(WorktreeError, match="'f00d' is not a commit"):
        with head_worktree(str(git_repo.path), "f00d"):
            pass


def test_plan_command(git_repo, tmp_path, capsys):
    git_repo.commit_files({
        ".github/drift-audit.toml": '[[suite]]\nid = "k"\nkind = "parity"\ncommand = "true"\n'
                                    'runners = ["sm90"]\npaths = ["kernels/**"]\n',
        "kernels/a.py": "X = 1\n",
    }, "base")
    git_repo.commit_files({"kernels/a.py": "X = 2\n"}, "head")
    out = tmp_path / "plan.json"
    assert cli(["runner", "plan", str(git_repo.path), "--out", str(out), "--audit-id", "p1"]) == 0
    plan = from_json(Plan, out.read_text())
    assert [(s.id, s.runner, s.reasons) for s in plan.suites] == [("k", "sm90", ["path 'kernels/**' matched kernels/a.py"])]
    assert cli(["runner", "plan", str(git_repo.path), "--suite", "nope"]) == 2
    assert "unknown suite 'nope'" in capsys.readouterr().err


def test_gpu_smoke_script_on_a_cpu_box(tmp_path):
    import tomllib

    from runner import device
    from runner.smoke import suites_toml

    if device.detect_gpu() is not None:
        pytest.skip("a GPU machine runs the sm90 suites for real; this checks the CPU-box path")

    proc = subprocess.run(["bash", str(ROOT / "runner" / "gpu_smoke.sh"), "sm90", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text, _ = suites_toml(ROOT)
    expected = [s["id"] for s in tomllib.loads(text)["suite"] if "sm90" in s.get("runners", [])]
    results = from_json(Results, (tmp_path / "results.json").read_text())
    assert [s.suite for s in results.suites] == expected and expected
    assert {(s.outcome, s.reason) for s in results.suites} == {("skipped", "needs sm90")}
    assert results.devices[0].label == "cpu"
    assert "needs sm90" in proc.stdout and "suite" in proc.stdout.splitlines()[1]


def test_smoke_plan_prefers_the_repo_config(tmp_path):
    from runner.smoke import plan_for_label

    (tmp_path / ".github").mkdir()
    (tmp_path / ".github/drift-audit.toml").write_text(
        '[[suite]]\nid = "a"\nkind = "parity"\ncommand = "x"\nrunners = ["sm90"]\n'
        + '\n[[suite]]\nid = "b"\nkind = "unit"\ncommand = "y"\n')
    plan = plan_for_label(tmp_path, "sm90", "aid", "sha")
    assert [(s.id, s.runner, s.reasons) for s in plan.suites] == [("a", "sm90", ["every sm90 suite of .github/drift-audit.toml"])]
    assert [s.id for s in plan_for_label(tmp_path, "cpu", "aid", "sha").suites] == ["b"]
