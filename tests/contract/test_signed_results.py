"""GPU results are trusted only when the workflow's recording step signed them for this dispatch.

The collector runs against the stand-in with the real PyGithub client; the recording step is
``runner/signing.py`` run the way the workflow runs it (``python -I``, a separate process), after a real
``python -P -m runner.execute`` of a plan whose suite is hostile "PR code".
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from github import Auth, Github

from checks.model import PlannedSuite, Results, SuiteResult, to_json
from checks.model import TestPlan as Plan
from runner import signing
from runner.actions import ActionsError, Collector, artifact_name, run_title
from tests.gitrepo import commit, init_repo

ROOT = Path(__file__).resolve().parents[2]
REPO = "octo-org/engine"
KEY = "the-bot-results-key"
HEAD = "a" * 40


@pytest.fixture
def gh(ghstub, monkeypatch):
    base, state = ghstub
    monkeypatch.setenv(signing.ENV_KEY, KEY)
    state.results_key = KEY
    state.add_repo(REPO)
    token = state.mint_token(1)["token"]
    g = Github(auth=Auth.Token(token), base_url=base, retry=None, seconds_between_requests=0,
               seconds_between_writes=0)
    return g.get_repo(REPO), state


def passed(audit_id: str = "da-1", head: str = HEAD, label: str = "sm90") -> str:
    return to_json(Results(audit_id, head, [SuiteResult("parity", label, "passed", 1.0)]))


def run_with(state, files: dict, *, signed: bool | None = None, label: str = "sm90", head: str = HEAD,
             audit_id: str = "da-1") -> int:
    run = state.add_run(REPO, head_sha=head, inputs={"audit_id": audit_id, "label": label, "head_sha": head})
    run["display_title"] = run_title(audit_id, label)
    state.add_artifact(run["id"], artifact_name(audit_id, label), files, signed=signed)
    return run["id"]


def test_results_with_a_valid_hmac_are_accepted(gh):
    repo, state = gh
    run_id = run_with(state, {"results.json": passed()})
    results = Collector(repo).collect(run_id, "da-1", head_sha=HEAD)
    assert [(s.suite, s.outcome) for s in results.suites] == [("parity", "passed")]


@pytest.mark.parametrize("how,message", [
    ("unsigned", "has no results.sig"),
    ("rewritten", "do not match their signature"),
    ("other-label", "results.sig is for label 'sm120', not 'sm90'"),
    ("other-head", "results.sig is for head_sha"),
    ("other-repo-key", "do not match their signature"),
])
def test_a_forged_passed_is_refused(gh, how, message):
    """What PR code can produce without the key: no signature, a signature over other bytes, or one made
    for another dispatch or repository."""
    repo, state = gh
    forged = passed()
    if how == "unsigned":  # e.g. uploaded by the PR's own workflow under our artifact name
        run_id = run_with(state, {"results.json": forged}, signed=False)
    elif how == "rewritten":  # signed, then rewritten by something the suite left running
        honest = to_json(Results("da-1", HEAD, [SuiteResult("parity", "sm90", "failed", 1.0)]))
        run_id = run_with(state, {"results.json": honest})
        art = next(a for a in state.artifacts.values() if a["_run"] == run_id)
        src = zipfile.ZipFile(io.BytesIO(art["_zip"]))
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr("results.json", forged)
            zf.writestr("results.sig", src.read("results.sig"))
        art["_zip"], art["size_in_bytes"] = buf.getvalue(), len(buf.getvalue())
    elif how == "other-label":  # a genuine signature of the sm120 dispatch, replayed as sm90
        sig = signing.sign(forged.encode(), signing.repo_key(KEY, REPO),
                           signing.Dispatch(REPO, "da-1", "sm120", HEAD))
        run_id = run_with(state, {"results.json": forged, "results.sig": sig}, signed=False)
    elif how == "other-head":
        sig = signing.sign(forged.encode(), signing.repo_key(KEY, REPO),
                           signing.Dispatch(REPO, "da-1", "sm90", "c" * 40))
        run_id = run_with(state, {"results.json": forged, "results.sig": sig}, signed=False)
    else:  # signed with the key of a repository the attacker controls
        sig = signing.sign(forged.encode(), signing.repo_key(KEY, "attacker/fork"),
                           signing.Dispatch(REPO, "da-1", "sm90", HEAD))
        run_id = run_with(state, {"results.json": forged, "results.sig": sig}, signed=False)
    with pytest.raises(ActionsError, match=message) as err:
        Collector(repo).collect(run_id, "da-1", head_sha=HEAD)
    assert "refused" in str(err.value) and f"run {run_id}" in str(err.value)


def test_without_a_key_nothing_is_trusted(gh, monkeypatch):
    repo, state = gh
    run_id = run_with(state, {"results.json": passed()})
    monkeypatch.delenv(signing.ENV_KEY)
    with pytest.raises(ActionsError, match="no results key is configured"):
        Collector(repo).collect(run_id, "da-1", head_sha=HEAD)


def _workspace(tmp_path: Path) -> tuple[Path, str, Path]:
    """A runner workspace: the audited checkout, a stale runner/ package an earlier PR left, the plan."""
    head_repo = init_repo(tmp_path / "ws" / "head")
    # the "PR code": its suite exits 1 (a real failure) after leaving a process behind that, once
    # runner.execute has written its results, replaces them with a forged all-passed file
    forge = (
        "import os, sys, time, json\n"
        "out = sys.argv[1]\n"
        "if os.fork():\n"
        "    time.sleep(0.3)\n"
        "    sys.exit(1)\n"
        "os.setsid()\n"
        "give_up = time.time() + 30\n"
        "while not os.path.exists(out):\n"
        "    if time.time() > give_up:\n"
        "        sys.exit(0)\n"
        "    time.sleep(0.02)\n"
        "time.sleep(0.2)\n"
        "data = json.load(open(out))\n"
        "for s in data['suites']:\n"
        "    s['outcome'] = 'passed'\n"
        "json.dump(data, open(out, 'w'))\n"
    )
    head = commit(head_repo, {"forge.py": forge}, "pr")
    stale = tmp_path / "ws" / "runner"
    stale.mkdir()
    (stale / "__init__.py").write_text("")
    (stale / "execute.py").write_text("raise SystemExit('the shadow runner ran')\n")
    plan = Plan("da-9", head, [PlannedSuite("parity", "parity", "python forge.py \"$RAW_OUT\"", "cpu")])
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(to_json(plan))
    return head_repo, head, plan_path


def test_the_recording_step_refuses_a_forged_pass_of_the_tested_code(gh, tmp_path):
    """End to end: the tested code forges "passed" after a real failure; the recording step sees that
    runner.execute's step failed, signs error rows instead, and the collector reports the tampering."""
    repo, state = gh
    head_repo, head, plan_path = _workspace(tmp_path)
    ws = tmp_path / "ws"
    raw = tmp_path / "raw" / "results.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAW_OUT=str(raw))
    env.pop(signing.ENV_KEY, None)  # the tested code's step holds no key
    shadowed = subprocess.run([sys.executable, "-m", "runner.execute", "--plan", str(plan_path), "--repo",
                               str(head_repo), "--out", str(raw)], cwd=ws, env=env, capture_output=True, text=True)
    assert "the shadow runner ran" in shadowed.stderr  # why the workflow runs it with -P
    step = subprocess.run([sys.executable, "-P", "-m", "runner.execute", "--plan", str(plan_path), "--repo",
                           str(head_repo), "--out", str(raw)], cwd=ws, env=env, capture_output=True, text=True)
    assert step.returncode == 1, step.stderr  # the suite failed
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and json.loads(raw.read_text())["suites"][0]["outcome"] != "passed":
        time.sleep(0.05)
    assert json.loads(raw.read_text())["suites"][0]["outcome"] == "passed"  # the forgery landed on disk
    signed_dir = tmp_path / "signed"
    rec = subprocess.run(
        [sys.executable, "-I", str(ROOT / "runner" / "signing.py"), "record", "--raw", str(raw), "--plan",
         str(plan_path), "--out", str(signed_dir), "--repo", REPO, "--audit-id", "da-9", "--label", "cpu",
         "--head-sha", head, "--outcome", "failure"],
        cwd=ws, env={"PATH": os.environ["PATH"], signing.ENV_KEY: signing.repo_key(KEY, REPO).hex()},
        capture_output=True, text=True)
    assert rec.returncode == 0, rec.stderr
    assert "report no failure" in rec.stderr
    run = state.add_run(REPO, head_sha=head, inputs={"audit_id": "da-9", "label": "cpu", "head_sha": head})
    run["display_title"] = run_title("da-9", "cpu")
    state.add_artifact(run["id"], artifact_name("da-9", "cpu"), {
        "results.json": (signed_dir / "results.json").read_bytes(),
        "results.sig": (signed_dir / "results.sig").read_bytes()}, signed=False)
    results = Collector(repo).collect(run["id"], "da-9", head_sha=head)
    (suite,) = results.suites
    assert suite.outcome == "error" and "results refused by the recording step" in suite.reason


def test_the_recording_step_signs_honest_results_unchanged(gh, tmp_path):
    repo, state = gh
    raw = tmp_path / "raw.json"
    honest = passed("da-2", label="cpu")
    raw.write_text(honest)
    plan = Plan("da-2", HEAD, [PlannedSuite("parity", "parity", "true", "cpu")])
    (tmp_path / "plan.json").write_text(to_json(plan))
    problems = signing.record(str(raw), str(tmp_path / "plan.json"), str(tmp_path / "out"),
                              signing.Dispatch(REPO, "da-2", "cpu", HEAD), "success", signing.repo_key(KEY, REPO))
    assert problems == [] and (tmp_path / "out" / "results.json").read_text() == honest
    run_id = run_with(state, {"results.json": honest, "results.sig": (tmp_path / "out" / "results.sig").read_bytes()},
                      signed=False, label="cpu", audit_id="da-2")
    assert Collector(repo).collect(run_id, "da-2", head_sha=HEAD).suites[0].outcome == "passed"


@pytest.mark.parametrize("outcome,change,problem", [
    ("success", lambda d: d["suites"].append(dict(d["suites"][0], suite="extra")), "the plan has"),
    ("success", lambda d: d["suites"].clear(), "the plan has"),
    ("success", lambda d: d.update(audit_id="da-other"), "results are for 'da-other'"),
    ("success", lambda d: d["suites"][0].update(outcome="failed"), "succeeded but the results report a failure"),
])
def test_the_recording_step_checks_results_against_the_plan(tmp_path, outcome, change, problem):
    data = json.loads(passed("da-3", label="cpu"))
    change(data)
    plan = {"audit_id": "da-3", "head_sha": HEAD, "suites": [{"id": "parity", "runner": "cpu"}]}
    results, problems = signing.checked_results(json.dumps(data).encode(), plan,
                                                signing.Dispatch(REPO, "da-3", "cpu", HEAD), outcome)
    assert any(problem in p for p in problems), problems
    assert [(s["suite"], s["outcome"]) for s in results["suites"]] == [("parity", "error")]
