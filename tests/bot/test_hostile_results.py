"""Nothing a PR (or a drive-by commenter) controls may make the comment or the check run say what no audit
earned: a newer check run from an audit that ran less, a comment edited as another one because it quotes our
hidden marker, a fork's own workflow run standing in for the GPU run the bot is waiting for."""

from __future__ import annotations

import json

from bot.publish import COMMENT_MARKER, reply_marker
from bot.security import Redactor
from checks.model import Results, SuiteResult
from runner.actions import artifact_name, run_title
from tests.bot.conftest import GPU_CONFIG, REPO, answer_dispatches, pr_payload, signed_results, workflow_run_payload
from tests.bot.test_bot_flows import _comment_payload, _marked
from tests.gitrepo import commit


def _gpu_pr_that_fails(state, gpu_repo, number: int, outcome: str = "failed") -> tuple[str, list[dict]]:
    """A writer's branch PR whose sm90 suite runs on the GPU runners and comes back ``outcome``."""
    repo_path, base, head = gpu_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, number, head_sha=head, base_sha=base)
    state.add_workflow(REPO)
    state.set_permission(REPO, "maintainer", "write")
    return head, answer_dispatches(state, outcome)


def _failed_head(bot_factory, gpu_repo, number: int):
    """(bot, state, head, its check run) once PR ``number``'s GPU results came back failed and its check run says so."""
    make, state = bot_factory
    head, runs = _gpu_pr_that_fails(state, gpu_repo, number)
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=number, head=head, base=gpu_repo[1]))
    bot.settle()
    bot.deliver("workflow_run", workflow_run_payload(runs[0]))
    bot.settle()
    (failed,) = state.check_runs_for(REPO, head)
    assert failed["conclusion"] == "failure"
    return bot, state, head, failed


def _say(bot, state, number: int, body: str, user: str) -> dict:
    asked = state.add_comment(REPO, number, body, user=user)
    assert bot.deliver("issue_comment", _comment_payload(number, body, user, asked["id"])).status_code == 202
    bot.settle()
    return asked


def test_a_non_writers_audit_does_not_turn_a_failed_gpu_check_green(bot_factory, gpu_repo):
    bot, state, head, failed = _failed_head(bot_factory, gpu_repo, 51)
    (comment,) = _marked(state, 51)
    before = comment["body"]

    for body in ("/audit", "/audit pillars=runtime", "/audit run parity-loader"):
        asked = _say(bot, state, 51, body, "stranger")  # read access: anyone on a public repository
        assert [r["content"] for r in state.reactions[asked["id"]]] == ["eyes", "confused"], body
        (reply,) = [c for c in state.comments_on(REPO, 51) if c["body"].startswith(reply_marker(asked["id"]))]
        assert "write access" in reply["body"], body
    # GitHub shows the newest run of a check: a second one, from an audit that ran no GPU suite, would read green
    assert [c["id"] for c in state.check_runs_for(REPO, head)] == [failed["id"]]
    assert state.check_runs[failed["id"]]["conclusion"] == "failure"
    assert state.comments[comment["id"]]["body"] == before
    assert len(state.dispatches) == 1

    _say(bot, state, 51, "/audit retry", "maintainer")  # a writer may re-run it
    assert len(state.dispatches) == 2
    # the tested code can read workflow_dispatch inputs (the event payload on the runner's disk): no secret there
    secrets = Redactor(bot.settings, bot.service.app.issued_tokens).secrets()
    assert secrets and not [s[:6] for s in secrets if s in json.dumps(state.dispatches)]


def test_a_non_writers_audit_runs_on_a_head_not_audited_yet(bot_factory, gpu_repo):
    make, state = bot_factory
    head, _ = _gpu_pr_that_fails(state, gpu_repo, 52)
    bot = make()  # installed after the PR opened: no audit of its head yet
    asked = _say(bot, state, 52, "/audit", "stranger")
    assert state.dispatches == []  # the GPU suite waits for a writer
    (run,) = state.check_runs_for(REPO, head)
    assert run["status"] == "completed"
    (comment,) = _marked(state, 52)
    assert "write access" in comment["body"]
    assert [r["content"] for r in state.reactions[asked["id"]]] == ["eyes", "rocket"]


def test_our_marker_quoted_in_a_reply_does_not_make_it_the_audit_comment(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 53, head_sha=head, base_sha=base, draft=True)
    bot = make()
    assert bot.deliver("pull_request", pr_payload("opened", number=53, head=head, base=base, draft=True)).json()[
        "status"] == "ignored"
    # a backslash-escaped "<" is plain text to CommonMark, so the command text carries the marker verbatim
    asked = _say(bot, state, 53, "/audit run \\<!-- drift-audit:comment -->", "stranger")
    (reply,) = [c for c in state.comments_on(REPO, 53) if c["body"].startswith(reply_marker(asked["id"]))]
    assert COMMENT_MARKER in reply["body"]  # quoted, inside a code span
    reply_body = reply["body"]

    state.pulls[(REPO, 53)]["draft"] = False
    bot.deliver("pull_request", pr_payload("ready_for_review", number=53, head=head, base=base))
    bot.settle()
    assert state.comments[reply["id"]]["body"] == reply_body  # the reply was not turned into the audit comment
    (comment,) = _marked(state, 53)
    assert comment["id"] != reply["id"] and head[:12] in comment["body"]


def test_a_reply_marker_in_a_file_name_does_not_make_the_audit_comment_a_reply(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, _ = engine_repo
    state.add_repo(REPO, str(repo_path))
    asked = state.add_comment(REPO, 54, "/audit frobnicate", user="stranger")  # ids are guessable on GitHub
    head = commit(repo_path, {f"engine/{reply_marker(asked['id'])}.py": "x = 1\n"}, "a file named like our marker")
    state.add_pull(REPO, 54, head_sha=head, base_sha=base)
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=54, head=head, base=base))
    bot.settle()
    (comment,) = _marked(state, 54)
    assert reply_marker(asked["id"]) in comment["body"]  # the file name, quoted in a code span
    audit_body = comment["body"]

    bot.deliver("issue_comment", _comment_payload(54, "/audit frobnicate", "stranger", asked["id"]))
    bot.settle()
    assert state.comments[comment["id"]]["body"] == audit_body  # not overwritten by the help reply
    (reply,) = [c for c in state.comments_on(REPO, 54) if c["body"].startswith(reply_marker(asked["id"]))]
    assert reply["id"] != comment["id"] and "unknown option" in reply["body"]


def test_a_forks_own_run_with_our_run_name_does_not_stand_in_for_the_gpu_run(bot_factory, gpu_repo):
    make, state = bot_factory
    head, runs = _gpu_pr_that_fails(state, gpu_repo, 55, outcome="passed")
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=55, head=head, base=gpu_repo[1]))
    bot.settle()
    (dispatch,) = state.dispatches
    audit_id = dispatch["inputs"]["audit_id"]  # public: it is the dispatched run's title
    (pending,) = state.check_runs_for(REPO, head)
    assert pending["status"] == "in_progress"

    # a fork's pull_request workflow, its own copy of drift-audit-gpu.yml, titled like our run
    forged = state.add_run(REPO, head_sha=head, event="pull_request", head_branch="feature",
                           display_title=run_title(audit_id, "sm90"))
    fake = Results(audit_id, head, [SuiteResult("parity-loader", "sm90", "failed", reason="forged")])
    state.add_artifact(forged["id"], artifact_name(audit_id, "sm90"), {"results.json": fake.audit_id}, signed=False)
    payload = workflow_run_payload(forged)
    payload["workflow_run"]["head_repository"]["full_name"] = "stranger/octo-repo"
    assert bot.deliver("workflow_run", payload).json()["status"] == "ignored"
    same_repo = workflow_run_payload(forged)  # even from a branch of the repository: not a dispatch
    assert bot.deliver("workflow_run", same_repo).json()["status"] == "ignored"
    bot.settle()
    assert state.check_runs[pending["id"]]["status"] == "in_progress"
    assert bot.store.audit(audit_id).pending == ["sm90"]

    bot.deliver("workflow_run", workflow_run_payload(runs[0]))  # the dispatched run still counts
    bot.settle()
    assert state.check_runs[pending["id"]]["conclusion"] == "success"


def test_a_role_counts_by_what_it_grants_never_by_its_name():
    from bot.security import Permission

    assert not Permission(role_name="maintain", permission="read").writes  # a custom role named like a built-in
    assert not Permission(role_name="write", permission="triage").writes
    assert Permission(role_name="maintain", permission="write").writes  # the built-in maintain role
    assert Permission(role_name="release-engineer", permission="read", push=True).writes


def test_a_forks_reopen_does_not_paint_over_its_gpu_run_pending_or_failed(bot_factory, gpu_repo):
    from tests.bot.test_bot_approvals import _approve, _fork_pr, _opened

    make, state = bot_factory
    _, base, head = _fork_pr(state, gpu_repo, 56)
    runs: list[dict] = []

    def on_dispatch(st, record):
        inputs = record["inputs"]
        run = st.add_run(REPO, head_sha=inputs["head_sha"], display_title=run_title(inputs["audit_id"], inputs["label"]))
        results = Results(inputs["audit_id"], inputs["head_sha"], [SuiteResult("parity-loader", "sm90", "failed")])
        st.add_artifact(run["id"], artifact_name(inputs["audit_id"], inputs["label"]),
                        signed_results(REPO, inputs["label"], results))
        runs.append(run)

    def newest() -> dict:
        return max(state.check_runs_for(REPO, head), key=lambda r: r["id"])

    state.on_dispatch = on_dispatch
    bot = make()
    bot.deliver("pull_request", _opened(56, head, base))
    bot.settle()
    _approve(bot, state, 56)
    bot.settle()
    assert len(state.dispatches) == 1 and newest()["status"] == "in_progress"

    # the fork's author closes and reopens while the approved GPU run is still going: an audit that may not
    # dispatch anything must not conclude a newer, green check run over the one waiting for the GPU
    bot.deliver("pull_request", _opened(56, head, base, action="reopened"))
    bot.settle()
    assert newest()["status"] == "in_progress", newest()  # was: completed / success
    bot.deliver("workflow_run", workflow_run_payload(runs[0]))
    bot.settle()
    unapproved, approved, reopened = sorted(state.check_runs_for(REPO, head), key=lambda r: r["id"])
    # before the approval the selected GPU suites wait for a writer: a required check must not pass meanwhile
    assert unapproved["conclusion"] == "action_required", unapproved
    assert unapproved["output"]["title"].startswith("GPU suites wait for a writer's /audit"), unapproved["output"]
    assert approved["conclusion"] == reopened["conclusion"] == "failure"  # the run's result reached both

    bot.deliver("pull_request", _opened(56, head, base, action="ready_for_review"))  # and once it has failed
    bot.settle()
    assert newest()["status"] == "completed" and newest()["conclusion"] == "failure"  # was: success
    assert len(state.dispatches) == 1
    (comment,) = _marked(state, 56)
    assert "parity-loader" in comment["body"] and "❌" in comment["body"]


def test_a_head_that_rewrites_the_config_is_audited_by_the_base_config(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, _ = gpu_repo
    weakened = commit(repo_path, {".github/drift-audit.toml": "[settings]\nfail_on = []\n",  # no suites, nothing fails
                                  "engine/weights/loader.py": "def load(path):\n    return {'w': 9}\n"}, "weaken")
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 57, head_sha=weakened, base_sha=base)
    state.add_workflow(REPO)
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=57, head=weakened, base=base))
    bot.settle()
    (dispatch,) = state.dispatches  # the base's sm90 suite was selected and sent, whatever the head's config says
    assert dispatch["inputs"]["head_sha"] == weakened and "parity-loader" in dispatch["inputs"]["plan"]


def test_a_run_in_another_installed_repository_cannot_report_for_this_ones_audit(bot_factory, gpu_repo):
    make, state = bot_factory
    head, runs = _gpu_pr_that_fails(state, gpu_repo, 58, outcome="failed")
    attacker = "mallory/own-repo"  # anyone can install a public App on a repository of their own
    state.add_repo(attacker, str(gpu_repo[0]), installation_id=2)
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=58, head=head, base=gpu_repo[1]))
    bot.settle()
    (dispatch,) = state.dispatches
    audit_id = dispatch["inputs"]["audit_id"]

    # a workflow_dispatch run in their own repository, titled for our audit, with results signed under *their*
    # repository's key (the operator gives each installed repository its key)
    forged = state.add_run(attacker, head_sha=head, display_title=run_title(audit_id, "sm90"))
    forged["_inputs"] = {"audit_id": audit_id, "label": "sm90", "head_sha": head}
    fake = Results(audit_id, head, [SuiteResult("parity-loader", "sm90", "passed")])
    state.add_artifact(forged["id"], artifact_name(audit_id, "sm90"), signed_results(attacker, "sm90", fake))
    payload = workflow_run_payload(forged, repo=attacker, installation=2)
    assert bot.deliver("workflow_run", payload).status_code == 202
    bot.settle()
    record = bot.store.audit(audit_id)
    assert record.pending == ["sm90"]  # still waiting for its own run (was: the forged pass folded in)
    assert [s["outcome"] for s in json.loads(record.audit_json)["results"]["suites"]] == ["not-run"]

    bot.deliver("workflow_run", workflow_run_payload(runs[0]))
    bot.settle()
    (run,) = state.check_runs_for(REPO, head)
    assert run["conclusion"] == "failure"  # the real result, not the forged pass


TWO_LABELS = GPU_CONFIG + """
[[suite]]
id = "parity-loader-blackwell"
kind = "parity"
command = "pytest tests/test_loader.py"
runners = ["sm120"]
paths = ["engine/weights/**"]
"""


def test_results_of_two_labels_arriving_together_are_both_kept(bot_factory, tmp_path):
    from tests.gitrepo import git, init_repo

    make, state = bot_factory
    repo_path = init_repo(tmp_path / "two-labels")
    base = commit(repo_path, {".github/drift-audit.toml": TWO_LABELS, "engine/weights/loader.py": "x = 1\n"}, "base")
    git(repo_path, "checkout", "-q", "-b", "feature")
    head = commit(repo_path, {"engine/weights/loader.py": "x = 2\n"}, "head")
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 59, head_sha=head, base_sha=base)
    state.add_workflow(REPO)
    runs: list[dict] = []

    def on_dispatch(st, record):
        inputs = record["inputs"]
        label = inputs["label"]
        run = st.add_run(REPO, head_sha=inputs["head_sha"], display_title=run_title(inputs["audit_id"], label))
        suite = "parity-loader" if label == "sm90" else "parity-loader-blackwell"
        results = Results(inputs["audit_id"], inputs["head_sha"], [SuiteResult(suite, label, "passed")])
        st.add_artifact(run["id"], artifact_name(inputs["audit_id"], label), signed_results(REPO, label, results))
        runs.append(run)

    state.on_dispatch = on_dispatch
    bot = make(workers=2)
    bot.deliver("pull_request", pr_payload("opened", number=59, head=head, base=base))
    bot.settle()
    assert sorted(d["inputs"]["label"] for d in state.dispatches) == ["sm120", "sm90"]
    state.delays["GET /zip"] = 0.5  # both downloads in flight at once: each worker holds the record it read
    for run in runs:
        bot.deliver("workflow_run", workflow_run_payload(run))
    bot.settle()
    record = bot.store.audit(state.dispatches[0]["inputs"]["audit_id"])
    outcomes = {s["runner"]: s["outcome"] for s in json.loads(record.audit_json)["results"]["suites"]}
    assert record.pending == [] and outcomes == {"sm90": "passed", "sm120": "passed"}, (record.pending, outcomes)
    (run,) = state.check_runs_for(REPO, head)
    assert run["conclusion"] == "success"


def test_another_apps_check_run_with_our_name_and_external_id_is_never_taken_for_ours(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 60, head_sha=head, base_sha=base)
    decoy = state.add_check_run(REPO, head, app_id=777, status="in_progress")  # any app with checks: write
    decoy["external_id"] = "job:1"  # what our first job's run is called
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=60, head=head, base=base))
    bot.settle()
    (job,) = bot.store.jobs()
    assert job.status == "done" and job.check_run_id != decoy["id"], (job.status, job.error)
    ours = [r for r in state.check_runs_for(REPO, head) if r["id"] != decoy["id"]]
    assert len(ours) == 1 and ours[0]["status"] == "completed"
    assert state.check_runs[decoy["id"]]["status"] == "in_progress"  # left alone


def test_a_pytest_suite_that_passed_without_a_single_case_is_refused_when_recorded():
    """``os._exit(0)`` in a head's conftest.py: pytest "succeeds" having run nothing and writes no report, so the
    suite reads as passed with no case; the recording step refuses that instead of signing a pass."""
    from runner import signing

    dispatch = signing.Dispatch(REPO, "da-abc", "sm90", "a" * 40)
    plan = {"audit_id": "da-abc", "head_sha": "a" * 40, "suites": [
        {"id": "parity-loader", "kind": "parity", "command": "python -m pytest tests/test_loader.py", "runner": "sm90"},
        {"id": "bench", "kind": "unit", "command": "python bench.py", "runner": "sm90"}]}

    def raw(cases: list) -> bytes:
        return json.dumps({"audit_id": "da-abc", "head_sha": "a" * 40, "devices": [], "suites": [
            {"suite": "parity-loader", "runner": "sm90", "outcome": "passed", "cases": cases},
            {"suite": "bench", "runner": "sm90", "outcome": "passed", "cases": []}]}).encode()  # no pytest: fine

    results, problems = signing.checked_results(raw([]), plan, dispatch, "success")
    assert problems == ["pytest suite(s) parity-loader passed without reporting a single test case"]
    assert {s["outcome"] for s in results["suites"]} == {"error"}  # signed as tampering, never as a pass
    case = {"name": "test_load", "outcome": "passed"}
    assert signing.checked_results(raw([case]), plan, dispatch, "success")[1] == []
