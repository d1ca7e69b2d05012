"""Co-change history: files that past commits changed together (after Zimmermann et al., ICSE 2004).

When most commits that changed A also changed B, a PR that changes A and not B
may have missed B. The rule is "A → B" with support (commits that changed both)
and confidence (that share of the commits that changed A). It is a warning with
the past commits as evidence, and fails the check only when the config raises
its severity.

History is mined with one ``git log`` process and kept per repository in a
cache directory; the next audit reads only the commits added since.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from checks.model import ChangeSet, Finding, Location

MAX_FILES = 20  # a commit touching more files is a sweep (rename, format), not a coupling
CACHE_VERSION = 1
# Files that follow others and change alone by design: a new test needs no code change, a regenerated lock file
# no manifest change. A change to one of them says nothing about what else it missed.
_FOLLOWER = re.compile(
    r"(^|/)(tests?|testing)/|(^|/)(test_[^/]*|[^/]*_test)\.(py|cc|cpp|cu|c)$|(^|/)conftest\.py$"
    r"|(^|/)([^/]+\.lock|package-lock\.json|go\.sum|pnpm-lock\.yaml)$"
)


def follower(path: str) -> bool:
    """A test or lock file: it changes alone by design, so a co-change from it is no sign of a miss."""
    return bool(_FOLLOWER.search(path))


@dataclass
class Commit:
    sha: str
    subject: str
    files: list[str]


@dataclass
class History:
    head: str
    commits: list[Commit] = field(default_factory=list)  # newest first

    def touching(self, path: str) -> list[Commit]:
        return [c for c in self.commits if path in c.files]


@dataclass(frozen=True)
class Pair:
    changed: str
    missed: str
    support: int  # commits that changed both
    total: int  # commits that changed ``changed``
    commits: tuple[Commit, ...]

    @property
    def confidence(self) -> float:
        return self.support / self.total if self.total else 0.0


def _git(repo: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)


def _log(repo: str, rev_range: str, limit: int) -> list[Commit]:
    """Commits of ``rev_range``, newest first, each with the files it changed; merges left out."""
    proc = _git(repo, "log", f"-n{limit}", "--no-merges", "--no-renames", "--name-only",
                "--format=%x00%H%x09%s", rev_range)
    if proc.returncode != 0:
        return []
    out: list[Commit] = []
    for block in proc.stdout.split("\0")[1:]:
        head, _, rest = block.partition("\n")
        sha, _, subject = head.partition("\t")
        files = [line for line in rest.splitlines() if line.strip()]
        out.append(Commit(sha, subject, files))
    return out


def history(repo: str, head: str, limit: int = 1000, cache_dir: Path | None = None) -> History:
    """The last ``limit`` commits reachable from ``head``; updated incrementally from the cache."""
    path = cache_dir / f"cochange-v{CACHE_VERSION}.json" if cache_dir else None
    cached: History | None = None
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            cached = History(data["head"], [Commit(**c) for c in data["commits"]])
        except Exception:
            cached = None
    if cached is not None and cached.head == head:
        return History(head, cached.commits[:limit])
    commits: list[Commit] | None = None
    if cached is not None and _git(repo, "merge-base", "--is-ancestor", cached.head, head).returncode == 0:
        new = _log(repo, f"{cached.head}..{head}", limit)
        commits = (new + cached.commits)[:limit]
    if commits is None:
        commits = _log(repo, head, limit)
    out = History(head, commits)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"head": head, "commits": [c.__dict__ for c in commits]}))
            tmp.replace(path)
        except OSError:
            pass
    return out


def pairs_for(hist: History, changed: list[str], min_support: int = 10, min_confidence: float = 0.9) -> list[Pair]:
    """Strong "A → B" rules for each changed A whose B this change leaves alone."""
    touched = set(changed)
    out: list[Pair] = []
    for a in changed:
        if follower(a):
            continue
        with_a = [c for c in hist.touching(a) if len(c.files) <= MAX_FILES]
        if len(with_a) < min_support:
            continue
        counts: dict[str, list[Commit]] = {}
        for c in with_a:
            for b in c.files:
                if b != a:
                    counts.setdefault(b, []).append(c)
        for b, both in counts.items():
            if b in touched or len(both) < min_support or len(both) / len(with_a) < min_confidence:
                continue
            out.append(Pair(a, b, len(both), len(with_a), tuple(both)))
    out.sort(key=lambda p: (-p.confidence, -p.support, p.changed, p.missed))
    return out


def notes(
    repo: str,
    base: str,
    changes: ChangeSet,
    *,
    exists: set[str] | None = None,
    limit: int = 1000,
    min_support: int = 10,
    min_confidence: float = 0.9,
    severity: str = "warning",
    cache_dir: Path | None = None,
    pillar_of=None,
) -> list[Finding]:
    """"Likely missed" findings for a change, from the history up to its base."""
    changed = [f.path for f in changes.files if f.status != "deleted"]
    if not changed:
        return []
    hist = history(repo, base, limit, cache_dir)
    out: list[Finding] = []
    for pair in pairs_for(hist, changed, min_support, min_confidence):
        if exists is not None and pair.missed not in exists:
            continue  # B is gone at head: nothing left to update
        identity = hashlib.sha1("\0".join(["co-change", pair.changed, pair.missed]).encode()).hexdigest()[:20]
        message = (
            f"likely missed: {pair.missed} — {pair.support} of the last {pair.total} commits that changed "
            f"{pair.changed} also changed it (confidence {pair.confidence:.0%}); this change does not. Check whether "
            f"{pair.missed} needs the same change (a history note: it does not fail the check)"
        )
        out.append(
            Finding(
                rule="co-change",
                pillar=pillar_of(pair.missed) if pillar_of else "other",
                severity=severity,  # type: ignore[arg-type]
                message=message,
                locations=[Location(pair.changed, 1, note="changed here"), Location(pair.missed, 1, note="usually changes too")],
                status="new",
                fingerprint=identity,
                state=identity,
                source="cochange",
                evidence=[f"{c.sha[:12]} {c.subject}" for c in pair.commits[:5]],
            )
        )
    return out


__all__ = ["Commit", "History", "Pair", "history", "pairs_for", "notes"]
