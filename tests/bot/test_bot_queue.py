"""The SQLite job store: idempotent intake, one lease per PR, lease expiry, bounded retries, supersede."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest

from bot.jobs import JOB_SCHEMA, AuditJob, CommandJob
from bot.queue import DEAD, DONE, FAILED, LEASED, QUEUED, SUPERSEDED, SqliteJobStore, StoreError


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


def test_a_row_that_does_not_load_is_dead_lettered_and_the_queue_moves_on(tmp_path):
    store = SqliteJobStore(str(tmp_path / "q.db"))
    store.accept("d1", "pull_request", _job(pr=1))
    store.accept("d2", "pull_request", _job(pr=2))
    db = sqlite3.connect(store.path)
    broken = json.loads(db.execute("SELECT payload FROM jobs WHERE id = 1").fetchone()[0]) | {"pr": "2a"}
    db.execute("UPDATE jobs SET payload = ? WHERE id = 1", (json.dumps(broken),))
    db.execute("UPDATE jobs SET payload = '{not json' WHERE id = 2")
    db.commit()
    store.accept("d3", "pull_request", _job(pr=3))
    row = store.lease("w", 30)
    assert row.job.pr == 3  # the valid job behind two poison rows runs
    dead = {r.id: r for r in store.jobs(DEAD)}
    assert set(dead) == {1, 2} and all(r.job is None for r in dead.values())
    assert "AuditJob" in dead[1].error or "'2a'" in dead[1].error
    assert "not JSON" in dead[2].error
    assert store.lease("w2", 30) is None


def test_rows_of_the_previous_job_schema_are_upgraded_and_newer_ones_refused(tmp_path):
    store = SqliteJobStore(str(tmp_path / "q.db"))
    db = sqlite3.connect(store.path)
    legacy = {  # a version-1 row: one Job type with every field, as the previous build wrote it
        "kind": "command", "repo": "o/r", "key": "o/r#4", "installation_id": 1, "pr": 4, "head_sha": None,
        "base_sha": None, "trigger": "comment", "options": {}, "clone_url": "", "untrusted": False, "actor": "al",
        "comment_id": 9, "command": "/audit full", "run_id": None, "check_run_id": None, "audit_id": None,
        "label": None, "note": "",
    }
    now = time.time()
    for version, payload in ((1, legacy), (JOB_SCHEMA + 1, {"repo": "o/r"})):
        db.execute(
            "INSERT INTO jobs(key, kind, payload, status, max_attempts, created, updated, version)"
            " VALUES (?, 'command', ?, 'queued', 5, ?, ?, ?)",
            (f"o/r#{version}", json.dumps(payload), now, now, version),
        )
    db.commit()
    row = store.lease("w", 30)
    assert isinstance(row.job, CommandJob) and row.job.body == "/audit full" and row.job.head_sha is None
    assert store.lease("w2", 30) is None  # the row from a newer build is set aside, not run, not looped on
    (dead,) = store.jobs(DEAD)
    assert "newer build" in dead.error
    db.execute("UPDATE meta SET value = '99' WHERE name = 'schema'")
    db.commit()
    with pytest.raises(StoreError, match="newer drift-audit"):
        SqliteJobStore(store.path)


def test_a_database_of_the_first_layout_is_migrated_in_place(tmp_path):
    path = str(tmp_path / "old.db")
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, delivery TEXT, key TEXT NOT NULL, kind TEXT NOT"
        " NULL, head_sha TEXT, payload TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
        " max_attempts INTEGER NOT NULL, not_before REAL NOT NULL DEFAULT 0, lease_owner TEXT, lease_until REAL"
        " NOT NULL DEFAULT 0, check_run_id INTEGER, superseded_by TEXT, error TEXT NOT NULL DEFAULT '', result"
        " TEXT NOT NULL DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);"
    )
    old = {"kind": "audit", "repo": "o/r", "key": "o/r#1", "pr": 1, "head_sha": "a" * 40, "base_sha": "b" * 40,
           "trigger": "pull_request", "options": {"run": True}, "untrusted": True}
    db.execute("INSERT INTO jobs(key, kind, head_sha, payload, status, max_attempts, created, updated)"
               " VALUES ('o/r#1', 'audit', ?, ?, 'queued', 5, 0, 0)", ("a" * 40, json.dumps(old)))
    db.commit()
    row = SqliteJobStore(path).lease("w", 30)
    assert row.job.untrusted and row.job.head_sha == "a" * 40 and row.job.options.run


def test_a_command_is_pinned_to_the_head_known_when_it_arrives(tmp_path):
    store = SqliteJobStore(str(tmp_path / "q.db"))
    store.accept("c0", "issue_comment", _command(pr=1))  # no push seen yet: pinned to nothing
    store.accept("p1", "pull_request", _job(pr=1, head="1" * 40))
    store.accept("c1", "issue_comment", _command(pr=1))
    rows = store.jobs()
    assert rows[0].job.head_sha is None and rows[2].job.head_sha == "1" * 40
    store.accept("p2", "pull_request", _job(pr=1, head="2" * 40))  # the fork pushes again
    assert store.get(rows[2].id).superseded_by == "2" * 40  # the approval of 111… does not carry over
    assert store.get(rows[2].id).status == QUEUED  # its worker answers the comment
