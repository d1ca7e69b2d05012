"""The SQLite job store: idempotent intake, one lease per PR, lease expiry, bounded retries, supersede."""

from __future__ import annotations

import threading
import time

from bot.jobs import AuditJob, CommandJob
from bot.queue import DONE, FAILED, LEASED, QUEUED, SUPERSEDED, SqliteJobStore


def _job(pr: int = 1, head: str = "a" * 40) -> AuditJob:
    return AuditJob(repo="o/r", key=f"o/r#{pr}", pr=pr, head_sha=head, base_sha="b" * 40)


def _command(pr: int = 1) -> CommandJob:
    return CommandJob(repo="o/r", key=f"o/r#{pr}", pr=pr, comment_id=7, body="/audit", actor="alice")


def test_a_delivery_is_accepted_once_across_threads(tmp_path):
    store = SqliteJobStore(str(tmp_path / "q.db"))
    outcomes: list[bool] = []

    def accept():
        s = SqliteJobStore(store.path)  # separate connection, as another process would have
        outcomes.append(s.accept("guid", "pull_request", _job())[0])

    threads = [threading.Thread(target=accept) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(True) == 1 and len(store.jobs()) == 1
    assert store.accept("guid", "pull_request", _job()) == (False, store.jobs()[0].id)


def test_one_lease_per_pr_and_fifo(tmp_path):
    store = SqliteJobStore(str(tmp_path / "q.db"))
    store.accept("d1", "issue_comment", _command())
    store.accept("d2", "issue_comment", _command())
    store.accept("d3", "pull_request", _job(pr=2))
    first = store.lease("w1", 30)
    second = store.lease("w2", 30)
    assert (first.job.pr, second.job.pr) == (1, 2)  # PR 1's second job waits for its first
    assert store.lease("w3", 30) is None
    assert store.finish(first.id, "w1")
    assert store.lease("w3", 30).id == first.id + 1


def test_expired_lease_is_taken_over_and_the_old_owner_cannot_finish(tmp_path):
    store = SqliteJobStore(str(tmp_path / "q.db"))
    store.accept("d1", "pull_request", _job())
    row = store.lease("dead-worker", 0.05)
    time.sleep(0.1)
    again = store.lease("new-worker", 30)
    assert again.id == row.id and again.attempts == 2
    assert not store.heartbeat(row.id, "dead-worker", 30)
    assert not store.finish(row.id, "dead-worker")
    assert store.finish(row.id, "new-worker") and store.get(row.id).status == DONE


def test_retries_are_bounded(tmp_path):
    store = SqliteJobStore(str(tmp_path / "q.db"))
    store.accept("d1", "pull_request", _job(), max_attempts=2)
    row = store.lease("w", 30)
    assert store.retry_later(row.id, "w", "boom", 0) == QUEUED
    row = store.lease("w", 30)
    assert store.retry_later(row.id, "w", "boom again", 0) == FAILED
    assert store.lease("w", 30) is None and store.get(row.id).error == "boom again"
    store.accept("d2", "pull_request", _job(pr=2), max_attempts=1)
    crashed = store.lease("w", 0.01)  # its worker dies with no attempts left
    time.sleep(0.05)
    assert store.lease("w", 30) is None and store.get(crashed.id).status == FAILED


def test_a_newer_head_supersedes_queued_and_running_audits(tmp_path):
    store = SqliteJobStore(str(tmp_path / "q.db"))
    store.accept("d1", "pull_request", _job(head="1" * 40))
    running = store.lease("w", 30)
    store.accept("d2", "pull_request", _job(head="2" * 40))
    store.accept("d3", "pull_request", _job(head="3" * 40))
    rows = {r.job.head_sha[0]: r for r in store.jobs()}
    assert rows["1"].status == LEASED and rows["1"].superseded_by == "3" * 40
    assert rows["2"].status == SUPERSEDED and rows["3"].status == QUEUED
    assert store.superseded_by(running.id) == "3" * 40
    store.accept("d4", "pull_request", _job(pr=9, head="4" * 40))  # another PR is untouched
    assert store.jobs()[-1].status == QUEUED


def test_announce_claims_are_exclusive_and_superseding_keeps_announced_jobs_for_their_worker(tmp_path):
    store = SqliteJobStore(str(tmp_path / "q.db"))
    store.accept("d1", "pull_request", _job(head="1" * 40))
    (row,) = store.unannounced()
    assert store.claim_announce(row.id) and not store.claim_announce(row.id)
    assert store.unannounced() == []
    store.release_announce(row.id)
    assert store.claim_announce(row.id)
    store.set_check_run(row.id, 77)
    store.accept("d2", "pull_request", _job(head="2" * 40))
    old = store.get(row.id)
    assert old.status == QUEUED and old.superseded_by == "2" * 40  # its worker closes check run 77
    assert [r.job.head_sha[0] for r in store.unannounced()] == ["2"]
