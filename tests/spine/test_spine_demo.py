"""`drift-audit demo`, the README's first command: a real review with findings and a suite run."""

import subprocess
import sys

from checks.model import Audit, from_json
from runner import device


def test_demo_reviews_a_drifting_pr_and_runs_its_cpu_suite(tmp_path):
    out = tmp_path / "audit.json"
    res = subprocess.run([sys.executable, "-m", "bot.cli", "demo", "--dir", str(tmp_path / "engine"),
                          "--format", "json", "--output", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr  # the review fails the PR, which is what the demo shows
    assert "verdict fail, as intended" in res.stderr
    closing = res.stderr.strip().splitlines()[-1]
    assert closing.count(" on ") == 1 and "exits 1 on this change, so it can gate CI" in closing, closing
    audit = from_json(Audit, out.read_text())
    new = audit.findings.with_status("new")
    assert [f.rule for f in new] == ["pk-task-wiring"]
    assert "TASK_TOPK_SOFTMAX" in new[0].message and "pk_name_map" in new[0].message
    assert [f.rule for f in audit.findings.with_status("pre-existing")] == ["shard-tables-agree"]
    assert {p.id for p in audit.pillars.pillars} >= {"wiring", "topology", "runtime"}
    outcomes = {(s.suite, s.runner): (s.outcome, s.reason) for s in audit.results.suites}
    assert outcomes[("wrapper-unit", "cpu")][0] == "passed"
    gpu = device.detect_gpu()
    if gpu is not None and gpu.capability[0] == 9:  # an sm90 machine runs the GPU parity suite itself
        assert outcomes[("attention-parity", "sm90")][0] == "passed", outcomes
    else:
        assert outcomes[("attention-parity", "sm90")][0] == "skipped"
        assert outcomes[("attention-parity", "sm90")][1].startswith("needs sm90")
    assert audit.report.verdict == "fail" and "pk-task-wiring" in audit.report.markdown


def test_demo_closing_line_without_keep_names_the_command_once(tmp_path):
    res = subprocess.run([sys.executable, "-m", "bot.cli", "demo", "--no-run", "--format", "json",
                          "--output", str(tmp_path / "a.json")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    closing = res.stderr.strip().splitlines()[-1]
    assert closing.count("on it") == 0 and "`drift-audit review` exits 1 on this change" in closing, closing
    assert "sample repo removed; --keep keeps it" in closing
