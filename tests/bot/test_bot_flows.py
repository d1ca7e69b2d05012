"""Bot behaviour end to end over loopback: redelivery, supersede, /audit, fork safety, merge queue, GPU results."""

from __future__ import annotations

import json
import re
import time

from bot.publish import COMMENT_MARKER, reply_marker
from checks.model import DeviceFingerprint, Results, SuiteResult
from runner.actions import artifact_name, run_title
from tests.bot.conftest import (
    REPO,
    check_run_pr,
    fixture_payload,
    installation_lite,
    pr_payload,
    signed_results,
    wait_for,
    workflow_run_payload,
)
from tests.gitrepo import commit, git


def _comment_payload(number: int, body: str, user: str, comment_id: int) -> dict:
    p = fixture_payload("issue_comment.created")
    p["installation"] = installation_lite(1)
    p["repository"]["full_name"] = REPO
    p["issue"].update(number=number, pull_request={"url": f"https://api.github.com/repos/{REPO}/pulls/{number}"})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # written now, after every push the tests make
    p["comment"].update(id=comment_id, body=body, created_at=now, updated_at=now)
    p["comment"]["user"] = dict(p["comment"]["user"], login=user, type="User")
    return p


def _marked(state, number: int) -> list[dict]:
    return [c for c in state.comments_on(REPO, number) if c["body"].startswith(COMMENT_MARKER)]


def test_redelivery_and_a_new_push_edit_the_same_comment(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 7, head_sha=head, base_sha=base)
    bot = make()
    payload = pr_payload("opened", number=7, head=head, base=base)
    assert bot.deliver("pull_request", payload, "delivery-1").status_code == 202
    bot.settle()
    assert bot.deliver("pull_request", payload, "delivery-1").json()["status"] == "duplicate"
    new_head = commit(repo_path, {"engine/runtime/scheduler.py": "class Scheduler:\n    pass\n"}, "again")
    state.pulls[(REPO, 7)]["head"]["sha"] = new_head
    bot.deliver("pull_request", pr_payload("synchronize", number=7, head=new_head, base=base))
    bot.settle()
    (comment,) = _marked(state, 7)
    assert new_head[:12] in comment["body"] and state.count("POST", "/issues/7/comments") == 1
    assert len(state.check_runs_for(REPO, head)) == 1 and len(state.check_runs_for(REPO, new_head)) == 1
    assert len(bot.store.jobs()) == 2


def test_a_newer_push_supersedes_running_and_queued_audits(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, h1 = engine_repo
    h2 = commit(repo_path, {"README.md": "two\n"}, "two")
    h3 = commit(repo_path, {"README.md": "three\n"}, "three")
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 8, head_sha=h3, base_sha=base)
    state.delays["POST /check-runs"] = 1.0
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=8, head=h1, base=base))
    wait_for(lambda: state.arrived("POST", "/check-runs"))
    bot.deliver("pull_request", pr_payload("synchronize", number=8, head=h2, base=base))
    bot.deliver("pull_request", pr_payload("synchronize", number=8, head=h3, base=base))
    bot.settle()
    (first,) = state.check_runs_for(REPO, h1)
    assert first["conclusion"] == "cancelled" and h3[:12] in first["output"]["summary"]
    # superseded while queued: never started, and a queued check run it got on intake is closed
    assert all(c["conclusion"] == "cancelled" for c in state.check_runs_for(REPO, h2))
    (last,) = state.check_runs_for(REPO, h3)
    assert last["status"] == "completed" and last["conclusion"] != "cancelled"
    (comment,) = _marked(state, 8)
    assert h3[:12] in comment["body"]
    assert [j.status for j in bot.store.jobs()] == ["superseded", "superseded", "done"]


def test_help_and_unknown_options_reply_once(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 9, head_sha=head, base_sha=base)
    asked = state.add_comment(REPO, 9, "/audit frobnicate", user="alice")
    bot = make()
    payload = _comment_payload(9, "/audit frobnicate", "alice", asked["id"])
    bot.deliver("issue_comment", payload)
    bot.settle()
    bot.deliver("issue_comment", payload)  # a second delivery (new GUID) of the same comment
    bot.settle()
    replies = [c for c in state.comments_on(REPO, 9) if reply_marker(asked["id"]) in c["body"]]
    assert (
        len(replies) == 1 and "unknown option `frobnicate`" in replies[0]["body"] and "/audit run" in replies[0]["body"]
    )
    assert [r["content"] for r in state.reactions[asked["id"]]] == ["eyes", "confused"]
    assert state.check_runs == {}  # help never starts an audit


def test_gpu_suites_wait_for_a_writer_and_results_come_back(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = gpu_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(
        REPO,
        11,
        head_sha=head,
        base_sha=base,
        head_repo="stranger/octo-repo",
        author_association="FIRST_TIME_CONTRIBUTOR",
    )
    state.add_workflow(REPO, inputs=["plan", "plan_url", "head_sha", "label", "audit_id"])
    state.set_permission(REPO, "maintainer", "maintain")
    sent: list[dict] = []

    def on_dispatch(st, record):  # the self-hosted runner: a run that uploads Results for the audit
        inputs = record["inputs"]
        run = st.add_run(
            REPO, head_sha=inputs["head_sha"], display_title=run_title(inputs["audit_id"], inputs["label"])
        )
        results = Results(
            inputs["audit_id"],
            inputs["head_sha"],
            [SuiteResult("parity-loader", "sm90", "passed", duration=1.5)],
            [DeviceFingerprint("sm90", gpu="NVIDIA H200", compute_capability="9.0")],
        )
        st.add_artifact(
            run["id"], artifact_name(inputs["audit_id"], inputs["label"]), signed_results(REPO, inputs["label"], results)
        )
        sent.append(run)

    state.on_dispatch = on_dispatch
    bot = make()
    bot.deliver(
        "pull_request",
        pr_payload(
            "opened", number=11, head=head, base=base, fork="stranger/octo-repo", association="FIRST_TIME_CONTRIBUTOR"
        ),
    )
    bot.settle()
    assert state.dispatches == []  # a fork never reaches self-hosted runners on its own
    (comment,) = _marked(state, 11)
    assert "writer" in comment["body"]
    (run,) = state.check_runs_for(REPO, head)
    assert run["status"] == "completed"

    drive_by = state.add_comment(REPO, 11, "/audit full", user="stranger")
    bot.deliver("issue_comment", _comment_payload(11, "/audit full", "stranger", drive_by["id"]))
    bot.settle()
    assert state.dispatches == []
    assert [r["content"] for r in state.reactions[drive_by["id"]]] == ["eyes", "confused"]

    ok = state.add_comment(REPO, 11, "/audit", user="maintainer")
    bot.deliver("issue_comment", _comment_payload(11, "/audit", "maintainer", ok["id"]))
    bot.settle()
    (dispatch,) = state.dispatches
    assert dispatch["inputs"]["label"] == "sm90" and dispatch["ref"] == "main"
    assert [r["content"] for r in state.reactions[ok["id"]]] == ["eyes", "rocket"]
    pending = [c for c in state.check_runs_for(REPO, head) if c["status"] == "in_progress"]
    assert len(pending) == 1  # the writer's audit waits for the GPU results

    bot.deliver("workflow_run", workflow_run_payload(sent[0]))
    bot.settle()
    assert state.check_runs[pending[0]["id"]]["status"] == "completed"
    record = bot.store.audit(dispatch["inputs"]["audit_id"])
    assert record.status == "done" and record.pending == []
    assert '"outcome": "passed"' in record.audit_json.replace('":"', '": "')
    (comment,) = _marked(state, 11)
    assert "H200" in comment["body"] or "passed" in comment["body"]


def test_merge_queue_reports_on_the_queue_head(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    git(repo_path, "checkout", "-q", "main")
    git(repo_path, "merge", "-q", "--no-ff", "-m", "queue", "feature")
    mq_head = git(repo_path, "rev-parse", "HEAD")
    state.add_repo(REPO, str(repo_path))
    payload = fixture_payload("merge_group.checks_requested")
    payload["installation"] = installation_lite(1)
    payload["repository"]["full_name"] = REPO
    payload["merge_group"].update(head_sha=mq_head, base_sha=base)
    bot = make()
    bot.deliver("merge_group", payload)
    bot.settle()
    (run,) = state.check_runs_for(REPO, mq_head)
    assert run["status"] == "completed" and run["external_id"].startswith(f"mg:{base}:")
    assert state.comments == {}  # no PR to comment on

    rerun = fixture_payload("check_run.rerequested")
    rerun["installation"] = installation_lite(1)
    rerun["repository"]["full_name"] = REPO
    rerun["check_run"].update(id=run["id"], head_sha=mq_head, external_id=run["external_id"])
    rerun["check_run"]["app"]["id"] = state.app_id
    bot.deliver("check_run", rerun)
    bot.settle()
    assert len(state.check_runs_for(REPO, mq_head)) == 1  # the same run, concluded again
    assert state.count("PATCH", f"/check-runs/{run['id']}") >= 2


def test_hostile_file_names_are_escaped_in_the_comment_and_the_page(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, _ = engine_repo
    nasty = "engine/<img src=x onerror=alert(1)>.py"
    head = commit(repo_path, {nasty: "x = 1\n"}, "nasty")
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 14, head_sha=head, base_sha=base)
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=14, head=head, base=base))
    bot.settle()
    (comment,) = _marked(state, 14)
    outside_code = re.sub(r"(`+)(.+?)\1", "", comment["body"])  # GitHub renders code spans literally
    assert "onerror" in comment["body"] and "<img" not in outside_code
    (run,) = state.check_runs_for(REPO, head)
    page = bot.http.get(run["details_url"])
    assert page.status_code == 200 and "<img" not in page.text and "&lt;img src=x onerror=alert(1)&gt;" in page.text
    assert "&lt;b&gt;" in bot.http.get("/audits/<b>").text


def test_unknown_suite_in_a_command_is_answered_not_retried(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = gpu_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 15, head_sha=head, base_sha=base)
    state.set_permission(REPO, "maintainer", "admin")
    asked = state.add_comment(REPO, 15, "/audit run no-such-suite", user="maintainer")
    bot = make()
    bot.deliver("issue_comment", _comment_payload(15, "/audit run no-such-suite", "maintainer", asked["id"]))
    bot.settle()
    (job,) = bot.store.jobs()
    assert job.status == "done" and job.attempts == 1
    (reply,) = [c for c in state.comments_on(REPO, 15) if reply_marker(asked["id"]) in c["body"]]
    assert "unknown suite 'no-such-suite'" in reply["body"] and "parity-loader" in reply["body"]
    (run,) = state.check_runs_for(REPO, head)
    assert run["conclusion"] == "cancelled"  # no audit of the head concluded: a typo must not make it pass
    assert [r["content"] for r in state.reactions[asked["id"]]] == ["eyes", "confused"]


def test_pillars_command_restricts_the_report(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 16, head_sha=head, base_sha=base)
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=16, head=head, base=base))
    bot.settle()
    everything = bot.store.latest_audit(REPO, 16)
    assert {"weights", "runtime"} <= {p["id"] for p in json.loads(everything.audit_json)["pillars"]["pillars"]}
    state.set_permission(REPO, "alice", "write")  # narrowing the report is a writer's call (test_hostile_results)
    asked = state.add_comment(REPO, 16, "/audit pillars=weights", user="alice")
    bot.deliver("issue_comment", _comment_payload(16, "/audit pillars=weights", "alice", asked["id"]))
    bot.settle()
    (comment,) = _marked(state, 16)
    assert "Weight pipeline" in comment["body"] and "Runtime and scheduler" not in comment["body"]
    assert [r["content"] for r in state.reactions[asked["id"]]] == ["eyes", "rocket"]


def test_retry_reruns_only_failed_suites(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = gpu_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 17, head_sha=head, base_sha=base)
    state.add_workflow(REPO)
    state.set_permission(REPO, "maintainer", "write")
    runs: list[dict] = []

    def on_dispatch(st, record):
        inputs = record["inputs"]
        run = st.add_run(
            REPO, head_sha=inputs["head_sha"], display_title=run_title(inputs["audit_id"], inputs["label"])
        )
        outcome = "failed" if len(runs) == 0 else "passed"
        results = Results(inputs["audit_id"], inputs["head_sha"], [SuiteResult("parity-loader", "sm90", outcome)])
        st.add_artifact(
            run["id"], artifact_name(inputs["audit_id"], inputs["label"]), signed_results(REPO, inputs["label"], results)
        )
        runs.append(run)

    state.on_dispatch = on_dispatch
    bot = make()
    early = state.add_comment(REPO, 17, "/audit retry", user="maintainer")
    bot.deliver("issue_comment", _comment_payload(17, "/audit retry", "maintainer", early["id"]))
    bot.settle()
    assert state.dispatches == [] and "Nothing to retry" in state.comments_on(REPO, 17)[-1]["body"]

    bot.deliver("pull_request", pr_payload("opened", number=17, head=head, base=base))
    bot.settle()
    bot.deliver("workflow_run", workflow_run_payload(runs[0]))
    bot.settle()
    (first,) = state.check_runs_for(REPO, head, "Drift Audit")
    assert first["conclusion"] == "failure"

    again = state.add_comment(REPO, 17, "/audit retry", user="maintainer")
    bot.deliver("issue_comment", _comment_payload(17, "/audit retry", "maintainer", again["id"]))
    bot.settle()
    assert len(state.dispatches) == 2 and '"parity-loader"' in state.dispatches[1]["inputs"]["plan"]
    bot.deliver("workflow_run", workflow_run_payload(runs[1]))
    bot.settle()
    latest = [c for c in state.check_runs_for(REPO, head) if c["id"] != first["id"]]
    assert [c["conclusion"] for c in latest] == ["success"]
    assert len(_marked(state, 17)) == 1


def test_rerequested_pr_check_run_is_concluded_again_in_place(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 18, head_sha=head, base_sha=base)
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=18, head=head, base=base))
    bot.settle()
    (run,) = state.check_runs_for(REPO, head)
    rerun = fixture_payload("check_run.rerequested")
    rerun["installation"] = installation_lite(1)
    rerun["repository"]["full_name"] = REPO
    rerun["check_run"].update(
        id=run["id"],
        head_sha=head,
        external_id=run["external_id"],
        pull_requests=[check_run_pr(18, head, base)],
    )
    rerun["check_run"]["app"]["id"] = state.app_id
    patches = state.count("PATCH", f"/check-runs/{run['id']}")
    bot.deliver("check_run", rerun)
    bot.settle()
    assert [c["id"] for c in state.check_runs_for(REPO, head)] == [run["id"]]
    assert (
        state.count("PATCH", f"/check-runs/{run['id']}") > patches
        and state.check_runs[run["id"]]["status"] == "completed"
    )
    assert len(_marked(state, 18)) == 1

    newer = commit(repo_path, {"README.md": "moved on\n"}, "newer")
    state.pulls[(REPO, 18)]["head"]["sha"] = newer
    rerun["check_run"]["completed_at"] = state.check_runs[run["id"]]["completed_at"]  # a second click: a new event
    assert bot.deliver("check_run", rerun).status_code == 202
    # re-running the old head's check never audits (or dispatches) the new head
    bot.settle()
    assert state.check_runs_for(REPO, newer) == []
    assert state.check_runs[run["id"]]["conclusion"] == "cancelled"
    assert newer[:12] in state.check_runs[run["id"]]["output"]["summary"]


def test_a_new_push_closes_the_audit_waiting_for_gpu_results(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, h1 = gpu_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 19, head_sha=h1, base_sha=base)
    state.add_workflow(REPO)
    runs: list[dict] = []

    def on_dispatch(st, record):
        inputs = record["inputs"]
        run = st.add_run(REPO, head_sha=inputs["head_sha"], display_title=run_title(inputs["audit_id"], inputs["label"]))
        results = Results(inputs["audit_id"], inputs["head_sha"], [SuiteResult("parity-loader", "sm90", "passed")])
        st.add_artifact(run["id"], artifact_name(inputs["audit_id"], inputs["label"]), signed_results(REPO, inputs["label"], results))
        runs.append(run)

    state.on_dispatch = on_dispatch
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=19, head=h1, base=base))
    bot.settle()
    h2 = commit(repo_path, {"engine/weights/loader.py": "def load(path):\n    return {'w': 2}\n"}, "again")
    state.pulls[(REPO, 19)]["head"]["sha"] = h2
    bot.deliver("pull_request", pr_payload("synchronize", number=19, head=h2, base=base))
    bot.settle()
    (old_run,) = state.check_runs_for(REPO, h1)
    assert old_run["conclusion"] == "cancelled"
    (comment,) = _marked(state, 19)
    before = comment["body"]
    assert h2[:12] in before

    bot.deliver("workflow_run", workflow_run_payload(runs[0]))  # the old head's results arrive late
    bot.settle()
    assert state.comments[comment["id"]]["body"] == before and old_run["conclusion"] == "cancelled"
    bot.deliver("workflow_run", workflow_run_payload(runs[1]))
    bot.settle()
    (new_run,) = state.check_runs_for(REPO, h2)
    assert new_run["conclusion"] == "success" and state.comments[comment["id"]]["body"] != before


def test_check_run_is_queued_on_intake_while_workers_are_busy(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head_a = engine_repo
    head_b = commit(repo_path, {"README.md": "b\n"}, "b")
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 20, head_sha=head_a, base_sha=base)
    state.add_pull(REPO, 21, head_sha=head_b, base_sha=base)
    state.delays["POST /issues/20/comments"] = 2.0  # the only worker is stuck publishing PR 20
    bot = make(workers=1)
    bot.deliver("pull_request", pr_payload("opened", number=20, head=head_a, base=base))
    wait_for(lambda: state.arrived("POST", "/issues/20/comments"))
    bot.deliver("pull_request", pr_payload("opened", number=21, head=head_b, base=base))
    queued = wait_for(lambda: state.check_runs_for(REPO, head_b), timeout=5)
    assert queued[0]["status"] == "queued" and "/audits/job-2?key=" in queued[0]["details_url"]
    bot.settle()
    (run,) = state.check_runs_for(REPO, head_b)
    assert run["id"] == queued[0]["id"] and run["status"] == "completed"


def test_two_replicas_on_one_database_audit_each_pr_once(bot_factory, engine_repo):
    from bot.queue import SqliteJobStore
    from bot.worker import Service

    make, state = bot_factory
    repo_path, base, _ = engine_repo
    state.add_repo(REPO, str(repo_path))
    heads = []
    for n in range(30, 36):
        git(repo_path, "checkout", "-q", "-B", f"pr-{n}", base)
        heads.append(commit(repo_path, {"engine/runtime/scheduler.py": f"STEP = {n}\n"}, f"pr {n}"))
        state.add_pull(REPO, n, head_sha=heads[-1], base_sha=base)
    bot = make(workers=2)
    other = Service(bot.settings, SqliteJobStore(bot.settings.db))  # a second replica, same database
    other.start(2)
    try:
        for n, head in zip(range(30, 36), heads, strict=True):
            bot.deliver("pull_request", pr_payload("opened", number=n, head=head, base=base))
        other.wake()
        bot.settle()
    finally:
        other.stop()
    for n, head in zip(range(30, 36), heads, strict=True):
        assert len(_marked(state, n)) == 1
        (run,) = state.check_runs_for(REPO, head)
        assert run["status"] == "completed"
    assert all(j.status == "done" and j.attempts == 1 for j in bot.store.jobs())
