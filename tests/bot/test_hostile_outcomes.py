"""An audit that does not finish never passes a required check, and says whether a re-run can help; a re-run
from GitHub's UI works for a fork's pull request too; an old head's results never overwrite a newer head's
comment, and come back to a head that comes back (A -> B -> A)."""

from __future__ import annotations

from checks.model import Results, SuiteResult
from runner.actions import artifact_name, run_title
from tests.bot.conftest import (
    REPO,
    answer_dispatches,
    fixture_payload,
    installation_lite,
    pr_payload,
    signed_results,
    wait_for,
    workflow_run_payload,
)
from tests.bot.test_bot_approvals import FORK, _approve, _fork_pr, _opened
from tests.bot.test_bot_commands import _live
from tests.bot.test_bot_flows import _marked
from tests.gitrepo import commit


def _fork_opened(state, number: int, head: str, base: str) -> dict:
    state.add_pull(REPO, number, head_sha=head, base_sha=base, head_repo=FORK,
                   author_association="FIRST_TIME_CONTRIBUTOR")
    return _opened(number, head, base)


def _rerun_check(state, run: dict, prs: list[dict]) -> dict:
    """check_run rerequested as GitHub sends it; for a fork's head ``pull_requests`` is empty."""
    p = fixture_payload("check_run.rerequested")
    p["installation"] = installation_lite(1)
    p["repository"]["full_name"] = REPO
    p["check_run"].update(id=run["id"], head_sha=run["head_sha"], external_id=run["external_id"], pull_requests=prs)
    p["check_run"]["app"]["id"] = state.app_id
    return p


def _rerun_suite(state, head: str) -> dict:
    """check_suite rerequested ("Re-run all checks") of a fork's head: no pull request, no check run named."""
    p = fixture_payload("check_suite.requested")
    p["action"] = "rerequested"
    p["installation"] = installation_lite(1)
    p["repository"]["full_name"] = REPO
    p["check_suite"].update(head_sha=head, pull_requests=[])
    p["check_suite"]["app"]["id"] = state.app_id
    return p


def test_a_crash_on_the_prs_input_fails_the_check_and_a_rerun_of_the_forks_check_audits_it(
        bot_factory, engine_repo, monkeypatch):
    from runner import pipeline

    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    real = pipeline.plan

    def plan(request):  # what a 5000-deep expression in a PR's file does to a recursive walker
        if request.head == head:
            raise RecursionError("maximum recursion depth exceeded while walking engine/weights/loader.py")
        return real(request)

    monkeypatch.setattr(pipeline, "plan", plan)
    bot = make(max_attempts=5)
    bot.deliver("pull_request", _fork_opened(state, 61, head, base))
    bot.settle()
    (job,) = bot.store.jobs()
    assert job.status == "failed" and job.attempts == 2  # tried once more (a transient MemoryError), not 5 times
    (run,) = state.check_runs_for(REPO, head)
    wait_for(lambda: state.check_runs[run["id"]]["status"] == "completed", timeout=10)  # reported after the job ends
    run = state.check_runs[run["id"]]
    # neutral would count as passing: a PR that crashes the auditor would merge unaudited
    assert run["conclusion"] == "failure" and run["output"]["title"] == "The audit crashed on this pull request"
    assert "RecursionError" in run["output"]["summary"] and "Re-run" in run["output"]["summary"]
    (comment,) = _marked(state, 61)
    assert "crashed" in comment["body"] and head[:12] in comment["body"] and "does not pass" in comment["body"]

    monkeypatch.setattr(pipeline, "plan", real)  # the bot is fixed; a writer clicks Re-run on the fork's check
    assert bot.deliver("check_run", _rerun_check(state, run, prs=[])).json()["status"] == "queued"
    bot.settle()
    assert [c["id"] for c in state.check_runs_for(REPO, head)] == [run["id"]]  # audited in the same run
    assert state.check_runs[run["id"]]["conclusion"] == "success"
    (comment,) = _marked(state, 61)
    assert "crashed" not in comment["body"] and head[:12] in comment["body"]

    unknown = dict(run, id=run["id"] + 999)  # a run this bot has no record of: nothing to re-run
    answer = bot.deliver("check_run", _rerun_check(state, unknown, prs=[])).json()
    assert answer == {"status": "ignored", "reason": "a re-run of a check run this bot has no record of"}


def test_an_infrastructure_failure_cancels_the_check_and_rerunning_the_suite_audits_it(bot_factory, engine_repo,
                                                                                      tmp_path):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    # the clone fails (nothing about the change itself); git echoes the path, which carries markdown
    state.add_repo(REPO, str(tmp_path / "moved-away @octocat [x](http:e.x)"))
    bot = make(max_attempts=2)
    bot.deliver("pull_request", _fork_opened(state, 62, head, base))
    bot.settle()
    (job,) = bot.store.jobs()
    assert job.status == "failed" and job.attempts == 2
    (run,) = state.check_runs_for(REPO, head)
    wait_for(lambda: state.check_runs[run["id"]]["status"] == "completed", timeout=10)
    run = state.check_runs[run["id"]]
    assert run["conclusion"] == "cancelled"  # blocks a required check; GitHub offers to re-run it
    assert "re-run" in run["output"]["title"] and "MirrorError" in run["output"]["summary"]
    (comment,) = _marked(state, 62)
    assert "could not finish" in comment["body"] and "Re-run this check" in comment["body"]
    assert _live(comment["body"].split("\n", 1)[1]) == ["link_open"]  # our details link only
    assert "@octocat" in run["output"]["summary"] and _live(run["output"]["summary"]) == []  # quoted, inert

    state.repos[REPO]["clone_url"] = str(repo_path)  # GitHub is back; "Re-run all checks" on the fork's head
    assert bot.deliver("check_suite", _rerun_suite(state, head)).json()["status"] == "queued"
    bot.settle()
    assert [c["id"] for c in state.check_runs_for(REPO, head)] == [run["id"]]
    assert state.check_runs[run["id"]]["conclusion"] == "success"


def test_an_old_heads_gpu_results_never_overwrite_the_new_heads_comment(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = gpu_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 63, head_sha=head, base_sha=base)
    state.add_workflow(REPO)
    runs = answer_dispatches(state)
    bot = make(workers=2)
    bot.deliver("pull_request", pr_payload("opened", number=63, head=head, base=base))
    bot.settle()
    (old_run,) = state.check_runs_for(REPO, head)
    assert old_run["status"] == "in_progress"  # waiting for the sm90 results

    newer = commit(repo_path, {"README.md": "docs only\n"}, "docs")
    state.pulls[(REPO, 63)]["head"]["sha"] = newer
    # the old head's collect stalls between reading which audit is newest and writing the comment: with a second
    # worker free, the new push's audit runs meanwhile, unless the two are one PR's jobs, run one at a time
    state.delays[f"GET /check-runs/{old_run['id']}"] = 2.0
    bot.deliver("pull_request", pr_payload("synchronize", number=63, head=newer, base=base))
    bot.deliver("workflow_run", workflow_run_payload(runs[0]))
    bot.settle()
    (comment,) = _marked(state, 63)
    body = comment["body"]
    assert f"head `{newer[:12]}`" in body and "results pending" in body and "❌" not in body, body[-800:]
    assert state.check_runs[old_run["id"]]["conclusion"] == "cancelled"  # retired, not re-concluded by the collect
    (new_run,) = state.check_runs_for(REPO, newer)
    assert new_run["status"] == "in_progress"  # its own sm90 run is out
    assert bot.store.latest_audit(REPO, 63).head_sha == newer


def test_gpu_results_of_a_head_pushed_away_and_back_still_count(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = _fork_pr(state, gpu_repo, 64)
    runs = answer_dispatches(state)
    bot = make()
    bot.deliver("pull_request", _opened(64, head, base))
    bot.settle()
    _approve(bot, state, 64)  # a writer approves head A: it is dispatched
    bot.settle()
    assert len(state.dispatches) == 1

    other = commit(repo_path, {"README.md": "b\n"}, "B")
    for sha, action in ((other, "synchronize"), (head, "synchronize")):  # force-push A -> B -> A
        state.pulls[(REPO, 64)]["head"]["sha"] = sha
        bot.deliver("pull_request", _opened(64, sha, base, action=action))
        bot.settle()
    assert len(state.dispatches) == 1  # A again is not approved again (no writer said so): it waits
    latest = [c for c in state.check_runs_for(REPO, head) if c["status"] != "completed"]
    assert len(latest) == 1, [(c["id"], c["status"], c["conclusion"]) for c in state.check_runs_for(REPO, head)]

    bot.deliver("workflow_run", workflow_run_payload(runs[0]))  # the approved run of A reports
    bot.settle()
    assert state.check_runs[latest[0]["id"]]["conclusion"] == "failure"  # A's failed suite, not action_required
    (comment,) = _marked(state, 64)
    assert head[:12] in comment["body"] and "parity-loader" in comment["body"]
    wait_for(lambda: not bot.store.awaiting(REPO, pr=64), timeout=5)


def test_a_writers_typo_in_a_command_does_not_turn_a_failed_check_green(bot_factory, gpu_repo):
    from tests.bot.test_hostile_results import _failed_head, _say

    bot, state, head, failed = _failed_head(bot_factory, gpu_repo, 65)
    for typo in ("/audit run parity-loadr", "/audit pillars=weigths"):  # unknown suite, unknown pillar
        _say(bot, state, 65, typo, "maintainer")
        newest = max(state.check_runs_for(REPO, head), key=lambda c: c["id"])
        # GitHub reads the newest run of a check: a neutral one here would pass the failed head
        assert newest["id"] != failed["id"] and newest["conclusion"] == "failure", (typo, newest["output"])
        assert "the last audit stands" in newest["output"]["title"]


def test_a_run_whose_id_was_never_recorded_is_found_behind_a_newer_run(bot_factory, engine_repo):
    """GitHub lists only the newest run of each name unless asked for all: a run created just before a crash (its
    id never stored) sits behind the newer run a command opened on the same commit, and must still be concluded."""
    import sqlite3

    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 66, head_sha=head, base_sha=base)
    bot = make(start_workers=False)
    job_id = bot.deliver("pull_request", pr_payload("opened", number=66, head=head, base=base)).json()["job"]
    bot.store.opening_run(job_id, f"job:{job_id}")  # recorded as opening; the process died after the POST
    orphan = state.add_check_run(REPO, head, status="in_progress")
    orphan["external_id"] = f"job:{job_id}"
    state.add_check_run(REPO, head, status="completed", conclusion="success")  # newer: a command's run
    with sqlite3.connect(bot.settings.db) as db:  # the job's last attempt ended without concluding anything
        db.execute("UPDATE jobs SET status = 'failed', error = 'GithubException: 502' WHERE id = ?", (job_id,))
    swept = bot.service.sweeper.sweep()
    assert swept.concluded == [orphan["id"]], swept
    assert state.check_runs[orphan["id"]]["conclusion"] == "cancelled"


def test_retargeting_a_pr_to_a_stricter_base_audits_it_again(bot_factory, tmp_path):
    """Opened against a branch without the config (green), then retargeted to main: GitHub re-runs no check on a
    base change, so without a new audit the green check earned against the laxer branch stands for main."""
    from tests.bot.conftest import GPU_CONFIG
    from tests.gitrepo import git, init_repo

    make, state = bot_factory
    repo_path = init_repo(tmp_path / "src")
    lax = commit(repo_path, {"engine/weights/loader.py": "def load(path):\n    return {}\n"}, "dev")
    git(repo_path, "checkout", "-q", "-b", "dev")
    git(repo_path, "checkout", "-q", "-b", "feature")
    head = commit(repo_path, {"engine/weights/loader.py": "def load(path):\n    return {'w': 1}\n"}, "loader")
    git(repo_path, "checkout", "-q", "main")
    strict = commit(repo_path, {".github/drift-audit.toml": GPU_CONFIG}, "main declares the GPU suite")
    state.add_repo(REPO, str(repo_path))
    state.add_workflow(REPO)
    state.add_pull(REPO, 67, head_sha=head, base_sha=lax, base_ref="dev")
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=67, head=head, base=lax))
    bot.settle()
    (green,) = state.check_runs_for(REPO, head)
    assert green["conclusion"] == "success" and state.dispatches == []

    state.pulls[(REPO, 67)]["base"].update(sha=strict, ref="main")
    edited = pr_payload("edited", number=67, head=head, base=strict)
    edited["changes"] = {"base": {"ref": {"from": "dev"}, "sha": {"from": lax}}}
    assert bot.deliver("pull_request", edited).json()["status"] == "queued"
    bot.settle()
    newest = max(state.check_runs_for(REPO, head), key=lambda c: c["id"])
    assert newest["id"] != green["id"] and newest["status"] == "in_progress"  # main's GPU suite is dispatched
    assert [d["inputs"]["head_sha"] for d in state.dispatches] == [head]

    title_only = pr_payload("edited", number=67, head=head, base=strict)
    title_only["changes"] = {"title": {"from": "A change"}}
    assert bot.deliver("pull_request", title_only).json()["status"] == "ignored"


def test_gpu_results_that_arrive_before_their_audit_is_saved_are_kept(bot_factory, gpu_repo):
    """A run that fails fast can report while its audit is still being written: its results wait for that audit
    (the audit id is bound to the dispatching job before the dispatch), never get dropped as "no such audit"."""
    import time

    make, state = bot_factory
    repo_path, base, head = gpu_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 68, head_sha=head, base_sha=base)
    state.add_workflow(REPO)
    holder: dict = {}

    def on_dispatch(st, record):  # the runner reports while the bot's dispatch request is still open
        inputs = record["inputs"]
        run = st.add_run(REPO, head_sha=inputs["head_sha"], display_title=run_title(inputs["audit_id"], inputs["label"]))
        results = Results(inputs["audit_id"], inputs["head_sha"], [SuiteResult("parity-loader", "sm90", "failed")])
        st.add_artifact(run["id"], artifact_name(inputs["audit_id"], inputs["label"]),
                        signed_results(REPO, inputs["label"], results))
        assert holder["bot"].deliver("workflow_run", workflow_run_payload(run)).json()["status"] == "queued"
        time.sleep(1.0)  # a free worker would take the collect now, before the audit is saved

    state.on_dispatch = on_dispatch
    bot = holder["bot"] = make(workers=2)
    bot.deliver("pull_request", pr_payload("opened", number=68, head=head, base=base))
    bot.settle()
    (run,) = state.check_runs_for(REPO, head)
    assert run["conclusion"] == "failure", run["output"]["title"]  # the early results were folded in
    (record,) = bot.store.audits_of_head(REPO, head)
    assert record.status == "done" and record.pending == []


def test_the_sweepers_late_news_never_overwrites_what_a_later_job_of_the_pr_wrote(bot_factory, engine_repo):
    import sqlite3

    from tests.bot.test_bot_flows import _comment_payload

    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    bot = make(start_workers=False)
    for number in (69, 70):
        state.add_pull(REPO, number, head_sha=head, base_sha=base)
        bot.deliver("pull_request", pr_payload("opened", number=number, head=head, base=base))
    assert bot.service.announce_pending() == 2
    asked = state.add_comment(REPO, 70, "/audit", user="octocat")  # PR 70 has a later job: it owns the comment
    bot.deliver("issue_comment", _comment_payload(70, "/audit", "octocat", asked["id"]))
    with sqlite3.connect(bot.settings.db) as db:  # both audits gave up and their own reports did not land
        db.execute("UPDATE jobs SET status = 'failed', error = 'GithubException: 502' WHERE kind = 'audit'")
    assert len(bot.service.sweeper.sweep().concluded) == 2
    assert {c["conclusion"] for c in state.check_runs_for(REPO, head)} == {"cancelled"}
    assert ["could not finish" in c["body"] for c in _marked(state, 69)] == [True]
    assert _marked(state, 70) == []
