"""Fact rows on disk, per (fact definition, blob id), so no blob is parsed twice across reviews.

A fact's rows are a function of its definition and one file's bytes, and git
names those bytes by blob id, so the pair is a cache key that never goes stale:
base-side facts are parsed once per repo, and a push re-parses only the blobs it
changed. One SQLite file holds them (one lookup per fact, one write transaction
per audit side); the bot points ``cache_dir`` at a per-repo directory.

Location: ``[settings] cache_dir``, else ``$DRIFT_AUDIT_CACHE``, else
``$XDG_CACHE_HOME/drift-audit`` (``~/.cache/drift-audit``); ``"off"`` disables it.
Each repository (by path: the bot's mirror of it) gets its own directory under
that root; a file past 1 GiB starts over rather than growing without bound. Rule findings live in a
second table, keyed by the rule and the digest of the blobs its facts read.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from checks.facts import Count, Row

VERSION = 2  # bump when the row encoding or extraction semantics change


def cache_root(setting: str = "") -> Path | None:
    where = setting or os.environ.get("DRIFT_AUDIT_CACHE", "")
    if where == "off":
        return None
    if where:
        return Path(where).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "drift-audit"


def _encode(v: Any) -> Any:
    return {"$count": [v.lo, v.hi]} if isinstance(v, Count) else v


def _decode(v: Any) -> Any:
    return Count(*v["$count"]) if isinstance(v, dict) and "$count" in v else v


class FactCache:
    """rows(sig, blob) → (rows, problem); safe to share between threads and processes."""

    def __init__(self, root: Path, max_bytes: int = 1 << 30):
        self.root = root
        self.max_bytes = max_bytes  # past this the file starts over: entries are cheap to rebuild, disks are not
        self.path = root / f"facts-v{VERSION}.sqlite"
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._pending: list[tuple[str, str, str]] = []

    def _conn(self) -> sqlite3.Connection | None:
        if self._db is None:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                if self.path.exists() and self.path.stat().st_size > self.max_bytes:
                    for stale in (self.path, self.path.with_name(self.path.name + "-wal"),
                                  self.path.with_name(self.path.name + "-shm")):
                        stale.unlink(missing_ok=True)
                db = sqlite3.connect(self.path, timeout=10, check_same_thread=False, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("CREATE TABLE IF NOT EXISTS rows (sig TEXT, blob TEXT, data TEXT, PRIMARY KEY (sig, blob))")
                # A rule's findings are a function of the rule and the blobs its facts read.
                db.execute("CREATE TABLE IF NOT EXISTS findings (key TEXT PRIMARY KEY, data TEXT)")
                self._db = db
            except (OSError, sqlite3.Error):
                return None  # an unwritable cache only costs time
        return self._db

    @staticmethod
    def key(signature: str) -> str:
        return hashlib.sha1(signature.encode()).hexdigest()

    def load(self, signature: str, blobs: list[str]) -> dict[str, tuple[list[Row], str | None]]:
        """The cached rows of ``blobs`` for one fact (paths are filled in by the caller)."""
        db = self._conn()
        if db is None or not blobs:
            return {}
        sig = self.key(signature)
        out: dict[str, tuple[list[Row], str | None]] = {}
        unique = list(dict.fromkeys(blobs))
        found: list[tuple[str, str]] = []
        with self._lock:
            try:
                for i in range(0, len(unique), 500):  # only the blobs asked for, not every side ever cached
                    chunk = unique[i:i + 500]
                    found += db.execute(f"SELECT blob, data FROM rows WHERE sig = ? AND blob IN ({','.join('?' * len(chunk))})",
                                        (sig, *chunk)).fetchall()
            except sqlite3.Error:
                return {}
        for blob, data in found:
            out[blob] = _rows(json.loads(data))
        return out

    def load_findings(self, key: str) -> list[dict] | None:
        db = self._conn()
        if db is None:
            return None
        with self._lock:
            try:
                hit = db.execute("SELECT data FROM findings WHERE key = ?", (key,)).fetchone()
            except sqlite3.Error:
                return None
        return json.loads(hit[0]) if hit else None

    def store_findings(self, key: str, findings: list[dict]) -> None:
        db = self._conn()
        if db is None:
            return
        with self._lock:
            try:
                db.execute("INSERT OR REPLACE INTO findings VALUES (?, ?)", (key, json.dumps(findings)))
            except sqlite3.Error:
                pass

    def store(self, signature: str, blob: str, fact: str, rows: list[Row], problem: str | None) -> None:
        data = {"fact": fact, "problem": problem,
                "rows": [[r.key, {k: _encode(v) for k, v in r.values.items()}, r.path, r.line, r.written]
                         for r in rows]}
        with self._lock:
            self._pending.append((self.key(signature), blob, json.dumps(data)))

    def flush(self) -> None:
        db = self._conn()
        with self._lock:
            pending, self._pending = self._pending, []
        if db is None or not pending:
            return
        try:
            with self._lock:
                db.execute("BEGIN")
                db.executemany("INSERT OR REPLACE INTO rows VALUES (?, ?, ?)", pending)
                db.execute("COMMIT")
        except sqlite3.Error:
            pass


def _rows(data: dict) -> tuple[list[Row], str | None]:
    fact = data["fact"]
    rows = [Row(fact, key, {k: _decode(v) for k, v in values.items()}, path, line, written=written)
            for key, values, path, line, written in data["rows"]]
    return rows, data["problem"]


_open: dict[str, FactCache] = {}


def fact_cache(setting: str = "", repo: str = "") -> FactCache | None:
    """The cache for ``repo`` (a path): one directory per repository under the cache root, so the bot's
    per-repo mirrors each keep their own, and one repo's history never evicts another's."""
    root = cache_root(setting)
    if root is None:
        return None
    if repo:
        root = root / ("repo-" + hashlib.sha1(os.path.realpath(repo).encode()).hexdigest()[:16])
    hit = _open.get(str(root))
    if hit is None:
        hit = _open[str(root)] = FactCache(root)
    return hit
