"""The durable job table: deliveries, jobs with leases and bounded retries, and finished audits.

Handlers and workers see only ``JobStore``; ``SqliteJobStore`` (WAL, one file)
is the embedded default, and a shared database for several replicas can
implement the same methods. The guarantees the bot relies on:

- a delivery GUID is accepted once, however often or concurrently it arrives;
- a job is leased by one worker at a time, and jobs with the same key (one PR)
  never run concurrently, so two workers never publish to the same PR at once;
- a lease that is not renewed expires, so a killed worker's job runs again;
- a newer head SHA for a key supersedes the older job (queued ones are dropped,
  a running one is told through ``superseded_by``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from bot.events import Job
from checks.model import from_dict, to_dict

QUEUED, LEASED, DONE, FAILED, SUPERSEDED = "queued", "leased", "done", "failed", "superseded"


@dataclass
class JobRow:
    id: int
    job: Job
    status: str
    attempts: int
    max_attempts: int
    delivery: str | None = None
    lease_owner: str | None = None
    lease_until: float = 0.0
    check_run_id: int | None = None
    superseded_by: str | None = None
    error: str = ""
    result: str = ""
    created: float = 0.0
    updated: float = 0.0


@dataclass
class AuditRecord:
    audit_id: str
    job_id: int
    repo: str
    pr: int | None
    head_sha: str
    status: str  # done | awaiting-gpu | superseded | failed
    verdict: str
    audit_json: str  # checks.model.Audit as JSON
    pending: list[str]  # runner labels whose results have not come back
    updated: float = 0.0


class JobStore(ABC):
    """What handlers and workers need from storage; swap the backend without touching them."""

    @abstractmethod
    def accept(self, delivery: str, event: str, job: Job | None, *, max_attempts: int = 5) -> tuple[bool, int | None]:
        """Record a delivery and enqueue its job: (first time seen, job id)."""

    @abstractmethod
    def mark_head(self, job_id: int, head_sha: str) -> None:
        """Set a job's head once known (commands learn it when they run), superseding older ones."""

    @abstractmethod
    def lease(self, owner: str, lease_seconds: float) -> JobRow | None: ...

    @abstractmethod
    def heartbeat(self, job_id: int, owner: str, lease_seconds: float) -> bool: ...

    @abstractmethod
    def finish(self, job_id: int, owner: str, status: str = DONE, result: str = "") -> bool: ...

    @abstractmethod
    def retry_later(self, job_id: int, owner: str, error: str, delay: float) -> str: ...

    @abstractmethod
    def superseded_by(self, job_id: int) -> str | None: ...

    @abstractmethod
    def set_check_run(self, job_id: int, check_run_id: int) -> None: ...

    @abstractmethod
    def unannounced(self, limit: int = 20) -> list[JobRow]:
        """Queued audits that have no check run yet."""

    @abstractmethod
    def claim_announce(self, job_id: int) -> bool:
        """Reserve the creation of a queued job's check run (``check_run_id`` 0 while it is created)."""

    @abstractmethod
    def release_announce(self, job_id: int) -> None: ...

    @abstractmethod
    def get(self, job_id: int) -> JobRow | None: ...

    @abstractmethod
    def jobs(self, status: str | None = None) -> list[JobRow]: ...

    @abstractmethod
    def save_audit(self, record: AuditRecord) -> None: ...

    @abstractmethod
    def audit(self, audit_id: str) -> AuditRecord | None: ...

    @abstractmethod
    def audit_for_job(self, job_id: int) -> AuditRecord | None: ...

    @abstractmethod
    def awaiting(self, repo: str, *, head_sha: str | None = None, pr: int | None = None) -> list[AuditRecord]:
        """Audits still waiting for GPU results, by head or by PR."""

    @abstractmethod
    def latest_audit(self, repo: str, pr: int) -> AuditRecord | None: ...

    def close(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
  guid TEXT PRIMARY KEY, event TEXT NOT NULL, received REAL NOT NULL, job_id INTEGER
);
CREATE TABLE IF NOT EXISTS jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  delivery TEXT, key TEXT NOT NULL, kind TEXT NOT NULL, head_sha TEXT, payload TEXT NOT NULL,
  status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL,
  not_before REAL NOT NULL DEFAULT 0, lease_owner TEXT, lease_until REAL NOT NULL DEFAULT 0,
  check_run_id INTEGER, superseded_by TEXT, error TEXT NOT NULL DEFAULT '', result TEXT NOT NULL DEFAULT '',
  created REAL NOT NULL, updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs(status, not_before);
CREATE INDEX IF NOT EXISTS jobs_key ON jobs(key, status);
CREATE TABLE IF NOT EXISTS audits (
  audit_id TEXT PRIMARY KEY, job_id INTEGER NOT NULL, repo TEXT NOT NULL, pr INTEGER, head_sha TEXT NOT NULL,
  status TEXT NOT NULL, verdict TEXT NOT NULL, audit_json TEXT NOT NULL, pending TEXT NOT NULL, updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS audits_head ON audits(repo, head_sha);
CREATE INDEX IF NOT EXISTS audits_job ON audits(job_id);
"""

_SUPERSEDING = ("audit", "command")


class SqliteJobStore(JobStore):
    """SQLite in WAL mode; each write is one ``BEGIN IMMEDIATE`` transaction, so it is safe across processes."""

    def __init__(self, path: str):
        self.path = path
        self._local = threading.local()
        self._db().executescript(_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process kills
            db.execute("PRAGMA busy_timeout=30000")
            self._local.db = db
        return db

    class _Tx:
        def __init__(self, db: sqlite3.Connection):
            self.db = db

        def __enter__(self) -> sqlite3.Connection:
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type, *_: Any) -> None:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")

    def _tx(self) -> _Tx:
        return self._Tx(self._db())

    # ------------------------------------------------------------------ intake
    def accept(self, delivery: str, event: str, job: Job | None, *, max_attempts: int = 5) -> tuple[bool, int | None]:
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO deliveries(guid, event, received) VALUES (?, ?, ?)", (delivery, event, now)
            )
            if cur.rowcount == 0:
                row = db.execute("SELECT job_id FROM deliveries WHERE guid = ?", (delivery,)).fetchone()
                return False, row["job_id"]
            if job is None:
                return True, None
            if job.kind in _SUPERSEDING and job.head_sha:
                self._supersede(db, job.key, job.head_sha, now)
            job_id = db.execute(
                "INSERT INTO jobs(delivery, key, kind, head_sha, payload, status, max_attempts, created, updated)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (delivery, job.key, job.kind, job.head_sha, json.dumps(to_dict(job)), QUEUED, max_attempts, now, now),
            ).lastrowid
            db.execute("UPDATE deliveries SET job_id = ? WHERE guid = ?", (job_id, delivery))
            return True, job_id

    @staticmethod
    def _supersede(db: sqlite3.Connection, key: str, head_sha: str, now: float) -> None:
        # queued with nothing on GitHub yet: drop it; queued with a check run, or running: tell its worker,
        # which closes the check run as cancelled
        db.execute(
            "UPDATE jobs SET status = ?, superseded_by = ?, updated = ? WHERE key = ? AND status = ?"
            " AND check_run_id IS NULL AND head_sha IS NOT NULL AND head_sha != ? AND kind IN ('audit', 'command')",
            (SUPERSEDED, head_sha, now, key, QUEUED, head_sha),
        )
        db.execute(
            "UPDATE jobs SET superseded_by = ?, updated = ? WHERE key = ? AND status IN (?, ?)"
            " AND head_sha IS NOT NULL AND head_sha != ? AND kind IN ('audit', 'command')",
            (head_sha, now, key, QUEUED, LEASED, head_sha),
        )

    def mark_head(self, job_id: int, head_sha: str) -> None:
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT key FROM jobs WHERE id = ?", (job_id,)).fetchone()
            db.execute("UPDATE jobs SET head_sha = ?, updated = ? WHERE id = ?", (head_sha, now, job_id))
            self._supersede(db, row["key"], head_sha, now)

    # ------------------------------------------------------------------ leases
    def lease(self, owner: str, lease_seconds: float) -> JobRow | None:
        now = time.time()
        with self._tx() as db:
            # a job whose lease ran out with no attempts left is a poison job: fail it, never loop on it
            db.execute(
                "UPDATE jobs SET status = ?, error = error || 'lease expired after the last attempt', updated = ?"
                " WHERE status = ? AND lease_until < ? AND attempts >= max_attempts",
                (FAILED, now, LEASED, now),
            )
            row = db.execute(
                "SELECT * FROM jobs j WHERE ((j.status = ? AND j.not_before <= ?)"
                " OR (j.status = ? AND j.lease_until < ?))"
                " AND NOT EXISTS (SELECT 1 FROM jobs k WHERE k.key = j.key AND k.id != j.id AND k.status = ?"
                "   AND k.lease_until >= ?)"
                " AND NOT EXISTS (SELECT 1 FROM jobs e WHERE e.key = j.key AND e.id < j.id AND e.status = ?)"
                " ORDER BY j.id LIMIT 1",
                (QUEUED, now, LEASED, now, LEASED, now, QUEUED),
            ).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE jobs SET status = ?, lease_owner = ?, lease_until = ?, attempts = attempts + 1,"
                " updated = ? WHERE id = ?",
                (LEASED, owner, now + lease_seconds, now, row["id"]),
            )
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (row["id"],)).fetchone()
            return _row(row)

    def heartbeat(self, job_id: int, owner: str, lease_seconds: float) -> bool:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET lease_until = ? WHERE id = ? AND lease_owner = ? AND status = ?",
                (time.time() + lease_seconds, job_id, owner, LEASED),
            )
            return cur.rowcount == 1

    def finish(self, job_id: int, owner: str, status: str = DONE, result: str = "") -> bool:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET status = ?, result = ?, lease_until = 0, updated = ?"
                " WHERE id = ? AND lease_owner = ? AND status = ?",
                (status, result, time.time(), job_id, owner, LEASED),
            )
            return cur.rowcount == 1

    def retry_later(self, job_id: int, owner: str, error: str, delay: float) -> str:
        """Requeue after ``delay``, or fail the job once its attempts are spent; returns the new status."""
        now = time.time()
        with self._tx() as db:
            row = db.execute(
                "SELECT attempts, max_attempts FROM jobs WHERE id = ? AND lease_owner = ? AND status = ?",
                (job_id, owner, LEASED),
            ).fetchone()
            if row is None:
                return "lost"
            status = FAILED if row["attempts"] >= row["max_attempts"] else QUEUED
            db.execute(
                "UPDATE jobs SET status = ?, error = ?, not_before = ?, lease_until = 0, updated = ? WHERE id = ?",
                (status, error[-2000:], now + delay, now, job_id),
            )
            return status

    def superseded_by(self, job_id: int) -> str | None:
        row = self._db().execute("SELECT superseded_by FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row["superseded_by"] if row else None

    def set_check_run(self, job_id: int, check_run_id: int) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET check_run_id = ?, updated = ? WHERE id = ?", (check_run_id, time.time(), job_id)
            )

    def unannounced(self, limit: int = 20) -> list[JobRow]:
        rows = self._db().execute(
            "SELECT * FROM jobs WHERE status = ? AND kind = 'audit' AND check_run_id IS NULL"
            " AND superseded_by IS NULL ORDER BY id LIMIT ?",
            (QUEUED, limit),
        ).fetchall()
        return [_row(r) for r in rows]

    def claim_announce(self, job_id: int) -> bool:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET check_run_id = 0 WHERE id = ? AND check_run_id IS NULL AND status = ?"
                " AND superseded_by IS NULL",
                (job_id, QUEUED),
            )
            return cur.rowcount == 1

    def release_announce(self, job_id: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET check_run_id = NULL WHERE id = ? AND check_run_id = 0", (job_id,))

    def get(self, job_id: int) -> JobRow | None:
        row = self._db().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row(row) if row else None

    def jobs(self, status: str | None = None) -> list[JobRow]:
        if status:
            rows = self._db().execute("SELECT * FROM jobs WHERE status = ? ORDER BY id", (status,)).fetchall()
        else:
            rows = self._db().execute("SELECT * FROM jobs ORDER BY id").fetchall()
        return [_row(r) for r in rows]

    def deliveries(self) -> int:
        return self._db().execute("SELECT COUNT(*) FROM deliveries").fetchone()[0]

    # ------------------------------------------------------------------ audits
    def save_audit(self, record: AuditRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO audits(audit_id, job_id, repo, pr, head_sha, status, verdict, audit_json, pending,"
                " updated)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(audit_id) DO UPDATE SET job_id = excluded.job_id,"
                " status = excluded.status, verdict = excluded.verdict, audit_json = excluded.audit_json,"
                " pending = excluded.pending, updated = excluded.updated",
                (
                    record.audit_id,
                    record.job_id,
                    record.repo,
                    record.pr,
                    record.head_sha,
                    record.status,
                    record.verdict,
                    record.audit_json,
                    json.dumps(record.pending),
                    time.time(),
                ),
            )

    def audit(self, audit_id: str) -> AuditRecord | None:
        row = self._db().execute("SELECT * FROM audits WHERE audit_id = ?", (audit_id,)).fetchone()
        return _audit(row) if row else None

    def audit_for_job(self, job_id: int) -> AuditRecord | None:
        row = (
            self._db()
            .execute("SELECT * FROM audits WHERE job_id = ? ORDER BY updated DESC LIMIT 1", (job_id,))
            .fetchone()
        )
        return _audit(row) if row else None

    def awaiting(self, repo: str, *, head_sha: str | None = None, pr: int | None = None) -> list[AuditRecord]:
        rows = (
            self._db()
            .execute(
                "SELECT * FROM audits WHERE repo = ? AND status = 'awaiting-gpu' AND (? IS NULL OR head_sha = ?)"
                " AND (? IS NULL OR pr = ?) ORDER BY updated",
                (repo, head_sha, head_sha, pr, pr),
            )
            .fetchall()
        )
        return [_audit(r) for r in rows]

    def latest_audit(self, repo: str, pr: int) -> AuditRecord | None:
        row = (
            self._db()
            .execute(
                "SELECT * FROM audits WHERE repo = ? AND pr = ? AND status != 'superseded'"
                " ORDER BY updated DESC LIMIT 1",
                (repo, pr),
            )
            .fetchone()
        )
        return _audit(row) if row else None

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


def _row(row: sqlite3.Row) -> JobRow:
    return JobRow(
        id=row["id"],
        job=from_dict(Job, json.loads(row["payload"])),
        status=row["status"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        delivery=row["delivery"],
        lease_owner=row["lease_owner"],
        lease_until=row["lease_until"],
        check_run_id=row["check_run_id"],
        superseded_by=row["superseded_by"],
        error=row["error"],
        result=row["result"],
        created=row["created"],
        updated=row["updated"],
    )


def _audit(row: sqlite3.Row) -> AuditRecord:
    return AuditRecord(
        audit_id=row["audit_id"],
        job_id=row["job_id"],
        repo=row["repo"],
        pr=row["pr"],
        head_sha=row["head_sha"],
        status=row["status"],
        verdict=row["verdict"],
        audit_json=row["audit_json"],
        pending=json.loads(row["pending"]),
        updated=row["updated"],
    )
