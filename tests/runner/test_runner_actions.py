"""Actions backend with the real PyGithub client against the GitHub REST stand-in on loopback."""

from __future__ import annotations

import copy
import io
import json
import zipfile
from pathlib import Path

import pytest
import yaml
from github import Auth, Github  # noqa: E402

from checks.model import PlannedSuite, Results, from_json, to_json  # noqa: E402
from checks.model import TestPlan as Plan
from runner.actions import (  # noqa: E402
    ActionsError,
    Collector,
    Dispatcher,
    artifact_name,
    parse_run_title,
    run_of_event,
    run_title,
)
from runner.execute import execute  # noqa: E402
from tests.webhooks import FIXTURES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((ROOT / ".github/workflows/drift-audit-gpu.yml").read_text())
REPO = "octo-org/engine"


RESULTS_KEY = "bot-results-key"


@pytest.fixture
def gh(ghstub, monkeypatch):
    """The stand-in signs artifacts as the workflow's recording step does; the collector holds the same key."""
    base_url, state = ghstub
    monkeypatch.setenv("DRIFT_AUDIT_RESULTS_KEY", RESULTS_KEY)
    state.results_key = RESULTS_KEY
    state.add_repo(REPO)
    inputs = list(WORKFLOW[True]["workflow_dispatch"]["inputs"])  # yaml reads the key `on` as True
    state.add_workflow(REPO, inputs=inputs)
    token = state.mint_token(1)["token"]
    client = Github(auth=Auth.Token(token), base_url=base_url, retry=None, seconds_between_requests=0,
                    seconds_between_writes=0)
    return client.get_repo(REPO), state


def plan_for(head):
    return Plan(audit_id="da-abc", head_sha=head, suites=[
        PlannedSuite("parity-rmsnorm", "parity", "python check.py 0", "sm90", reasons=["r"]),
        PlannedSuite("parity-rmsnorm", "parity", "python check.py 0", "sm120", reasons=["r"]),
        PlannedSuite("decode", "decode", "python check.py 1", "sm90"),
    ], not_affected=["x"])


def seed_run(state, record, results_json=None, files=None, **art):
    """What Actions does after a dispatch: a run named by run-name, with the uploaded artifact."""
    inputs = record["inputs"]
    run = state.add_run(REPO, head_sha="f" * 40, inputs=inputs)
    run["display_title"] = run_title(inputs["audit_id"], inputs["label"])
    if files is None and results_json is not None:
        files = {"results.json": results_json}
    if files is not None or art:
        state.add_artifact(run["id"], artifact_name(inputs["audit_id"], inputs["label"]), files, **art)
    return run["id"]


def test_workflow_template_matches_the_backend():
    inputs = WORKFLOW[True]["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"audit_id", "head_sha", "label", "plan", "plan_url"}
    assert [k for k, v in inputs.items() if v.get("required")] == ["audit_id", "head_sha", "label"]
    job = WORKFLOW["jobs"]["suites"]
    assert job["runs-on"] == ["self-hosted", "${{ inputs.label }}"]
    steps = {s["name"]: s for s in job["steps"]}
    assert steps["Check out the audited commit"]["with"]["ref"] == "${{ inputs.head_sha }}"
    assert "runner.execute" in steps["Run the suites"]["run"]
    upload = steps["Upload results.json"]
    assert upload["if"] == "always()" and upload["uses"].startswith("actions/upload-artifact@")
    assert upload["with"]["name"] == artifact_name("${{ inputs.audit_id }}", "${{ inputs.label }}")
    assert WORKFLOW["run-name"] == run_title("${{ inputs.audit_id }}", "${{ inputs.label }}")
    # user-controlled inputs reach shell steps only through env, never spliced into scripts
    for s in job["steps"]:
        assert "${{ inputs." not in s.get("run", "")


def test_dispatch_then_collect_end_to_end(gh, git_repo, tmp_path):
    repo, state = gh
    head = git_repo.commit_files({"check.py": "import sys\nsys.exit(int(sys.argv[1]))\n"})
    plan = plan_for(head)
    sent = Dispatcher(repo).dispatch(plan)
    assert [(d.label, d.ref) for d in sent] == [("sm120", "main"), ("sm90", "main")]
    assert [r["inputs"]["label"] for r in state.dispatches] == ["sm120", "sm90"]
    run_ids = {}
    for record in state.dispatches:
        inputs = record["inputs"]
        assert record["workflow"] == "drift-audit-gpu.yml" and record["ref"] == "main"
        share = from_json(Plan, inputs["plan"])
        assert {s.runner for s in share.suites} == {inputs["label"]} and share.head_sha == head
        # the runner side: the real entry point on this share of the plan
        (tmp_path / "plan.json").write_text(inputs["plan"])
        out = tmp_path / f"results-{inputs['label']}.json"
        cap = {"sm90": "9.0", "sm120": "12.0"}[inputs["label"]]
        execute(str(tmp_path / "plan.json"), str(out), label=inputs["label"], repo_dir=str(git_repo.path),
                capability=cap, log=lambda s: None)
        run_ids[inputs["label"]] = seed_run(state, record, out.read_text())

    results = Collector(repo).collect(run_ids["sm90"], "da-abc", head_sha=head)
    assert [(s.suite, s.runner, s.outcome) for s in results.suites] == [
        ("parity-rmsnorm", "sm90", "passed"), ("decode", "sm90", "error")]
    assert results.devices[0].compute_capability == "9.0"
    other = Collector(repo).collect(run_ids["sm120"], "da-abc")
    assert [(s.suite, s.runner) for s in other.suites] == [("parity-rmsnorm", "sm120")]


def test_large_plans_go_by_url_or_fail_clearly(gh):
    repo, state = gh
    plan = plan_for("a" * 40)
    with pytest.raises(ActionsError, match="over the 50 that fit in workflow_dispatch inputs; give the dispatcher a plan_url"):
        Dispatcher(repo, inline_max=50).dispatch(plan)
    assert state.dispatches == []
    urls = []
    d = Dispatcher(repo, inline_max=50, plan_url=lambda a, lbl: urls.append(lbl) or f"https://bot.example/audits/{a}/{lbl}.json")
    d.dispatch(plan, labels=["sm90"])
    assert state.dispatches[-1]["inputs"]["plan_url"] == "https://bot.example/audits/da-abc/sm90.json"
    assert "plan" not in state.dispatches[-1]["inputs"] and urls == ["sm90"]


def test_dispatch_errors_name_the_cause(gh, ghstub):
    repo, state = gh
    with pytest.raises(ActionsError, match="workflow .github/workflows/nope.yml not found; add it to the default branch"):
        Dispatcher(repo, workflow="nope.yml").dispatch(plan_for("a" * 40))
    state.add_workflow(REPO, "old.yml", inputs=["audit_id", "head_sha", "label"])
    with pytest.raises(ActionsError, match=r"dispatching the sm120 suites of da-abc failed: GitHub answered 422: "
                                           r"Unexpected inputs provided: \[\"plan\"\]"):
        Dispatcher(repo, workflow="old.yml").dispatch(plan_for("a" * 40))
    assert Dispatcher(repo).dispatch(Plan("x", "y", [])) == []


def results_text(audit_id="da-abc", head="a" * 40):
    return to_json(Results(audit_id=audit_id, head_sha=head))


def zipped(files):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
    return buf.getvalue()


@pytest.mark.parametrize("kind,artifact,message", [
    ("none", None, r"\(success\) uploaded no artifact named drift-audit-da-abc-<label>; the runner produced no results"),
    ("garbage", {"files": {"results.json": "{oops"}}, r"results.json is not valid JSON: Expecting property name"),
    ("not-results", {"files": {"results.json": "[1, 2]"}}, r"results.json is not a Results object"),
    ("bad-outcome", {"files": {"results.json": json.dumps({"audit_id": "da-abc", "head_sha": "a" * 40, "suites": [
        {"suite": "s", "runner": "sm90", "outcome": "melted"}]})}}, r"is not a valid Results object"),
    ("no-file", {"files": {"log.txt": "hi"}}, r"no results.json in the artifact \(it holds log.txt\)"),
    ("not-zip", {"raw_zip": b"PK-but-not-really"}, r"the artifact is not a zip archive"),
    ("expired", {"files": {"results.json": results_text()}, "expired": True}, r"the artifact has expired"),
    ("other-audit", {"files": {"results.json": results_text("da-zzz")}}, r"results are for audit 'da-zzz', not 'da-abc'"),
    ("other-head", {"files": {"results.json": results_text(head="b" * 40)}}, r"results are for head bbbbbbbbbbbb"),
])
def test_collect_rejects_bad_artifacts(gh, kind, artifact, message):
    repo, state = gh
    record = {"inputs": {"audit_id": "da-abc", "label": "sm90", "head_sha": "a" * 40}}
    run_id = seed_run(state, record, **(artifact or {}))
    with pytest.raises(ActionsError, match=message):
        Collector(repo).collect(run_id, "da-abc", head_sha="a" * 40)


def test_collect_size_limits_and_run_state(gh):
    repo, state = gh
    record = {"inputs": {"audit_id": "da-abc", "label": "sm90", "head_sha": "a" * 40}}
    big = results_text()[:-2] + ', "padding": "' + "x" * 5000 + '"}'
    run_id = seed_run(state, record, big)
    with pytest.raises(ActionsError, match=r"artifact 'drift-audit-da-abc-sm90': \d+ bytes, over the 100 limit"):
        Collector(repo, max_artifact_bytes=100).collect(run_id, "da-abc")
    with pytest.raises(ActionsError, match=r"results.json is \d+ bytes unzipped, over the 1000 limit"):
        Collector(repo, max_results_bytes=1000).collect(run_id, "da-abc")
    assert Collector(repo).collect(run_id, "da-abc").audit_id == "da-abc"  # unknown keys are ignored

    run = state.add_run(REPO, head_sha="f" * 40, status="in_progress", conclusion=None)
    with pytest.raises(ActionsError, match=f"run {run['id']} is in_progress; collect it once it has completed"):
        Collector(repo).collect(run["id"], "da-abc")
    with pytest.raises(ActionsError, match="run 999999: no such workflow run"):
        Collector(repo).collect(999999, "da-abc")


def test_workflow_run_events_are_matched_to_audits():
    payload = json.loads((FIXTURES / "workflow_run.completed.json").read_text())
    assert run_of_event(payload) is None  # someone else's workflow
    ours = copy.deepcopy(payload)
    ours["workflow_run"].update(display_title=run_title("da-1234-ab", "sm120"),
                                path=".github/workflows/drift-audit-gpu.yml")
    assert run_of_event(ours) == (payload["workflow_run"]["id"], "da-1234-ab", "sm120")
    assert parse_run_title("Drift Audit da-1 on sm90") == ("da-1", "sm90")
    assert parse_run_title("Drift Audit") is None
