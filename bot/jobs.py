"""One typed job per kind, built from a validated payload at intake and loaded back in one place.

A job row in the queue carries its kind and the version of this schema it was
written with. ``load_job`` is the only way back from a row to a job: it
upgrades older versions, and anything it cannot load raises ``JobLoadError``
with the reason, which the queue records when it dead-letters the row, so one
bad row never stops the jobs behind it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from checks.model import AuditOptions, from_dict, to_dict

JOB_SCHEMA = 2  # bump when a job's fields change; add the upgrade from the previous version to _upgrade
SHA = re.compile(r"^[0-9a-f]{40}$")
REPO = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")


class JobLoadError(ValueError):
    """A stored job that cannot be loaded; the message is the dead-letter reason."""


def _check(job: Any, name: str, kind: type | tuple[type, ...], *, optional: bool = False) -> None:
    value = getattr(job, name)
    if value is None and optional:
        return
    if isinstance(value, bool) and kind is int:  # bool is an int to isinstance, never to us
        raise JobLoadError(f"{type(job).__name__}.{name}: expected int, got bool")
    if not isinstance(value, kind):
        raise JobLoadError(f"{type(job).__name__}.{name}: expected {getattr(kind, '__name__', kind)}, "
                           f"got {type(value).__name__}")


def _id(job: Any, name: str, *, optional: bool = False) -> None:
    """GitHub ids and numbers: positive and JSON-safe (below 2**53), so they fit every store's integer."""
    _check(job, name, int, optional=optional)
    value = getattr(job, name)
    if value is not None and not 0 < value < 2**53:
        raise JobLoadError(f"{type(job).__name__}.{name}: {value} is not a GitHub id")


def _sha(job: Any, name: str, *, optional: bool = False) -> None:
    _check(job, name, str, optional=optional)
    value = getattr(job, name)
    if value is not None and not SHA.match(value):
        raise JobLoadError(f"{type(job).__name__}.{name}: not a commit SHA: {value[:60]!r}")


@dataclass(kw_only=True)
class _Job:
    """What every job has: the repository, its installation, and the key that serialises its jobs."""

    kind: ClassVar[str]
    repo: str
    key: str
    installation_id: int | None = None
    clone_url: str = ""

    @property
    def trigger(self) -> str:
        return self.kind

    def validate(self) -> None:
        _check(self, "repo", str)
        if self.kind != "installation" and not REPO.match(self.repo):
            raise JobLoadError(f"{type(self).__name__}.repo: not owner/name: {self.repo[:200]!r}")
        _check(self, "key", str)
        _id(self, "installation_id", optional=True)
        _check(self, "clone_url", str)

    @property
    def head(self) -> str | None:
        """The head SHA this job is about; a job of the same key for another head supersedes it."""
        return None

    @property
    def supersedes(self) -> bool:
        """Does this job's head replace older heads of its key? Only a push (or a queue entry) does."""
        return False


@dataclass(kw_only=True)
class AuditJob(_Job):
    """Audit one head against its base: a PR push, a merge-queue entry, or a merge-queue re-run."""

    kind: ClassVar[str] = "audit"
    head_sha: str
    base_sha: str
    pr: int | None = None
    cause: str = "pull_request"  # pull_request | merge_group
    options: AuditOptions = field(default_factory=lambda: AuditOptions(run=True))
    untrusted: bool = False  # fork or first-time contributor: no self-hosted runners without a writer's /audit
    actor: str | None = None
    check_run_id: int | None = None  # a re-requested merge-queue run: conclude this run again
    note: str = ""
    pushed: float = 0.0  # the PR's updated_at (epoch, GitHub's clock) in this push's payload; 0 unknown

    @property
    def trigger(self) -> str:
        return self.cause

    @property
    def head(self) -> str | None:
        return self.head_sha

    @property
    def supersedes(self) -> bool:
        return True

    def validate(self) -> None:
        super().validate()
        _sha(self, "head_sha")
        _sha(self, "base_sha")
        _id(self, "pr", optional=True)
        if self.cause not in ("pull_request", "merge_group"):
            raise JobLoadError(f"AuditJob.cause: unknown trigger {self.cause!r}")
        _check(self, "options", AuditOptions)
        _check(self, "untrusted", bool)
        _check(self, "actor", str, optional=True)
        _id(self, "check_run_id", optional=True)
        _check(self, "note", str)
        _check(self, "pushed", (int, float))


@dataclass(kw_only=True)
class CommandJob(_Job):
    """A comment that mentions ``/audit``; it is parsed by the worker, never in the request handler.

    ``head_sha`` is the PR head the bot knew when the comment arrived: the approval is for that
    commit only, and a newer push supersedes the job. None when the bot had not seen the PR's head.
    """

    kind: ClassVar[str] = "command"
    pr: int
    comment_id: int
    body: str
    actor: str
    head_sha: str | None = None
    received: float = 0.0
    written: float = 0.0  # the comment's created_at (epoch, GitHub's clock); 0 unknown
    predates: str | None = None  # the recorded head this comment was written before (it approves nothing)

    @property
    def trigger(self) -> str:
        return "comment"

    @property
    def head(self) -> str | None:
        return self.head_sha

    def validate(self) -> None:
        super().validate()
        _id(self, "pr")
        _id(self, "comment_id")
        _check(self, "body", str)
        _check(self, "actor", str)
        _sha(self, "head_sha", optional=True)
        _check(self, "received", (int, float))
        _check(self, "written", (int, float))
        _sha(self, "predates", optional=True)


@dataclass(kw_only=True)
class RerunJob(_Job):
    """A re-requested PR check run: audit that run's head again, in that run, and nothing newer."""

    kind: ClassVar[str] = "rerun"
    head_sha: str
    pr: int | None = None  # None at intake for a fork PR's run or a check suite: the store finds it (and the run)
    check_run_id: int | None = None  # None at intake for a re-requested check suite
    actor: str | None = None

    @property
    def trigger(self) -> str:
        return "check_run"

    @property
    def head(self) -> str | None:
        return self.head_sha

    def validate(self) -> None:
        super().validate()
        _id(self, "pr", optional=True)
        _id(self, "check_run_id", optional=True)
        _sha(self, "head_sha")
        _check(self, "actor", str, optional=True)


@dataclass(kw_only=True)
class CollectJob(_Job):
    """A GPU workflow run finished: fold its results into the audit its title names."""

    kind: ClassVar[str] = "collect"
    run_id: int
    audit_id: str
    label: str
    head_sha: str | None = None
    note: str = ""

    @property
    def trigger(self) -> str:
        return "workflow_run"

    def validate(self) -> None:
        super().validate()
        _id(self, "run_id")
        _check(self, "audit_id", str)
        _check(self, "label", str)
        _sha(self, "head_sha", optional=True)
        _check(self, "note", str)


@dataclass(kw_only=True)
class InstallationJob(_Job):
    """The app was installed or changed: logged, nothing to publish."""

    kind: ClassVar[str] = "installation"
    note: str = ""

    def validate(self) -> None:
        super().validate()
        _check(self, "note", str)


Job = AuditJob | CommandJob | RerunJob | CollectJob | InstallationJob
KINDS: dict[str, type[_Job]] = {c.kind: c for c in (AuditJob, CommandJob, RerunJob, CollectJob, InstallationJob)}


def dump_job(job: Job) -> str:
    """The row payload; ``JOB_SCHEMA`` is stored beside it."""
    job.validate()
    return json.dumps(to_dict(job))


def load_job(kind: str, version: int, payload: str) -> Job:
    """A row back into its typed job, upgrading older versions; ``JobLoadError`` says why not."""
    try:
        data = json.loads(payload)
    except (TypeError, ValueError) as exc:
        raise JobLoadError(f"payload is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise JobLoadError("payload is not a JSON object")
    if version > JOB_SCHEMA:
        raise JobLoadError(f"written by a newer build (job schema {version}; this build reads up to {JOB_SCHEMA})")
    if version < JOB_SCHEMA:
        kind, data = _upgrade(kind, version, data)
    cls = KINDS.get(kind)
    if cls is None:
        raise JobLoadError(f"unknown job kind {kind!r}")
    known = {f.name for f in fields(cls)}
    try:
        job = from_dict(cls, {k: v for k, v in data.items() if k in known})
    except Exception as exc:  # cattrs raises its own exception groups; all mean the same here
        raise JobLoadError(f"{kind} job does not load: {_first_cause(exc)}") from None
    job.validate()
    return job  # type: ignore[return-value]


def _first_cause(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:300]


def _upgrade(kind: str, version: int, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Version 1 was one ``Job`` type with every field optional; map it onto the typed jobs."""
    if version != 1:
        raise JobLoadError(f"job schema {version} is not known to this build")
    base = {k: data.get(k) for k in ("repo", "key", "installation_id")} | {"clone_url": data.get("clone_url") or ""}
    if kind == "audit":
        return "audit", base | {
            "head_sha": data.get("head_sha"), "base_sha": data.get("base_sha"), "pr": data.get("pr"),
            "cause": data.get("trigger") or "pull_request", "options": data.get("options") or {},
            "untrusted": bool(data.get("untrusted")), "actor": data.get("actor"),
            "check_run_id": data.get("check_run_id"), "note": data.get("note") or "",
        }
    if kind == "command" and data.get("trigger") == "check_run":
        return "rerun", base | {
            "pr": data.get("pr"), "check_run_id": data.get("check_run_id"), "head_sha": data.get("head_sha"),
            "actor": data.get("actor"),
        }
    if kind == "command":
        return "command", base | {
            "pr": data.get("pr"), "comment_id": data.get("comment_id"), "body": data.get("command") or "",
            "actor": data.get("actor") or "", "head_sha": None,
        }
    if kind == "collect":
        return "collect", base | {
            "run_id": data.get("run_id"), "audit_id": data.get("audit_id"), "label": data.get("label"),
            "head_sha": data.get("head_sha"), "note": data.get("note") or "",
        }
    if kind == "installation":
        return "installation", base | {"note": data.get("note") or ""}
    raise JobLoadError(f"unknown version-1 job kind {kind!r}")
