"""The typed objects that flow between pipeline stages.

Every stage is a function from one of these to the next, and each one
round-trips through JSON (``to_json`` / ``from_json``), because they cross
process and machine boundaries: a GPU runner gets a ``TestPlan`` and hands
back ``Results``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import cattrs

_converter = cattrs.Converter(forbid_extra_keys=False)
T = TypeVar("T")


def to_dict(obj: Any) -> Any:
    return _converter.unstructure(obj)


def from_dict(cls: type[T], data: Any) -> T:
    return _converter.structure(data, cls)


def to_json(obj: Any, indent: int | None = 2) -> str:
    return json.dumps(to_dict(obj), indent=indent, sort_keys=False)


def from_json(cls: type[T], text: str) -> T:
    return from_dict(cls, json.loads(text))


# --------------------------------------------------------------------------- request

Trigger = Literal["cli", "pull_request", "comment", "merge_group", "check_run", "workflow_run"]


@dataclass
class AuditOptions:
    run: bool = False  # execute the selected suites (locally, or via the dispatcher)
    all_suites: bool = False  # run every suite, ignoring selection
    suites: list[str] = field(default_factory=list)  # suites asked for by id (/audit run X)
    pillars: list[str] = field(default_factory=list)  # restrict the report to these pillars
    runner: str | None = None  # restrict execution to one runner label
    failed_only: bool = False  # /audit retry


@dataclass
class AuditRequest:
    repo: str  # local path of the repository (or its mirror)
    base: str  # rev or sha
    head: str
    pr: int | None = None
    trigger: Trigger = "cli"
    options: AuditOptions = field(default_factory=AuditOptions)
    nonce: str = ""  # tells apart repeated audits of one head (the bot's job id)


@dataclass
class Checkout:
    """Resolved revisions of a request; files are read from git objects, never a work tree.

    The pipeline attaches the open git.Repo and the loaded checks.config.Config so that git is
    opened and the config parsed once per audit. They are process-local, not fields: never
    serialised, never compared, and absent on a Checkout loaded from JSON.
    """

    repo: str
    base_sha: str
    head_sha: str
    merge_base_sha: str

    def attach(self, *, git: Any = None, config: Any = None) -> Checkout:
        if git is not None:
            self.__dict__["_git"] = git
        if config is not None:
            self.__dict__["_config"] = config
        return self

    @property
    def git(self) -> Any:
        """The open git.Repo, or None."""
        return self.__dict__.get("_git")

    @property
    def config(self) -> Any:
        """The loaded checks.config.Config, or None."""
        return self.__dict__.get("_config")


# --------------------------------------------------------------------------- diff

FileStatus = Literal["added", "modified", "deleted", "renamed", "copied"]


@dataclass
class Hunk:
    old_start: int
    old_lines: int
    new_start: int
    new_lines: int
    section: str = ""  # the function context git prints after @@
    added: list[int] = field(default_factory=list)  # head line numbers added
    removed: list[int] = field(default_factory=list)  # base line numbers removed


@dataclass
class FileChange:
    path: str  # head path; the base path for a deletion
    status: FileStatus
    old_path: str | None = None  # set for renames and copies
    binary: bool = False
    old_mode: str | None = None
    new_mode: str | None = None
    old_blob: str | None = None
    new_blob: str | None = None
    additions: int = 0
    deletions: int = 0
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def mode_changed(self) -> bool:
        return bool(self.old_mode and self.new_mode and self.old_mode != self.new_mode)


@dataclass
class ChangeSet:
    base_sha: str
    head_sha: str
    merge_base_sha: str
    files: list[FileChange] = field(default_factory=list)

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]


# --------------------------------------------------------------------------- pillars


@dataclass
class Touch:
    """Why a pillar was touched in one file: a path glob or a symbol pattern matched."""

    path: str
    reason: Literal["path", "symbol", "fallback"]
    pattern: str = ""  # the glob or "path-glob::name-pattern" that matched
    symbols: list[str] = field(default_factory=list)  # qualified names of the touched definitions
    lines: list[int] = field(default_factory=list)  # first changed line of each matching hunk or symbol


@dataclass
class PillarHit:
    id: str
    title: str
    files: list[str] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)  # "path::qualified.name"
    touches: list[Touch] = field(default_factory=list)


@dataclass
class HunkPillars:
    path: str
    hunk: int  # index into FileChange.hunks
    symbol: str | None  # the first of ``symbols``
    pillars: list[str]
    symbols: list[str] = field(default_factory=list)  # innermost definitions the hunk's lines fall in


@dataclass
class PillarMap:
    pillars: list[PillarHit] = field(default_factory=list)  # config order; untouched pillars omitted
    hunks: list[HunkPillars] = field(default_factory=list)
    oversized: list[str] = field(default_factory=list)  # over [settings] max_file_bytes: mapped by path only

    def get(self, pillar_id: str) -> PillarHit | None:
        return next((p for p in self.pillars if p.id == pillar_id), None)


# --------------------------------------------------------------------------- findings

Severity = Literal["error", "warning", "note"]
# new: not on the base; pre-existing: on the base, same state; fixed: on the base, gone at head;
# changed: same identity as on the base, the PR touched the lines that produce it, still wrong;
# improved: same identity, fewer missing places; no-baseline: the rule could not run on the base.
FindingStatus = Literal["new", "pre-existing", "fixed", "changed", "improved", "no-baseline"]
# Where the rule came from: the repo's config, a built-in pack, inference over the base tree, co-change history.
FindingSource = Literal["declared", "pack", "inferred", "cochange"]
# [settings] fail_on: which findings fail the verdict.
FailOn = Literal["new-error", "new-warning", "any-error", "never"]
FAILING_STATUSES = ("new", "changed")


@dataclass
class Location:
    path: str
    line: int
    end_line: int | None = None
    note: str = ""  # what this location holds, e.g. "declared here"


@dataclass
class Finding:
    rule: str
    pillar: str
    severity: Severity
    message: str
    locations: list[Location] = field(default_factory=list)
    status: FindingStatus = "new"
    fingerprint: str = ""  # identity, stable across base/head: rule + key (+ place pair), never line numbers
    state: str = ""  # digest of what is wrong (values, missing places); same identity + other state = changed
    source: FindingSource = "declared"
    evidence: list[str] = field(default_factory=list)  # inferred/co-change rules: support, example rows, commits


@dataclass
class Unchecked:
    """A config entry that could not be evaluated; the rest of the audit still ran."""

    entry: str  # e.g. "fact 'enum_tasks'" or "rule 'task-chain-complete'"
    reason: str


@dataclass
class Findings:
    findings: list[Finding] = field(default_factory=list)
    unchecked: list[Unchecked] = field(default_factory=list)
    rules_run: list[str] = field(default_factory=list)  # ids of the rules that ran on head (any source)
    inferred: list[str] = field(default_factory=list)  # one line per inferred invariant that was checked
    fail_on: FailOn = "new-error"
    inference: str = ""  # the base commit inference read ("" when inference was off)

    def with_status(self, status: FindingStatus) -> list[Finding]:
        return [f for f in self.findings if f.status == status]

    @property
    def failing(self) -> list[Finding]:
        """The findings that fail the verdict under ``fail_on``."""
        if self.fail_on == "never":
            return []
        if self.fail_on == "any-error":
            return [f for f in self.findings if f.status != "fixed" and f.severity == "error"]
        levels = ("error",) if self.fail_on == "new-error" else ("error", "warning")
        return [f for f in self.findings if f.status in FAILING_STATUSES and f.severity in levels]


# --------------------------------------------------------------------------- tests

SuiteKind = Literal["parity", "decode", "unit"]


@dataclass
class PlannedSuite:
    id: str
    kind: SuiteKind
    command: str
    runner: str  # one label: sm90, sm120, cpu
    timeout: float = 900.0
    requires: str | None = None  # e.g. "cc >= 12.0"
    reasons: list[str] = field(default_factory=list)
    golden: str | None = None  # decode suites: golden file to compare the command's output with


@dataclass
class TestPlan:
    audit_id: str
    head_sha: str
    suites: list[PlannedSuite] = field(default_factory=list)
    not_affected: list[str] = field(default_factory=list)  # suite ids, runnable with `--suite ID`
    inert: list[str] = field(default_factory=list)  # "path: why" for changed files no code can observe
    # selected, then left out by the request's runner filter (`--runner cpu`): said, with how to run them
    filtered: list[PlannedSuite] = field(default_factory=list)

    def for_runner(self, label: str) -> list[PlannedSuite]:
        return [s for s in self.suites if s.runner == label]

    @property
    def runners(self) -> list[str]:
        return sorted({s.runner for s in self.suites})


# not-runnable: the suite cannot be collected on this machine (an unbuilt extension, no CUDA); never a failure.
Outcome = Literal[
    "passed", "failed", "error", "skipped", "timeout", "segfault", "abort", "cuda-error", "not-run", "not-runnable"
]


@dataclass
class CaseResult:
    name: str
    outcome: Outcome
    duration: float = 0.0
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)  # max_abs, rel, cos_diff, first_divergence, ...


@dataclass
class SuiteResult:
    suite: str
    runner: str
    outcome: Outcome
    duration: float = 0.0
    reason: str = ""  # why skipped / how it failed
    output_tail: str = ""
    cases: list[CaseResult] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class DeviceFingerprint:
    label: str
    host: str = ""
    gpu: str | None = None
    compute_capability: str | None = None  # "9.0"
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    triton: str | None = None
    python: str = ""


@dataclass
class Results:
    audit_id: str
    head_sha: str
    suites: list[SuiteResult] = field(default_factory=list)
    devices: list[DeviceFingerprint] = field(default_factory=list)

    def merge(self, other: Results) -> Results:
        return Results(self.audit_id, self.head_sha, self.suites + other.suites, self.devices + other.devices)


# --------------------------------------------------------------------------- report


@dataclass
class Annotation:
    path: str
    start_line: int
    end_line: int
    level: Literal["notice", "warning", "failure"]
    message: str
    title: str = ""


Verdict = Literal["pass", "fail", "neutral"]


@dataclass
class Report:
    verdict: Verdict
    headline: str  # the one-line verdict
    markdown: str  # the PR comment, <= 65 536 chars
    check_title: str
    check_summary: str  # <= 65 535 chars
    check_text: str = ""  # overflow from the comment, <= 65 535 chars
    annotations: list[Annotation] = field(default_factory=list)
    truncated: bool = False


@dataclass
class Audit:
    """Everything one audit produced: what ``--format json`` prints."""

    request: AuditRequest
    checkout: Checkout
    config_source: str
    changes: ChangeSet
    pillars: PillarMap
    findings: Findings = field(default_factory=Findings)
    plan: TestPlan | None = None
    results: Results | None = None
    report: Report | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # the PR's own config (the head's) does not load: said now, since after the merge every audit stops on it
    head_config_error: str | None = None
