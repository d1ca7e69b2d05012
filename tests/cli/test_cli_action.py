"""The composite GitHub Action (action.yml): its script on a real repository, as Actions runs it,
and its YAML through zizmor."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.cli.configs import PINNED_CONFIG

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests/checks/sarif-schema-2.1.0.json").read_text())
CONFIG = PINNED_CONFIG


@functools.cache
def tool_dir() -> Path:
    """Where the step finds ``drift-audit``: beside this interpreter, where the action's ``pip install`` (or
    an editable install of this checkout) puts the console script; where the package is only on the import
    path (a GPU image runs the suite that way), a stand-in script that runs this checkout's ``bot.cli``."""
    here = Path(sys.executable).parent
    if (here / "drift-audit").exists():
        return here
    shim = Path(tempfile.mkdtemp(prefix="drift-audit-tool-"))
    script = shim / "drift-audit"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m bot.cli "$@"\n')
    script.chmod(0o755)
    return shim


def action_env(tmp_path: Path, **inputs: str) -> dict[str, str]:
    """The environment Actions gives the step: its inputs, the summary and output files, the tool on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DRIFT_AUDIT_"))}
    env["PATH"] = os.pathsep.join(dict.fromkeys([str(tool_dir()), str(Path(sys.executable).parent), env.get("PATH", "")]))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update({"GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "GITHUB_OUTPUT": str(tmp_path / "output"),
                "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r",
                "RUNNER_TEMP": str(tmp_path / "runner-temp")})
    env.update({f"DRIFT_AUDIT_{k.upper()}": v for k, v in inputs.items()})
    return env


def outputs(tmp_path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (tmp_path / "output").read_text().splitlines())


def test_script_writes_summary_sarif_and_outputs(repo, tmp_path):
    repo.write(".github/drift-audit.toml", CONFIG)
    repo.write("engine/model.py", "LIMIT = 8\n")
    base = repo.commit("base")
    repo.write("engine/model.py", "LIMIT = 9\n")
    head = repo.commit("head")
    env = action_env(tmp_path, path=str(repo.root), base=base, head=head, run="false")
    proc = subprocess.run(["bash", str(ROOT / "action/review.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr  # the verdict fails the job in the action's last step, not here
    out = outputs(tmp_path)
    assert out["verdict"] == "fail"
    summary = (tmp_path / "summary.md").read_text()
    assert "### ❌ Drift Audit: 1 failing finding" in summary and "limit-pinned" in summary
    assert f"(https://github.com/o/r/blob/{head}/engine/model.py#L1)" in summary  # links to the head blob
    sarif = json.loads(Path(out["sarif"]).read_text())
    jsonschema.Draft4Validator(SCHEMA).validate(sarif)
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == ["limit-pinned"]
    assert Path(out["sarif"]).parent == tmp_path / "runner-temp" / "drift-audit"


def test_script_passes_a_clean_range_and_stops_on_bad_input(repo, tmp_path):
    repo.write(".github/drift-audit.toml", CONFIG)
    repo.write("engine/model.py", "LIMIT = 8\n")
    base = repo.commit("base")
    repo.write("engine/other.py", "x = 1\n")
    repo.commit("head")
    env = action_env(tmp_path, path=str(repo.root), base=base)
    proc = subprocess.run(["bash", str(ROOT / "action/review.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert outputs(tmp_path)["verdict"] == "pass"
    bad = action_env(tmp_path / "bad", path=str(repo.root), base="no-such-rev")
    (tmp_path / "bad").mkdir()
    proc = subprocess.run(["bash", str(ROOT / "action/review.sh")], env=bad, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "unknown revision 'no-such-rev'" in proc.stderr and "::error title=Drift Audit::" in proc.stdout
    assert not (tmp_path / "bad" / "output").exists()
    bad = action_env(tmp_path / "bad", path=str(repo.root), run="yes")
    proc = subprocess.run(["bash", str(ROOT / "action/review.sh")], env=bad, capture_output=True, text=True)
    assert proc.returncode == 2 and "input 'run' must be true or false" in proc.stdout


def test_action_is_composite_pins_actions_by_sha_and_passes_inputs_by_env():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    for step in steps:
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
        if "run" in step:
            assert "${{" not in step["run"], step["run"]  # inputs reach scripts through env only
    review = next(s for s in steps if s.get("id") == "review")
    assert review["run"] == 'bash "$GITHUB_ACTION_PATH/action/review.sh"'
    assert set(action["inputs"]) >= {"base", "head", "config", "run", "upload-sarif", "fail-on-verdict"}
    upload = next(s for s in steps if "upload-sarif" in s.get("uses", ""))
    assert upload["with"]["sarif_file"] == "${{ steps.review.outputs.sarif }}"


@pytest.mark.skipif(shutil.which("zizmor") is None and not (Path(sys.executable).parent / "zizmor").exists(),
                    reason="zizmor is not installed (pip install zizmor)")
def test_zizmor_finds_nothing():
    zizmor = shutil.which("zizmor") or str(Path(sys.executable).parent / "zizmor")
    proc = subprocess.run([zizmor, "--offline", "--persona=pedantic", str(ROOT / "action.yml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings" in proc.stdout
