"""The GitHub stand-in enforces GitHub's documented limits when driven by the real PyGithub client."""

from __future__ import annotations

import io
import zipfile

import pytest
import requests
from github import Auth, Github, GithubException, GithubIntegration, GithubRetry

from tests.ghstub import Fault, start_stub

SHA = "a" * 40


def _client(base: str, state) -> tuple[Github, str]:
    gi = GithubIntegration(auth=Auth.AppAuth(state.app_id, state.private_key), base_url=base)
    token = gi.get_access_token(1).token
    return Github(
        auth=Auth.Token(token),
        base_url=base,
        seconds_between_requests=0,
        seconds_between_writes=0,
        retry=GithubRetry(total=8, backoff_factor=0.01),
    ), token


def test_tokens_need_a_valid_app_jwt(ghstub):
    base, state = ghstub
    state.add_repo("octo/eng")
    state.add_commit("octo/eng", SHA)
    forged = Auth.AppAuth(state.app_id + 1, state.private_key)
    with pytest.raises(GithubException) as err:
        GithubIntegration(auth=forged, base_url=base).get_access_token(1)
    assert err.value.status == 401
    g, token = _client(base, state)
    assert token.startswith("ghs_") and state.tokens[token]["installation_id"] == 1
    assert g.get_repo("octo/eng").full_name == "octo/eng"
    with pytest.raises(GithubException) as err:
        Github(auth=Auth.Token("ghs_nope"), base_url=base).get_repo("octo/eng")
    assert err.value.status == 401 and err.value.data["message"] == "Bad credentials"


def test_comments_paginate_and_enforce_the_body_limit(ghstub):
    base, state = ghstub
    state.add_repo("octo/eng")
    state.add_commit("octo/eng", SHA)
    diff = "diff --git a/engine/x.py b/engine/x.py\n+x = 1\n"
    state.add_pull(
        "octo/eng",
        7,
        head_sha=SHA,
        base_sha="b" * 40,
        diff=diff,
        files=[
            {
                "filename": "engine/x.py",
                "status": "modified",
                "additions": 1,
                "deletions": 0,
                "changes": 1,
                "sha": "e" * 40,
                "patch": "+x = 1",
            }
        ],
    )
    g, token = _client(base, state)
    pr = g.get_repo("octo/eng").get_pull(7)
    assert [f.filename for f in pr.get_files()] == ["engine/x.py"]
    raw = requests.get(
        f"{base}/repos/octo/eng/pulls/7",
        timeout=5,
        headers={"Accept": "application/vnd.github.diff", "Authorization": f"token {token}"},
    )
    assert raw.text == diff and raw.headers["X-RateLimit-Limit"] == "5000"
    for i in range(35):
        state.add_comment("octo/eng", 7, f"comment {i}")
    bodies = [c.body for c in pr.get_issue_comments()]
    assert len(bodies) == 35 and bodies[-1] == "comment 34"  # two pages, followed through the Link header
    assert state.count("GET", "/issues/7/comments") == 2
    with pytest.raises(GithubException) as err:
        pr.create_issue_comment("x" * 65537)
    assert err.value.status == 422
    assert err.value.data["errors"][0]["message"] == "body is too long (maximum is 65536 characters)"
    c = pr.create_issue_comment("x" * 65536)
    c.edit("edited")
    assert state.comments[c.id]["body"] == "edited"
    c.create_reaction("eyes")
    c.create_reaction("eyes")  # the same reaction twice is one reaction, as on GitHub
    assert [r["content"] for r in state.reactions[c.id]] == ["eyes"]


def test_check_runs_enforce_annotation_and_text_limits(ghstub):
    base, state = ghstub
    state.add_repo("octo/eng")
    state.add_commit("octo/eng", SHA)
    g, _ = _client(base, state)
    repo = g.get_repo("octo/eng")
    run = repo.create_check_run(name="Drift Audit", head_sha=SHA, status="in_progress", external_id="job-1")
    ann = {"path": "a.py", "start_line": 1, "end_line": 1, "annotation_level": "warning", "message": "m"}
    with pytest.raises(GithubException) as err:
        run.edit(output={"title": "t", "summary": "s", "annotations": [ann] * 51})
    assert err.value.status == 422
    with pytest.raises(GithubException) as err:
        run.edit(output={"title": "t", "summary": "s" * 65536})
    assert err.value.status == 422
    with pytest.raises(GithubException):
        run.edit(status="completed")  # a completed run needs a conclusion
    assert len(state.take_violations("checks/update request")) == 3  # each refusal above broke the contract
    run.edit(output={"title": "t", "summary": "s", "annotations": [ann] * 50})
    run.edit(conclusion="failure", output={"title": "t", "summary": "s", "annotations": [ann] * 3})
    assert len(list(run.get_annotations())) == 53  # annotations accumulate across updates
    assert state.check_runs[run.id]["status"] == "completed"
    found = repo.get_commit(SHA).get_check_runs(check_name="Drift Audit")
    assert [c.external_id for c in found] == ["job-1"]


def test_actions_dispatch_runs_and_artifact_download(ghstub):
    base, state = ghstub
    state.add_repo("octo/eng")
    state.add_commit("octo/eng", SHA)
    state.add_workflow("octo/eng", inputs=["plan", "head_sha", "label", "audit_id"])
    g, token = _client(base, state)
    repo = g.get_repo("octo/eng")
    wf = repo.get_workflow("drift-audit-gpu.yml")
    assert wf.create_dispatch("main", {"plan": "{}", "head_sha": SHA, "label": "sm90", "audit_id": "a1"})
    assert state.dispatches[-1]["inputs"]["label"] == "sm90"
    with pytest.raises(GithubException) as err:
        repo._requester.requestJsonAndCheck(
            "POST",
            f"{base}/repos/octo/eng/actions/workflows/drift-audit-gpu.yml/dispatches",
            input={"ref": "main", "inputs": {"bogus": "1"}},
        )
    assert err.value.status == 422 and "Unexpected inputs" in err.value.data["message"]
    run = state.add_run("octo/eng", head_sha=SHA)
    state.add_artifact(run["id"], "drift-audit-a1", {"results.json": '{"ok": true}'})
    wr = repo.get_workflow_run(run["id"])
    (art,) = list(wr.get_artifacts())
    first = requests.get(
        art.archive_download_url, headers={"Authorization": f"token {token}"}, allow_redirects=False, timeout=5
    )
    assert first.status_code == 302
    blob = requests.get(first.headers["Location"], timeout=5)
    assert zipfile.ZipFile(io.BytesIO(blob.content)).read("results.json") == b'{"ok": true}'
    assert [r.id for r in repo.get_workflow_runs(head_sha=SHA)] == [run["id"]]


def test_rate_limit_headers_and_faults_under_a_ghe_prefix():
    base, state, stop = start_stub(prefix="/api/v3")
    try:
        state.add_repo("octo/eng")
        g, _ = _client(base, state)
        repo = g.get_repo("octo/eng")
        assert g.rate_limiting[0] < g.rate_limiting[1] == 5000
        state.fault = Fault(rate=0.3, seed=3)
        perms = {repo.get_collaborator_permission("someone") for _ in range(20)}
        assert perms == {"read"} and state.faults_injected > 0  # every call survived its injected faults
        assert any(s == 403 for _, _, s in state.requests) or any(s >= 500 for _, _, s in state.requests)
    finally:
        stop()
