"""The stand-in is no more lenient than GitHub: driven by the real PyGithub client, every operation it serves is
checked against GitHub's OpenAPI description, and the behaviours GitHub documents beside it are enforced."""

from __future__ import annotations

import requests
from github import Auth, Github, GithubException, GithubIntegration

from tests.ghstub import start_stub
from tests.ghstub.contract import contract
from tests.ghstub.fixtures import assert_kept_contract
from tests.gitrepo import commit, init_repo

REPO = "octo/eng"
SHA = "a" * 40
BASE = "b" * 40
ANN = {"path": "engine/x.py", "start_line": 1, "end_line": 1, "annotation_level": "warning", "message": "m"}


def client(base: str, state, installation: int = 1) -> Github:
    """A real PyGithub client that does not retry: these tests look at GitHub's first answer."""
    token = state.mint_token(installation)["token"]
    return Github(auth=Auth.Token(token), base_url=base, retry=None, seconds_between_requests=0,
                  seconds_between_writes=0)


def seeded(state) -> None:
    state.add_repo(REPO)
    state.add_commit(REPO, SHA)
    state.add_pull(REPO, 7, head_sha=SHA, base_sha=BASE, files=[
        {"filename": "engine/x.py", "status": "modified", "additions": 1, "deletions": 0, "changes": 1,
         "sha": "e" * 40, "patch": "+x = 1"}])


def refused(fn, status: int) -> GithubException:
    try:
        fn()
    except GithubException as exc:
        assert exc.status == status, (exc.status, exc.data)
        return exc
    raise AssertionError(f"expected GitHub to answer {status}")


def test_every_operation_is_validated_and_the_stand_in_keeps_the_contract(ghstub):
    """All 30 operations of the description, each through the client call the bot makes."""
    base, state = ghstub
    seeded(state)
    state.add_workflow(REPO, inputs=["audit_id", "label"])
    gi = GithubIntegration(auth=Auth.AppAuth(state.app_id, state.private_key), base_url=base)
    gi.get_app()
    inst = gi.get_repo_installation("octo", "eng")
    token = gi.get_access_token(inst.id).token
    g = Github(auth=Auth.Token(token), base_url=base, retry=None, seconds_between_requests=0,
               seconds_between_writes=0)
    g.get_rate_limit()
    repo = g.get_repo(REPO)
    pr = repo.get_pull(7)
    assert [f.filename for f in pr.get_files()] == ["engine/x.py"]
    issue = repo.get_issue(7)
    c = issue.create_comment("hello")
    assert [x.id for x in issue.get_comments()] == [c.id]
    c = issue.get_comment(c.id)
    c.edit("edited")
    c.create_reaction("eyes")
    assert [r.content for r in c.get_reactions()] == ["eyes"]
    run = repo.create_check_run(name="Drift Audit", head_sha=SHA, status="in_progress")
    run.edit(output={"title": "t", "summary": "s", "annotations": [ANN]})
    assert repo.get_check_run(run.id).status == "in_progress"
    assert len(list(run.get_annotations())) == 1
    assert [r.id for r in repo.get_commit(SHA).get_check_runs()] == [run.id]
    assert repo.get_collaborator_permission("someone") == "read"
    wf = repo.get_workflow("drift-audit-gpu.yml")
    assert wf.create_dispatch("main", {"audit_id": "a1", "label": "sm90"})
    wr = state.add_run(REPO, head_sha=SHA)
    art = state.add_artifact(wr["id"], "drift-audit-a1-sm90", {"results.json": "{}"})
    assert [r.id for r in wf.get_runs()] == [wr["id"]]
    assert [r.id for r in repo.get_workflow_runs()] == [wr["id"]]
    run_obj = repo.get_workflow_run(wr["id"])
    assert [a.name for a in run_obj.get_artifacts()] == [art["name"]]
    assert [a.id for a in repo.get_artifacts()] == [art["id"]]
    got = repo.get_artifact(art["id"])
    zipped = requests.get(got.archive_download_url, headers={"Authorization": f"token {token}"},
                          allow_redirects=False, timeout=5)
    assert zipped.status_code == 302
    every = {op.id for op in contract().operations}
    assert len(every) == 30 and set(state.validated) == every, sorted(every - set(state.validated))
    assert state.violations == []


def test_a_request_that_breaks_the_contract_is_refused_and_recorded(ghstub):
    base, state = ghstub
    seeded(state)
    repo = client(base, state).get_repo(REPO)
    run = repo.create_check_run(name="Drift Audit", head_sha=SHA)
    refused(lambda: run.edit(output={"title": "t", "summary": "s", "annotations": [ANN] * 51}), 422)
    broken = state.take_violations()
    assert [v.where for v in broken] == ["request"]
    assert "has more than 50 items" in broken[0].detail and "checks/update" in str(broken[0])
    err = refused(lambda: run.edit(conclusion="stale"), 422)  # in the schema's enum, but only GitHub may set it
    assert "conclusion" in err.data["errors"][0]["field"] and state.violations == []


def test_an_answer_that_breaks_the_contract_fails_the_run():
    """A stand-in bug (a required field missing from an answer) is caught, not passed on to the client."""
    base, state, stop = start_stub()
    try:
        seeded(state)
        state.pulls[(REPO, 7)]["title"] = 7  # a stand-in bug: the wrong type in an answer
        client(base, state).get_repo(REPO).get_pull(7)
        broken = [str(v) for v in state.violations]
        assert any("pulls/get response: 200 body.title: 7 is not of type 'string'" in v for v in broken), broken
        try:
            assert_kept_contract(state)
        except BaseException as exc:  # pytest.fail raises an OutcomeException
            assert "contract violation" in str(exc)
        else:
            raise AssertionError("a broken answer must fail the test")
    finally:
        stop()


def test_listing_check_runs_honours_filter(ghstub):
    base, state = ghstub
    seeded(state)
    repo = client(base, state).get_repo(REPO)
    first = repo.create_check_run(name="Drift Audit", head_sha=SHA, conclusion="failure",
                                  output={"title": "t", "summary": "s"})
    second = repo.create_check_run(name="Drift Audit", head_sha=SHA, status="in_progress")
    other = repo.create_check_run(name="lint", head_sha=SHA, status="queued")
    commit_ = repo.get_commit(SHA)
    assert sorted(r.id for r in commit_.get_check_runs()) == sorted([second.id, other.id])  # default: latest
    assert sorted(r.id for r in commit_.get_check_runs(filter="all")) == sorted([first.id, second.id, other.id])
    assert [r.id for r in commit_.get_check_runs(check_name="Drift Audit", filter="all", status="completed")] == [
        first.id
    ]
    refused(lambda: list(commit_.get_check_runs(filter="newest")), 422)
    assert "query parameter 'filter'" in str(state.take_violations("filter")[0])


def test_apps_may_edit_only_their_own_comments_and_check_runs(ghstub):
    base, state = ghstub
    seeded(state)
    state.apps[777] = "other-bot"
    state.add_installation(2, "octo", app_id=777)
    repo = client(base, state).get_repo(REPO)
    theirs = state.add_comment(REPO, 7, "<!-- drift-audit -->", app_id=777)
    human = state.add_comment(REPO, 7, "<!-- drift-audit -->", user="alice")
    issue = repo.get_issue(7)
    for seeded_comment in (theirs, human):
        c = issue.get_comment(seeded_comment["id"])
        err = refused(lambda c=c: c.edit("mine now"), 403)
        assert err.data["message"] == "Resource not accessible by integration"
    assert state.comments[theirs["id"]]["body"] == "<!-- drift-audit -->"
    listed = {c.id: c.user.login for c in issue.get_comments()}
    assert listed[theirs["id"]] == "other-bot[bot]" and listed[human["id"]] == "alice"
    mine = issue.create_comment("ours")
    mine.edit("ours, edited")  # our own comment: allowed
    foreign_run = state.add_check_run(REPO, SHA, "Drift Audit", app_id=777, status="in_progress", conclusion=None)
    run = repo.get_check_run(foreign_run["id"])
    assert run.app.slug == "other-bot"
    refused(lambda: run.edit(conclusion="success"), 403)
    assert state.check_runs[foreign_run["id"]]["status"] == "in_progress"
    g = client(base, state)
    _, ours = g.requester.requestJsonAndCheck("GET", f"/repos/{REPO}/commits/{SHA}/check-runs",
                                              parameters={"app_id": str(state.app_id)})
    _, foreign = g.requester.requestJsonAndCheck("GET", f"/repos/{REPO}/commits/{SHA}/check-runs",
                                                 parameters={"app_id": "777"})
    assert ours["total_count"] == 0 and [r["id"] for r in foreign["check_runs"]] == [foreign_run["id"]]


def test_shas_must_be_commits_of_the_repository(ghstub, tmp_path):
    base, state = ghstub
    src = init_repo(tmp_path / "src")
    real = commit(src, {"a.py": "x = 1\n"}, "first")
    state.add_repo(REPO, str(src))
    repo = client(base, state).get_repo(REPO)
    err = refused(lambda: repo.create_check_run(name="Drift Audit", head_sha="c" * 40), 422)
    assert "No commit found for SHA" in err.data["errors"][0]["message"]
    refused(lambda: repo.get_commit("c" * 40).sha, 422)
    assert repo.get_commit(real).sha == real  # a commit of the repo's git history
    assert repo.create_check_run(name="Drift Audit", head_sha=real).head_sha == real
    later = commit(src, {"a.py": "x = 2\n"}, "second")  # committed after the first lookups
    assert repo.create_check_run(name="Drift Audit", head_sha=later).head_sha == later


def test_annotation_limits(ghstub):
    base, state = ghstub
    seeded(state)
    run = client(base, state).get_repo(REPO).create_check_run(name="Drift Audit", head_sha=SHA)

    def send(**change):
        return lambda: run.edit(output={"title": "t", "summary": "s", "annotations": [dict(ANN, **change)]})

    assert "title is too long" in refused(send(title="t" * 256), 422).data["errors"][0]["message"]
    assert "message is too long" in refused(send(message="m" * (64 * 1024 + 1)), 422).data["errors"][0]["message"]
    refused(send(raw_details="d" * (64 * 1024 + 1)), 422)
    refused(send(end_line=3, start_column=1, end_column=2), 422)  # columns only on a single line
    refused(send(path="/abs/x.py"), 422)
    refused(lambda: run.edit(output={"title": "t", "summary": "s", "annotations": [
        {k: v for k, v in ANN.items() if k != "path"}]}), 422)
    assert len(state.take_violations("'path' is a required property")) == 1
    run.edit(output={"title": "t", "summary": "s", "annotations": [dict(ANN, title="t" * 255)]})
    assert state.annotations[run.id][0]["title"] == "t" * 255


def test_statuses_reserved_for_actions_are_refused_from_an_app(ghstub):
    base, state = ghstub
    seeded(state)
    repo = client(base, state).get_repo(REPO)
    for status in ("waiting", "requested", "pending"):
        refused(lambda s=status: repo.create_check_run(name="Drift Audit", head_sha=SHA, status=s), 422)
    run = repo.create_check_run(name="Drift Audit", head_sha=SHA, status="queued")
    refused(lambda: run.edit(status="pending"), 422)
    assert state.check_runs[run.id]["status"] == "queued" and len(state.check_runs) == 1
    assert len(state.take_violations("request: body")) == 4  # the description's status branches refuse them


def test_workflow_dispatch_input_limits(ghstub):
    base, state = ghstub
    seeded(state)
    declared = [f"i{n}" for n in range(26)]
    state.add_workflow(REPO, inputs=declared, required=["i0"])
    wf = client(base, state).get_repo(REPO).get_workflow("drift-audit-gpu.yml")
    refused(lambda: wf.create_dispatch("main", {n: "x" for n in declared}, throw=True), 422)  # 26 > 25
    assert len(state.take_violations("more than 25 properties")) == 1
    assert wf.create_dispatch("main", {n: "x" for n in declared[:25]}, throw=True)
    err = refused(lambda: wf.create_dispatch("main", {"i0": "x" * 65536}, throw=True), 422)
    assert "too large" in err.data["message"]
    err = refused(lambda: wf.create_dispatch("main", {"i1": "x"}, throw=True), 422)
    assert "Required input 'i0'" in err.data["message"]
    err = refused(lambda: wf.create_dispatch("main", {"i0": "x", "bogus": "1"}, throw=True), 422)
    assert "Unexpected inputs" in err.data["message"]
    assert len(state.dispatches) == 1


def test_content_creation_limits_answer_like_github(ghstub):
    base, state = ghstub
    seeded(state)
    state.limits.content_per_minute, state.limits.content_per_hour = 3, 5
    issue = client(base, state).get_repo(REPO).get_issue(7)
    for i in range(3):
        issue.create_comment(f"c{i}")
    err = refused(lambda: issue.create_comment("c3"), 403)
    assert "secondary rate limit" in err.data["message"] and 1 <= int((err.headers or {})["retry-after"]) <= 61
    assert len(state.comments_on(REPO, 7)) == 3  # a refused create does not land
    state.advance(61)
    issue.create_comment("c3")
    issue.create_comment("c4")
    state.advance(61)
    err = refused(lambda: issue.create_comment("c5"), 403)  # the hourly 500 (here 5) still binds
    assert int((err.headers or {})["retry-after"]) > 60
    state.limits.secondary_status, state.limits.retry_after = 429, False
    err = refused(lambda: issue.create_comment("c5"), 429)
    assert "retry-after" not in (err.headers or {})  # then the client must wait at least a minute
    assert state.secondary_refusals == 3


def test_primary_rate_limit_answers_403_until_the_reset(ghstub):
    base, state = ghstub
    seeded(state)
    state.rate_limit = 4
    g = client(base, state)
    repo = g.get_repo(REPO)
    repo.get_pull(7)
    repo.get_pull(7)
    repo.get_pull(7)
    err = refused(lambda: repo.get_pull(7), 403)
    assert "API rate limit exceeded" in err.data["message"]
    assert (err.headers or {})["x-ratelimit-remaining"] == "0"
    reset = int((err.headers or {})["x-ratelimit-reset"])
    assert 0 < reset - state.now() <= 3600
    state.advance(reset - state.now() + 1)
    assert repo.get_pull(7).number == 7


def test_custom_repository_roles_come_back_in_role_name(ghstub):
    base, state = ghstub
    seeded(state)
    state.set_permission(REPO, "sec", "security-engineer", base="write")
    state.set_permission(REPO, "tri", "triage")
    g = client(base, state)
    _, sec = g.requester.requestJsonAndCheck("GET", f"/repos/{REPO}/collaborators/sec/permission")
    assert (sec["permission"], sec["role_name"], sec["user"]["permissions"]["push"]) == (
        "write", "security-engineer", True)
    _, tri = g.requester.requestJsonAndCheck("GET", f"/repos/{REPO}/collaborators/tri/permission")
    assert (tri["permission"], tri["role_name"], tri["user"]["permissions"]["push"]) == ("read", "triage", False)
