"""The durable job table: deliveries, jobs with leases and bounded retries, and finished audits.

Handlers and workers see only ``JobStore``; ``SqliteJobStore`` (WAL, one file)
is the embedded default, and a shared database for several replicas can
implement the same methods. The guarantees the bot relies on:

- a delivery GUID is accepted once, however often or concurrently it arrives;
- a job is leased by one worker at a time, and jobs with the same key (one PR)
  never run concurrently, so two workers never publish to the same PR at once;
- a lease that is not renewed expires, so a killed worker's job runs again;
- a newer head SHA for a key supersedes the older job (queued ones are dropped,
  a running one is told through ``superseded_by``);
- a row that cannot be loaded is dead-lettered with its reason, inside the lease
  that found it, so it never blocks the rows behind it; each row records the job
  schema it was written with (``bot.jobs.JOB_SCHEMA``) and older rows are upgraded;
- every check run a job opens is recorded (``run_state``) before it is created, so
  ``bot.sweeper`` can conclude it whatever happened to the process.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any

from bot.jobs import JOB_SCHEMA, AuditJob, CollectJob, CommandJob, Job, JobLoadError, RerunJob, dump_job, load_job

QUEUED, LEASED, DONE, FAILED, SUPERSEDED, DEAD = "queued", "leased", "done", "failed", "superseded", "dead"
TERMINAL = (DONE, FAILED, SUPERSEDED, DEAD)
STORE_SCHEMA = 2  # the table layout; a database written by a newer layout is refused at start-up
RUN_OPENING, RUN_OPEN, RUN_CLOSED = "opening", "open", "closed"


class StoreError(RuntimeError):
    """The database cannot be used by this build; the message says why and what to do."""


class ReplayedDelivery(ValueError):
    """A body accepted before arrives under another ``X-GitHub-Delivery``. GitHub keeps the GUID when it
    redelivers, and the GUID (like the event name) is not covered by the signature, so this is a captured
    delivery sent again: nothing is recorded or queued."""


@dataclass
class JobRow:
    id: int
    job: Job | None  # None only for a dead-lettered row, whose ``error`` says why it did not load
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
    kind: str = ""
    repo: str = ""
    installation_id: int | None = None
    head_sha: str | None = None
    run_state: str | None = None
    external_id: str | None = None


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
    def accept(self, delivery: str, event: str, job: Job | None, *, max_attempts: int = 5,
               body_sha: str | None = None) -> tuple[bool, int | None]:
        """Record a delivery and enqueue its job: (first time seen, job id; None when nothing was queued, as for
        a push older than the head already recorded). ``body_sha``: the SHA-256 of the signed body; the same body
        under another delivery GUID raises ``ReplayedDelivery``."""

    @abstractmethod
    def bind_audit(self, job_id: int, audit_id: str) -> None:
        """The audit this job runs, recorded before its GPU runs are dispatched: their results (a ``CollectJob``)
        are queued under this job's key, so they never publish while another job of the same PR does."""

    @abstractmethod
    def mark_head(self, job_id: int, head_sha: str) -> None:
        """Set a job's head once known (commands learn it when they run), superseding older ones."""

    @abstractmethod
    def lease(self, owner: str, lease_seconds: float) -> JobRow | None: ...

    @abstractmethod
    def heartbeat(self, job_id: int, owner: str, lease_seconds: float) -> bool: ...

    @abstractmethod
    def finish(self, job_id: int, owner: str, status: str = DONE, result: str = "", error: str = "") -> bool: ...

    @abstractmethod
    def retry_later(self, job_id: int, owner: str, error: str, delay: float) -> str: ...

    @abstractmethod
    def note_error(self, job_id: int, owner: str, error: str) -> None:
        """Record why the current attempt failed while it still holds the lease (its failure is being reported):
        should the process die now, the expired lease's reason carries it."""

    @abstractmethod
    def superseded_by(self, job_id: int) -> str | None: ...

    @abstractmethod
    def has_newer(self, job_id: int) -> bool:
        """Was a later job of the same key (the same PR) accepted after this one? It owns the PR's comment now."""

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
    def release_stale_announces(self, older_than: float) -> int: ...

    @abstractmethod
    def known_head(self, repo: str, pr: int) -> str | None:
        """The PR head the latest accepted push named."""

    @abstractmethod
    def record_head(self, repo: str, pr: int, head_sha: str) -> None: ...

    @abstractmethod
    def opening_run(self, job_id: int, external_id: str) -> None:
        """Record, before creating it, that this job is about to open a check run with ``external_id``."""

    @abstractmethod
    def close_run(self, job_id: int) -> None:
        """This job's check run is concluded on GitHub."""

    @abstractmethod
    def stale_runs(self, gpu_timeout: float) -> list[JobRow]:
        """Jobs that opened a check run and will never conclude it: finished, failed, dead, superseded, or
        waiting for GPU results longer than ``gpu_timeout`` seconds."""

    @abstractmethod
    def expire_leases(self) -> int:
        """Fail the jobs whose lease ran out on their last attempt; returns how many."""

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

    @abstractmethod
    def audits_of_head(self, repo: str, head_sha: str) -> list[AuditRecord]:
        """Every audit of one commit, newest first (whatever became of it)."""

    def close(self) -> None:  # noqa: B027  (optional: a backend without connections has nothing to close)
        """Release this process's connections."""


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
CREATE TABLE IF NOT EXISTS heads (
  repo TEXT NOT NULL, pr INTEGER NOT NULL, head_sha TEXT NOT NULL, seen REAL NOT NULL, PRIMARY KEY (repo, pr)
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# columns added after the first layout: (name, declaration); existing rows get the default
_ADDED_COLUMNS = (
    ("version", "INTEGER NOT NULL DEFAULT 1"),  # bot.jobs.JOB_SCHEMA the row was written with
    ("repo", "TEXT NOT NULL DEFAULT ''"),
    ("installation_id", "INTEGER"),
    ("run_state", "TEXT"),  # opening | open | closed: the check run this job opened
    ("external_id", "TEXT"),
    ("audit_id", "TEXT"),  # the audit this job runs (bind_audit): a CollectJob of it takes this job's key
)
_SUPERSEDABLE = "('audit', 'command', 'rerun')"


class SqliteJobStore(JobStore):
    """SQLite in WAL mode; each write is one ``BEGIN IMMEDIATE`` transaction, so it is safe across processes."""

    def __init__(self, path: str):
        self.path = path
        self._local = threading.local()
        self._migrate()

    def _migrate(self) -> None:
        db = self._db()
        db.executescript(_SCHEMA)
        with self._tx() as tx:
            row = tx.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            found = int(row["value"]) if row else 1
            if found > STORE_SCHEMA:
                raise StoreError(
                    f"{self.path}: written by a newer drift-audit (store schema {found}, this build knows up to"
                    f" {STORE_SCHEMA}); run the newer build, or point --db at a new file"
                )
            have = {r["name"] for r in tx.execute("PRAGMA table_info(jobs)")}
            for name, decl in _ADDED_COLUMNS:
                if name not in have:
                    tx.execute(f"ALTER TABLE jobs ADD COLUMN {name} {decl}")
            tx.execute("CREATE INDEX IF NOT EXISTS jobs_runs ON jobs(run_state, status)")
            for name, cols in (("jobs_check_run", "check_run_id"), ("jobs_head", "repo, head_sha"),
                               ("jobs_audit", "audit_id")):  # what a re-run or a workflow run is routed by
                tx.execute(f"CREATE INDEX IF NOT EXISTS {name} ON jobs({cols})")
            for table, name, decl in (("deliveries", "body_sha", "TEXT"), ("heads", "updated", "REAL NOT NULL DEFAULT 0")):
                if name not in {r["name"] for r in tx.execute(f"PRAGMA table_info({table})")}:
                    tx.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
            tx.execute("CREATE INDEX IF NOT EXISTS deliveries_body ON deliveries(body_sha)")
            tx.execute("INSERT OR REPLACE INTO meta(name, value) VALUES ('schema', ?)", (str(STORE_SCHEMA),))

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
    def accept(self, delivery: str, event: str, job: Job | None, *, max_attempts: int = 5,
               body_sha: str | None = None) -> tuple[bool, int | None]:
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT job_id FROM deliveries WHERE guid = ?", (delivery,)).fetchone()
            if row is not None:
                return False, row["job_id"]  # GitHub's redelivery keeps the GUID
            if body_sha is not None and db.execute(
                    "SELECT 1 FROM deliveries WHERE body_sha = ? LIMIT 1", (body_sha,)).fetchone() is not None:
                raise ReplayedDelivery("this body was delivered before under another X-GitHub-Delivery")
            db.execute("INSERT INTO deliveries(guid, event, received, body_sha) VALUES (?, ?, ?, ?)",
                       (delivery, event, now, body_sha))
            if job is None or self._stale_push(db, job):
                return True, None
            routed = self._route(db, job)
            if routed is None:
                return True, None
            job = self._pin(db, routed, now)
            if job.supersedes and job.head:
                self._supersede(db, job.key, job.head, now)
            job_id = db.execute(
                "INSERT INTO jobs(delivery, key, kind, head_sha, payload, status, max_attempts, created, updated,"
                " version, repo, installation_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (delivery, job.key, job.kind, job.head, dump_job(job), QUEUED, max_attempts, now, now, JOB_SCHEMA,
                 job.repo, job.installation_id),
            ).lastrowid
            db.execute("UPDATE deliveries SET job_id = ? WHERE guid = ?", (job_id, delivery))
            return True, job_id

    @staticmethod
    def _stale_push(db: sqlite3.Connection, job: Job) -> bool:
        """A push of another head older than the one recorded (a redelivery that arrives late): queuing it would
        supersede the current head's audit with an old one. The delivery is recorded, nothing is queued."""
        if not (isinstance(job, AuditJob) and job.cause == "pull_request" and job.pr is not None and job.pushed):
            return False
        row = db.execute("SELECT head_sha, updated FROM heads WHERE repo = ? AND pr = ?", (job.repo, job.pr)).fetchone()
        return row is not None and row["head_sha"] != job.head_sha and job.pushed < row["updated"]

    @staticmethod
    def _route(db: sqlite3.Connection, job: Job) -> Job | None:
        """What intake could not know, from the bot's own records (None: nothing of ours to act on).

        - A workflow run's results take the key of the job that dispatched it (one PR's jobs run one at a time,
          so an old head's results never publish while, or after, a newer head's audit does).
        - A re-run that names no pull request (a fork PR's check run: GitHub leaves ``pull_requests`` empty when
          the head is in another repository), or no check run (a re-requested check suite), is matched to the
          check run this bot opened on that commit, and takes that job's PR and key."""
        if isinstance(job, CollectJob):
            row = db.execute("SELECT j.key FROM audits a JOIN jobs j ON j.id = a.job_id WHERE a.audit_id = ?"
                             " AND a.repo = ?", (job.audit_id, job.repo)).fetchone() or db.execute(
                "SELECT key FROM jobs WHERE audit_id = ? AND repo = ? ORDER BY id DESC LIMIT 1",
                (job.audit_id, job.repo)).fetchone()
            return replace(job, key=row["key"]) if row else job
        if not isinstance(job, RerunJob) or (job.pr is not None and job.check_run_id is not None):
            return job
        if job.check_run_id is not None:
            rows = db.execute(f"SELECT * FROM jobs WHERE repo = ? AND check_run_id = ? AND kind IN {_SUPERSEDABLE}"
                              " ORDER BY id DESC", (job.repo, job.check_run_id)).fetchall()
        else:
            rows = db.execute(f"SELECT * FROM jobs WHERE repo = ? AND head_sha = ? AND check_run_id > 0"
                              f" AND kind IN {_SUPERSEDABLE} ORDER BY id DESC", (job.repo, job.head_sha)).fetchall()
        for row in rows:
            try:
                opened = load_job(row["kind"], row["version"], row["payload"])
            except JobLoadError:
                continue
            pr = getattr(opened, "pr", None)
            if pr is None or (job.pr is not None and pr != job.pr):
                continue
            return replace(job, pr=pr, key=opened.key, check_run_id=row["check_run_id"])
        return None

    @staticmethod
    def _pin(db: sqlite3.Connection, job: Job, now: float) -> Job:
        """A PR push records the PR's head; a command is pinned to the head recorded when it arrives."""
        if isinstance(job, AuditJob) and job.cause == "pull_request" and job.pr is not None:
            db.execute(  # ``updated``: when GitHub says this head arrived (kept while the head stays the same)
                "INSERT INTO heads(repo, pr, head_sha, seen, updated) VALUES (?, ?, ?, ?, ?) ON CONFLICT(repo, pr)"
                " DO UPDATE SET updated = CASE WHEN heads.head_sha = excluded.head_sha THEN heads.updated"
                " ELSE excluded.updated END, head_sha = excluded.head_sha, seen = excluded.seen",
                (job.repo, job.pr, job.head_sha, now, job.pushed),
            )
        if isinstance(job, CommandJob) and job.head_sha is None:
            row = db.execute("SELECT head_sha, updated FROM heads WHERE repo = ? AND pr = ?",
                             (job.repo, job.pr)).fetchone()
            if row is not None and job.written and row["updated"] and job.written <= row["updated"]:
                # written before that head was pushed (a delivery that arrives late, a redelivery, a replay):
                # the writer approved an older commit, never this one
                return replace(job, head_sha=None, predates=row["head_sha"], received=now)
            job = replace(job, head_sha=row["head_sha"] if row else None, received=now)
        return job

    def known_head(self, repo: str, pr: int) -> str | None:
        row = self._db().execute("SELECT head_sha FROM heads WHERE repo = ? AND pr = ?", (repo, pr)).fetchone()
        return row["head_sha"] if row else None

    def record_head(self, repo: str, pr: int, head_sha: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO heads(repo, pr, head_sha, seen) VALUES (?, ?, ?, ?) ON CONFLICT(repo, pr)"
                " DO UPDATE SET head_sha = excluded.head_sha, seen = excluded.seen",
                (repo, pr, head_sha, time.time()),
            )

    @staticmethod
    def _supersede(db: sqlite3.Connection, key: str, head_sha: str, now: float) -> None:
        # a queued audit with nothing on GitHub yet: drop it; anything else (a queued audit with a check run,
        # a running one, a command, a re-run): tell its worker, which closes the check run or answers the comment
        db.execute(
            "UPDATE jobs SET status = ?, superseded_by = ?, updated = ? WHERE key = ? AND status = ?"
            " AND check_run_id IS NULL AND head_sha IS NOT NULL AND head_sha != ? AND kind = 'audit'",
            (SUPERSEDED, head_sha, now, key, QUEUED, head_sha),
        )
        db.execute(
            "UPDATE jobs SET superseded_by = ?, updated = ? WHERE key = ? AND status IN (?, ?)"
            f" AND head_sha IS NOT NULL AND head_sha != ? AND kind IN {_SUPERSEDABLE}",
            (head_sha, now, key, QUEUED, LEASED, head_sha),
        )

    def bind_audit(self, job_id: int, audit_id: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET audit_id = ? WHERE id = ?", (audit_id, job_id))

    def mark_head(self, job_id: int, head_sha: str) -> None:
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT key FROM jobs WHERE id = ?", (job_id,)).fetchone()
            db.execute("UPDATE jobs SET head_sha = ?, updated = ? WHERE id = ?", (head_sha, now, job_id))
            self._supersede(db, row["key"], head_sha, now)

    # ------------------------------------------------------------------ leases
    @staticmethod
    def _expire(db: sqlite3.Connection, now: float) -> int:
        # a job whose lease ran out with no attempts left is a poison job: fail it, never loop on it
        return db.execute(
            "UPDATE jobs SET status = ?, error = 'the process running its last attempt stopped (its lease expired)'"
            " || CASE WHEN error != '' THEN '; the attempt before: ' || error ELSE '' END, updated = ?"
            " WHERE status = ? AND lease_until < ? AND attempts >= max_attempts",
            (FAILED, now, LEASED, now),
        ).rowcount

    def expire_leases(self) -> int:
        with self._tx() as db:
            return self._expire(db, time.time())

    def lease(self, owner: str, lease_seconds: float) -> JobRow | None:
        """The next runnable job, loaded; rows that do not load are dead-lettered on the way."""
        while True:
            found = self._lease_one(owner, lease_seconds)
            if found is not False:
                return found  # type: ignore[return-value]

    def _lease_one(self, owner: str, lease_seconds: float) -> JobRow | None | bool:
        now = time.time()
        with self._tx() as db:
            self._expire(db, now)
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
            try:
                load_job(row["kind"], row["version"], row["payload"])
            except JobLoadError as exc:
                db.execute(
                    "UPDATE jobs SET status = ?, error = ?, lease_until = 0, updated = ? WHERE id = ?",
                    (DEAD, f"dead-lettered: {exc}"[:2000], now, row["id"]),
                )
                return False  # committed; look for the next one
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

    def finish(self, job_id: int, owner: str, status: str = DONE, result: str = "", error: str = "") -> bool:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET status = ?, result = ?, error = CASE WHEN ? != '' THEN ? ELSE error END,"
                " lease_until = 0, updated = ? WHERE id = ? AND lease_owner = ? AND status = ?",
                (status, result, error, error[-2000:], time.time(), job_id, owner, LEASED),
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

    def note_error(self, job_id: int, owner: str, error: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET error = ? WHERE id = ? AND lease_owner = ? AND status = ?",
                       (error[-2000:], job_id, owner, LEASED))

    def has_newer(self, job_id: int) -> bool:
        row = self._db().execute(
            "SELECT 1 FROM jobs n JOIN jobs j ON n.key = j.key AND n.id > j.id WHERE j.id = ? LIMIT 1", (job_id,)
        ).fetchone()
        return row is not None

    def superseded_by(self, job_id: int) -> str | None:
        row = self._db().execute("SELECT superseded_by FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row["superseded_by"] if row else None

    def set_check_run(self, job_id: int, check_run_id: int) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET check_run_id = ?, run_state = CASE WHEN run_state = ? THEN run_state ELSE ? END,"
                " updated = ? WHERE id = ?",
                (check_run_id, RUN_CLOSED, RUN_OPEN, time.time(), job_id),
            )

    def opening_run(self, job_id: int, external_id: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE jobs SET run_state = ?, external_id = ? WHERE id = ? AND (run_state IS NULL OR run_state = ?)",
                (RUN_OPENING, external_id, job_id, RUN_CLOSED),
            )

    def close_run(self, job_id: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET run_state = ? WHERE id = ?", (RUN_CLOSED, job_id))

    def stale_runs(self, gpu_timeout: float) -> list[JobRow]:
        cutoff = time.time() - gpu_timeout
        rows = self._db().execute(
            "SELECT * FROM jobs j WHERE j.run_state IN (?, ?) AND (j.status IN (?, ?, ?) OR (j.status = ? AND NOT"
            " EXISTS (SELECT 1 FROM audits a WHERE a.job_id = j.id AND a.status = 'awaiting-gpu' AND a.updated > ?)))"
            " ORDER BY j.id",
            (RUN_OPENING, RUN_OPEN, FAILED, DEAD, SUPERSEDED, DONE, cutoff),
        ).fetchall()
        return [_row(r) for r in rows]

    def unannounced(self, limit: int = 20) -> list[JobRow]:
        rows = self._db().execute(
            "SELECT * FROM jobs WHERE status = ? AND kind = 'audit' AND check_run_id IS NULL"
            " AND superseded_by IS NULL ORDER BY id LIMIT ?",
            (QUEUED, limit),
        ).fetchall()
        return [r for r in map(_row, rows) if r.job is not None]

    def claim_announce(self, job_id: int) -> bool:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET check_run_id = 0, updated = ? WHERE id = ? AND check_run_id IS NULL AND status = ?"
                " AND superseded_by IS NULL",
                (time.time(), job_id, QUEUED),
            )
            return cur.rowcount == 1

    def release_stale_announces(self, older_than: float) -> int:
        """Claims left by an announcer that died mid-create: the worker looks the run up by external_id."""
        with self._tx() as db:
            return db.execute(
                "UPDATE jobs SET check_run_id = NULL WHERE check_run_id = 0 AND status = ? AND updated < ?",
                (QUEUED, time.time() - older_than),
            ).rowcount

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

    def audits_of_head(self, repo: str, head_sha: str) -> list[AuditRecord]:
        rows = self._db().execute(
            "SELECT * FROM audits WHERE repo = ? AND head_sha = ? ORDER BY updated DESC", (repo, head_sha)
        ).fetchall()
        return [_audit(r) for r in rows]

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


def _row(row: sqlite3.Row) -> JobRow:
    """A row for listing: a row that does not load has ``job`` None and says why in ``error``."""
    error = row["error"]
    try:
        job: Job | None = load_job(row["kind"], row["version"], row["payload"])
    except JobLoadError as exc:
        job, error = None, error or f"does not load: {exc}"
    return JobRow(
        id=row["id"],
        job=job,
        status=row["status"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        delivery=row["delivery"],
        lease_owner=row["lease_owner"],
        lease_until=row["lease_until"],
        check_run_id=row["check_run_id"],
        superseded_by=row["superseded_by"],
        error=error,
        result=row["result"],
        created=row["created"],
        updated=row["updated"],
        kind=row["kind"],
        repo=row["repo"],
        installation_id=row["installation_id"],
        head_sha=row["head_sha"],
        run_state=row["run_state"],
        external_id=row["external_id"],
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
