"""Webhook event → job. Pure: no network, no database, so every event shape is testable from fixtures.

Each job names a ``key`` (one PR, or one merge-queue entry): jobs with the same
key run one at a time, and a newer head SHA supersedes an older one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.commands import find_command
from checks.model import AuditOptions

AUDIT_PR_ACTIONS = ("opened", "synchronize", "reopened", "ready_for_review")
UNTRUSTED_ASSOCIATIONS = ("FIRST_TIME_CONTRIBUTOR", "FIRST_TIMER", "NONE", "MANNEQUIN")


@dataclass
class Job:
    kind: str  # audit | command | collect | installation
    repo: str  # owner/name
    key: str
    installation_id: int | None = None
    pr: int | None = None
    head_sha: str | None = None
    base_sha: str | None = None
    trigger: str = "pull_request"
    options: AuditOptions = field(default_factory=AuditOptions)
    clone_url: str = ""
    untrusted: bool = False  # fork or first-time contributor: no self-hosted runners without a writer's /audit
    actor: str | None = None  # who asked (commenter / sender)
    comment_id: int | None = None
    command: str | None = None  # the /audit line
    run_id: int | None = None  # workflow_run completed
    check_run_id: int | None = None  # check_run rerequested: conclude this run again
    audit_id: str | None = None  # workflow_run: the audit and runner label its title names
    label: str | None = None
    note: str = ""


@dataclass
class Ignored:
    reason: str


def _installation(payload: dict) -> int | None:
    inst = payload.get("installation") or {}
    return inst.get("id")


def _repo(payload: dict) -> tuple[str, str]:
    repo = payload.get("repository") or {}
    return repo.get("full_name", ""), repo.get("clone_url", "")


def is_untrusted(pr: dict) -> bool:
    head_repo = ((pr.get("head") or {}).get("repo") or {}).get("full_name")
    base_repo = ((pr.get("base") or {}).get("repo") or {}).get("full_name")
    fork = head_repo is None or head_repo != base_repo
    return fork or pr.get("author_association") in UNTRUSTED_ASSOCIATIONS


def pr_key(repo: str, number: int) -> str:
    return f"{repo}#{number}"


def job_for(
    event: str, payload: dict[str, Any], *, audit_drafts: bool = False, app_id: int | None = None
) -> Job | Ignored:
    """The job one delivery asks for, or why it is ignored."""
    action = payload.get("action")
    repo, clone = _repo(payload)
    inst = _installation(payload)
    if event == "ping":
        return Ignored("ping")
    if event in ("installation", "installation_repositories"):
        names = [r.get("full_name") for r in payload.get("repositories") or payload.get("repositories_added") or []]
        account = ((payload.get("installation") or {}).get("account") or {}).get("login", "")
        return Job(
            "installation",
            account,
            f"installation:{inst}",
            installation_id=inst,
            trigger="installation",
            note=f"{action}: {', '.join(n for n in names if n) or 'all repositories'}",
        )
    if not repo:
        return Ignored(f"{event}: no repository in payload")

    def job(kind: str, key: str, **fields: Any) -> Job:
        """A job on this delivery's repository, through its installation."""
        return Job(kind, repo, key, installation_id=inst, clone_url=clone, **fields)

    def pr_job(kind: str, number: int, **fields: Any) -> Job:
        return job(kind, pr_key(repo, number), pr=number, **fields)

    if event == "pull_request":
        pr = payload.get("pull_request") or {}
        if action not in AUDIT_PR_ACTIONS:
            return Ignored(f"pull_request.{action}")
        if pr.get("draft") and not audit_drafts:
            return Ignored("draft pull request (audited when marked ready for review)")
        return pr_job(
            "audit",
            pr["number"],
            head_sha=pr["head"]["sha"],
            base_sha=pr["base"]["sha"],
            trigger="pull_request",
            options=AuditOptions(run=True),
            untrusted=is_untrusted(pr),
            actor=(pr.get("user") or {}).get("login"),
        )

    if event == "issue_comment":
        issue = payload.get("issue") or {}
        comment = payload.get("comment") or {}
        if action != "created":
            return Ignored(f"issue_comment.{action}")
        if not issue.get("pull_request"):
            return Ignored("comment on an issue, not a pull request")
        if (comment.get("user") or {}).get("type") == "Bot":
            return Ignored("comment by a bot")
        line = find_command(comment.get("body") or "")
        if line is None:
            return Ignored("comment without an /audit command")
        return pr_job(
            "command",
            issue["number"],
            trigger="comment",
            actor=(comment.get("user") or {}).get("login"),
            comment_id=comment.get("id"),
            command=line,
        )

    if event == "check_run":
        run = payload.get("check_run") or {}
        if action != "rerequested":
            return Ignored(f"check_run.{action}")
        if app_id is not None and (run.get("app") or {}).get("id") not in (None, app_id):
            return Ignored("check run of another app")
        prs = run.get("pull_requests") or []
        if prs:
            number = prs[0]["number"]
            return pr_job(
                "command",
                number,
                trigger="check_run",
                actor=(payload.get("sender") or {}).get("login"),
                command="/audit",
                check_run_id=run.get("id"),
                head_sha=run.get("head_sha"),
            )
        ext = run.get("external_id") or ""
        if ext.startswith("mg:"):  # a merge-queue run: base sha and queue ref ride in external_id
            _, base_sha, ref = ext.split(":", 2)
            return job(
                "audit",
                f"{repo}@{ref}",
                head_sha=run["head_sha"],
                base_sha=base_sha,
                trigger="merge_group",
                options=AuditOptions(run=True),
                check_run_id=run.get("id"),
            )
        return Ignored("check run with no pull request and no merge-queue entry")

    if event == "merge_group":
        mg = payload.get("merge_group") or {}
        if action != "checks_requested":
            return Ignored(f"merge_group.{action}")
        return job(
            "audit",
            f"{repo}@{mg['head_ref']}",
            head_sha=mg["head_sha"],
            base_sha=mg["base_sha"],
            trigger="merge_group",
            options=AuditOptions(run=True),
            note=mg.get("head_ref", ""),
        )

    if event == "workflow_run":
        run = payload.get("workflow_run") or {}
        if action != "completed":
            return Ignored(f"workflow_run.{action}")
        from runner.actions import run_of_event  # pure: reads the run's title and path

        ours = run_of_event(payload)
        if ours is None:
            return Ignored("workflow run that is not a Drift Audit GPU run")
        run_id, audit_id, label = ours
        return job(
            "collect",
            f"{repo}!run:{run_id}",
            head_sha=run.get("head_sha"),
            trigger="workflow_run",
            run_id=run_id,
            audit_id=audit_id,
            label=label,
            note=run.get("path") or "",
        )

    return Ignored(f"unhandled event '{event}'")
