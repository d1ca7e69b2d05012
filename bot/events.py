"""Webhook delivery → typed job. Pure: no network, no database, so every event shape is testable from fixtures.

``read_delivery`` is the whole intake decision: the body is decoded with its
nesting capped, validated against GitHub's schema for its event and action
(``bot.payloads``), and turned into one typed job (``bot.jobs``) through
typed field reads. Anything wrong raises ``PayloadError`` naming the field.
Nothing here parses comment markdown: a comment that mentions ``/audit``
becomes a command job and the worker parses it, so intake stays cheap
whatever a commenter writes.

Each job names a ``key`` (one PR, or one merge-queue entry): jobs with the same
key run one at a time, and a newer head SHA supersedes an older one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from bot.commands import MAX_BODY
from bot.jobs import AuditJob, CollectJob, CommandJob, InstallationJob, Job, JobLoadError, RerunJob
from bot.payloads import Fields, PayloadError, decode, validate
from checks.model import AuditOptions

AUDIT_PR_ACTIONS = ("opened", "synchronize", "reopened", "ready_for_review")
UNTRUSTED_ASSOCIATIONS = ("FIRST_TIME_CONTRIBUTOR", "FIRST_TIMER", "NONE", "MANNEQUIN")
ACTED_ON = {
    "pull_request": (*AUDIT_PR_ACTIONS, "edited"),  # edited: only a new base is audited
    "issue_comment": ("created",),
    "check_run": ("rerequested",),
    "check_suite": ("rerequested",),
    "merge_group": ("checks_requested",),
    "workflow_run": ("completed",),
}


def _retargeted(payload: dict) -> bool:
    """A ``pull_request.edited`` that moved the PR to another base (not a title or body edit)."""
    changes = payload.get("changes") if isinstance(payload, dict) else None
    return isinstance(changes, dict) and isinstance(changes.get("base"), dict)


@dataclass
class Ignored:
    reason: str


def read_delivery(
    event: str, body: bytes, *, audit_drafts: bool = False, app_id: int | None = None
) -> Job | Ignored:
    """The job a verified delivery asks for, or why it is ignored; ``PayloadError`` for a malformed one."""
    payload = decode(body)
    action = Fields(payload).get("action", str, required=False)
    wanted = ACTED_ON.get(event)
    if wanted is not None and action not in wanted:
        return Ignored(f"{event}.{action}")  # never acted on, so never worth validating
    if event == "pull_request" and action == "edited" and not _retargeted(payload):
        return Ignored("pull request edited without a new base (its title or body)")  # before the schema's ~1 ms
    validate(event, action, payload)
    job = job_for(event, payload, audit_drafts=audit_drafts, app_id=app_id)
    if not isinstance(job, Ignored):
        try:
            job.validate()
        except JobLoadError as exc:
            raise PayloadError("$", str(exc)) from None
    return job


def is_untrusted(pr: Fields) -> bool:
    head_repo = pr.get("head.repo.full_name", str, required=False)
    base_repo = pr.get("base.repo.full_name", str, required=False)
    fork = head_repo is None or head_repo != base_repo
    return fork or pr.get("author_association", str, required=False) in UNTRUSTED_ASSOCIATIONS


def epoch(stamp: str | None) -> float:
    """GitHub's ISO 8601 time (``2019-05-15T15:20:21Z``) as epoch seconds; 0.0 when absent or unreadable."""
    if not stamp:
        return 0.0
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return max(when.timestamp(), 0.0)
    except (OverflowError, OSError, ValueError):
        return 0.0


def pr_key(repo: str, number: int) -> str:
    return f"{repo}#{number}"


def job_for(event: str, payload: dict, *, audit_drafts: bool = False, app_id: int | None = None) -> Job | Ignored:
    """The job one (schema-valid) payload asks for, or why it is ignored."""
    f = Fields(payload)
    action = f.get("action", str, required=False)
    wanted = ACTED_ON.get(event)
    if wanted is not None and action not in wanted:
        return Ignored(f"{event}.{action}")
    inst = f.get("installation.id", int, required=False)
    if event == "ping":
        return Ignored("ping")
    if event in ("installation", "installation_repositories"):
        listed = f.items("repositories") or f.items("repositories_added")
        names = [r.get("full_name", str, required=False) for r in listed]
        account = f.get("installation.account.login", str, required=False, default="")
        return InstallationJob(
            repo=account,
            key=f"installation:{inst}",
            installation_id=inst,
            note=f"{action}: {', '.join(n for n in names if n) or 'all repositories'}",
        )
    if f.get("repository", dict, required=False) is None:
        return Ignored(f"{event}: no repository in payload")
    repo = f.get("repository.full_name", str)
    clone = f.get("repository.clone_url", str, required=False, default="")
    common = {"repo": repo, "installation_id": inst, "clone_url": clone}

    if event == "pull_request":
        if action == "edited" and not _retargeted(payload):
            return Ignored("pull request edited without a new base (its title or body)")
        # A new base is a new audit of the same head: the config is the base's, and GitHub re-runs no check when
        # a PR is retargeted, so the green check earned against a laxer branch would stand for the new one.
        pr = f.obj("pull_request")
        if pr.get("draft", bool, required=False) and not audit_drafts:
            return Ignored("draft pull request (audited when marked ready for review)")
        number = pr.get("number", int)
        return AuditJob(
            **common,
            key=pr_key(repo, number),
            pr=number,
            head_sha=pr.get("head.sha", str),
            base_sha=pr.get("base.sha", str),
            cause="pull_request",
            options=AuditOptions(run=True),
            untrusted=is_untrusted(pr),
            actor=pr.get("user.login", str, required=False),
            pushed=epoch(pr.get("updated_at", str, required=False)),
        )

    if event == "issue_comment":
        if f.get("issue.pull_request", dict, required=False) is None:
            return Ignored("comment on an issue, not a pull request")
        comment = f.obj("comment")
        if comment.get("user.type", str, required=False) == "Bot":
            return Ignored("comment by a bot")
        body = comment.get("body", str, required=False, default="")
        if len(body) > MAX_BODY:
            return Ignored(f"comment body over GitHub's {MAX_BODY}-character limit")
        if "/audit" not in body.lower():
            return Ignored("comment without an /audit command")
        number = f.get("issue.number", int)
        return CommandJob(
            **common,
            key=pr_key(repo, number),
            pr=number,
            comment_id=comment.get("id", int),
            body=body,
            actor=comment.get("user.login", str),
            written=epoch(comment.get("created_at", str, required=False)),
        )

    if event == "check_run":
        run = f.obj("check_run")
        if app_id is not None and run.get("app.id", int, required=False) != app_id:
            return Ignored("check run of another app")  # or of no app: only our own runs are re-run
        prs = run.items("pull_requests")
        if prs:
            number = prs[0].get("number", int)
            return RerunJob(
                **common,
                key=pr_key(repo, number),
                pr=number,
                check_run_id=run.get("id", int),
                head_sha=run.get("head_sha", str),
                actor=f.get("sender.login", str, required=False),
            )
        ext = run.get("external_id", str, required=False, default="")
        if ext.startswith("mg:") and ext.count(":") >= 2:  # a merge-queue run: base sha and queue ref ride in it
            _, base_sha, ref = ext.split(":", 2)
            return AuditJob(
                **common,
                key=f"{repo}@{ref}",
                head_sha=run.get("head_sha", str),
                base_sha=base_sha,
                cause="merge_group",
                check_run_id=run.get("id", int),
            )
        # GitHub lists no pull request for a run whose head is in a fork: the store finds the PR from the job
        # that opened this run (bot.queue._route), or ignores a run it has no record of
        run_id = run.get("id", int)
        return RerunJob(**common, key=f"{repo}!check-run:{run_id}", check_run_id=run_id,
                        head_sha=run.get("head_sha", str), actor=f.get("sender.login", str, required=False))

    if event == "check_suite":  # "Re-run all checks": the suite's head, in the check run this bot opened on it
        suite = f.obj("check_suite")
        if app_id is not None and suite.get("app.id", int, required=False) != app_id:
            return Ignored("check suite of another app")
        head = suite.get("head_sha", str)
        prs = suite.items("pull_requests")
        return RerunJob(**common, key=f"{repo}!check-suite:{head}", head_sha=head,
                        pr=prs[0].get("number", int) if prs else None, actor=f.get("sender.login", str, required=False))

    if event == "merge_group":
        mg = f.obj("merge_group")
        ref = mg.get("head_ref", str)
        return AuditJob(
            **common,
            key=f"{repo}@{ref}",
            head_sha=mg.get("head_sha", str),
            base_sha=mg.get("base_sha", str),
            cause="merge_group",
            note=ref,
        )

    if event == "workflow_run":
        from runner.actions import run_of_event  # pure: reads the run's title and path

        run = f.obj("workflow_run")
        run.get("id", int)
        run.get("display_title", str, required=False)
        ours = run_of_event(payload)
        if ours is None:
            return Ignored("workflow run that is not a Drift Audit GPU run")
        if run.get("event", str, required=False) != "workflow_dispatch":
            # the bot starts GPU runs with workflow_dispatch, which needs write access; a fork's pull_request
            # run of its own copy of the workflow can take the same path and run-name, and must not stand in
            # for (or use up) the run the bot is waiting for
            return Ignored("workflow run not started by workflow_dispatch (a GPU run is dispatched by the bot)")
        head_repo = run.get("head_repository.full_name", str, required=False)
        if head_repo is not None and head_repo != repo:
            return Ignored("workflow run of another repository's code")
        run_id, audit_id, label = ours
        return CollectJob(
            **common,
            key=f"{repo}!audit:{audit_id}",  # one audit's runs (one per label) fold in one at a time
            head_sha=run.get("head_sha", str, required=False),
            run_id=run_id,
            audit_id=audit_id,
            label=label,
            note=run.get("path", str, required=False, default=""),
        )

    return Ignored(f"unhandled event '{event}'")


__all__ = ["Ignored", "PayloadError", "is_untrusted", "job_for", "pr_key", "read_delivery"]
