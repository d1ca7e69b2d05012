"""Every check run the service opens is concluded, however the process dies: kill -9 of the real
``drift-audit serve`` in each window where nothing else would conclude it, and a failure report that fails."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from bot.publish import COMMENT_MARKER
from bot.queue import SqliteJobStore
from tests.bot.conftest import REPO, pr_payload, signed, wait_for
from tests.bot.test_bot_crash import ServiceProcess


def _deliver(svc: ServiceProcess, payload: dict) -> None:
    raw = json.dumps(payload).encode()
    assert httpx.post(svc.url + "/webhook", content=raw, headers=signed(raw, "pull_request")).status_code == 202


def _status(store: SqliteJobStore) -> str:
    jobs = store.jobs()
    return jobs[0].status if jobs else ""


@pytest.mark.parametrize("window", ["after the last attempt failed", "during the last attempt"])
def test_kill9_in_each_window_leaves_no_check_run_unconcluded(tmp_path, ghstub, engine_repo, window):
    stub_url, state = ghstub
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 21, head_sha=head, base_sha=base)
    svc = ServiceProcess(tmp_path, stub_url, state, max_attempts=1, sweep_seconds=0.5, http_retries=1)
    store = SqliteJobStore(str(svc.db))
    if window == "after the last attempt failed":
        # publishing fails (GitHub 5xx on the comment list), so the only attempt fails; the failure report then
        # stalls on its first request and the process dies before it sends the PATCH that would conclude the run
        state.fault.rate, state.fault.kinds = 1.0, (502,)
        state.fault.paths, state.fault.methods = ("/issues/21/comments",), ("GET",)
        state.delays["GET /check-runs/"] = 1.5
    else:
        state.delays["PATCH /check-runs/"] = 1.5  # the worker is moving the run to in_progress when it dies
    svc.start()
    try:
        _deliver(svc, pr_payload("opened", number=21, head=head, base=base))
        if window == "after the last attempt failed":
            # the attempt's reason is recorded as its failure report starts, whose first request then stalls
            wait_for(lambda: store.jobs() and "502" in store.jobs()[0].error, timeout=60, interval=0.01)
        else:
            wait_for(lambda: state.arrived("PATCH", "/check-runs/"), timeout=30, interval=0.01)
        svc.kill9()
        (run,) = state.check_runs_for(REPO, head)
        assert run["status"] != "completed"  # the window is real: nothing concluded it before the kill
        state.fault.rate = 0.0
        state.delays.clear()
        time.sleep(1.7)  # the stand-in applies whatever request the dead process left in flight
        svc.start()
        wait_for(lambda: state.check_runs[run["id"]]["status"] == "completed", timeout=30)
        concluded = state.check_runs[run["id"]]
        assert concluded["conclusion"] == "cancelled"  # blocks a required check, and GitHub offers a re-run
        assert "could not finish" in concluded["output"]["title"] and "Re-run" in concluded["output"]["summary"]
        reason = concluded["output"]["summary"]
        assert ("502" in reason) if window == "after the last attempt failed" else ("lease expired" in reason)
        wait_for(lambda: store.jobs()[0].run_state == "closed", timeout=5)  # recorded once GitHub accepted it
        assert store.jobs()[0].status == "failed"
        assert len(state.check_runs_for(REPO, head)) == 1  # concluded, not replaced
    finally:
        svc.stop()
        store.close()


def test_the_timer_concludes_a_run_whose_failure_report_failed(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 22, head_sha=head, base_sha=base)
    # every check-run PATCH fails: the attempt fails moving its run to in_progress, and so does its failure report
    state.fault.rate, state.fault.kinds = 1.0, (502,)
    state.fault.paths, state.fault.methods = ("/check-runs/",), ("PATCH",)
    bot = make(max_attempts=1, sweep_seconds=0.3, http_retries=1)
    bot.deliver("pull_request", pr_payload("opened", number=22, head=head, base=base))
    wait_for(lambda: bot.store.jobs() and bot.store.jobs()[0].status == "failed", timeout=30)
    (run,) = state.check_runs_for(REPO, head)
    time.sleep(1.0)  # sweeps happen meanwhile and fail too: the run stays open while GitHub refuses
    assert state.check_runs[run["id"]]["status"] != "completed"
    state.fault.rate = 0.0
    wait_for(lambda: state.check_runs[run["id"]]["status"] == "completed", timeout=10)
    assert state.check_runs[run["id"]]["conclusion"] == "cancelled"
    wait_for(lambda: bot.store.jobs()[0].run_state == "closed", timeout=5)
    # the audit's own comment was posted before its run's PATCH failed: the sweeper's news replaces it
    wait_for(lambda: [c for c in state.comments_on(REPO, 22)
                      if c["body"].startswith(COMMENT_MARKER) and "could not finish" in c["body"]], timeout=10)
    (comment,) = [c for c in state.comments_on(REPO, 22) if c["body"].startswith(COMMENT_MARKER)]
    assert "502" in comment["body"] and "Re-run this check" in comment["body"]


def test_a_permanent_failure_reason_reaches_the_details_page(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 23, head_sha=head, base_sha=base)
    state.fault.rate, state.fault.kinds = 1.0, (404,)  # GitHub answers 404: permanent, not retried
    state.fault.paths, state.fault.methods = ("/issues/23/comments",), ("GET",)
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=23, head=head, base=base))
    wait_for(lambda: bot.store.jobs() and bot.store.jobs()[0].status == "failed", timeout=30)
    (job,) = bot.store.jobs()
    assert job.attempts == 1 and "404" in job.error
    (run,) = state.check_runs_for(REPO, head)
    page = httpx.get(state.check_runs[run["id"]]["details_url"], timeout=10)
    assert page.status_code == 200 and "404" in page.text and "failed" in page.text


def test_an_audit_whose_gpu_results_never_come_is_concluded_after_gpu_timeout(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = gpu_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 24, head_sha=head, base_sha=base)
    state.add_workflow(REPO, inputs=["plan", "plan_url", "head_sha", "label", "audit_id"])
    bot = make(gpu_timeout=1.0, sweep_seconds=0.3)  # the runner never reports back
    bot.deliver("pull_request", pr_payload("opened", number=24, head=head, base=base))
    wait_for(lambda: state.dispatches, timeout=30)
    (run,) = state.check_runs_for(REPO, head)
    wait_for(lambda: state.check_runs[run["id"]]["status"] == "completed", timeout=15)
    assert state.check_runs[run["id"]]["conclusion"] == "timed_out"  # a required check must not pass
    assert state.check_runs[run["id"]]["output"]["title"] == "GPU results did not arrive"
    wait_for(lambda: bot.store.audit_for_job(bot.store.jobs()[0].id).status == "done", timeout=5)


def test_a_dead_lettered_job_with_a_queued_check_run_gets_it_concluded(bot_factory, engine_repo):
    import sqlite3

    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 25, head_sha=head, base_sha=base)
    bot = make(start_workers=False)
    bot.deliver("pull_request", pr_payload("opened", number=25, head=head, base=base))
    assert bot.service.announce_pending() == 1  # the queued check run exists on GitHub
    (run,) = state.check_runs_for(REPO, head)
    with sqlite3.connect(bot.settings.db) as db:  # a row this build cannot load (a job-schema change, say)
        db.execute("UPDATE jobs SET payload = json_set(payload, '$.pr', 'x2')")
    assert bot.service.run_once() is False  # nothing runnable: the row was set aside, not looped on
    (dead,) = bot.store.jobs("dead")
    swept = bot.service.sweeper.sweep()
    assert swept.concluded == [run["id"]]
    assert state.check_runs[run["id"]]["conclusion"] == "cancelled"
    assert "dead-lettered" in state.check_runs[run["id"]]["output"]["summary"]
    assert bot.store.get(dead.id).run_state == "closed" and bot.service.sweeper.sweep().concluded == []
