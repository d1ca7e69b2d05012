"""The GPU workflow template keeps the tested code away from the results it is judged by."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PATH = ROOT / ".github" / "workflows" / "drift-audit-gpu.yml"
WORKFLOW = yaml.safe_load(PATH.read_text())
STEPS = WORKFLOW["jobs"]["suites"]["steps"]
NAMES = [s["name"] for s in STEPS]


def step(name: str) -> dict:
    return STEPS[NAMES.index(name)]


def test_every_action_is_pinned_by_full_commit_sha():
    uses = [s["uses"] for s in STEPS if "uses" in s]
    assert len(uses) == 4
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref


def test_the_tested_code_runs_in_its_own_step_without_the_key():
    suites = step("Run the suites")
    assert "-P -m runner.execute" in suites["run"] and "-m runner.execute" not in suites["run"].replace("-P -m", "")
    assert suites["continue-on-error"] is True  # the signing step still runs, and sees the outcome
    secret_steps = [s["name"] for s in STEPS if "secrets." in yaml.safe_dump(s)]
    assert secret_steps == ["Check and sign the results"]
    assert "DRIFT_AUDIT_RESULTS_KEY" not in yaml.safe_dump(WORKFLOW["jobs"]["suites"].get("env", {}))
    assert 'sudo -n -u "$SANDBOX_USER"' in suites["run"]


def test_results_are_signed_by_a_fresh_isolated_recorder_before_upload():
    order = [NAMES.index(n) for n in ("Run the suites", "Stop what the tested code left running",
                                      "Check out the recorder (pinned, after the tested code ran)",
                                      "Check and sign the results", "Upload results.json")]
    assert order == sorted(order)
    sign = step("Check and sign the results")
    assert '"$PY" -I "$GITHUB_WORKSPACE/recorder/runner/signing.py" record' in sign["run"]
    assert sign["env"]["SUITES_OUTCOME"] == "${{ steps.suites.outcome }}"
    assert step("Check out the recorder (pinned, after the tested code ran)")["with"]["path"] == "recorder"
    upload = step("Upload results.json")["with"]["path"]
    assert "/signed/results.json" in upload and "/signed/results.sig" in upload
    for s in STEPS:  # nothing user-controlled is spliced into a script
        assert "${{" not in s.get("run", "")


def _zizmor() -> str | None:
    exe = shutil.which("zizmor") or str(Path(__import__("sys").executable).parent / "zizmor")
    return exe if Path(exe).exists() else None


@pytest.mark.skipif(_zizmor() is None, reason="zizmor is not installed (the test extra installs it)")
def test_zizmor_reports_nothing():
    exe = _zizmor()
    assert exe is not None
    out = subprocess.run([exe, "--offline", "--persona=pedantic", str(PATH)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "No findings to report" in out.stdout + out.stderr
