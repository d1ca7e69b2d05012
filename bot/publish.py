"""Publishing one audit: a single comment edited in place, a check run, reactions.

Every step is idempotent so a job retried after a crash never posts twice:
the comment is found again by its hidden marker, the check run by its
``external_id``, and annotations already on the check run are not sent again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from github import GithubException

from checks.model import Annotation, Report

COMMENT_MARKER = "<!-- drift-audit:comment -->"
COMMENT_LIMIT = 65_536
CHECK_LIMIT = 65_535
ANNOTATION_BATCH = 50
CONCLUSIONS = {"pass": "success", "fail": "failure", "neutral": "neutral"}
_OVERFLOW_NOTE = "\n\n---\n*The rest of this report did not fit in a comment; it is in the check run{where}.*\n"


T = TypeVar("T")
CREATE_ATTEMPTS = 5


def transient(exc: GithubException) -> bool:
    """5xx, or a rate limit (403/429 that says so or carries Retry-After)."""
    if exc.status >= 500 or exc.status == 429:
        return True
    headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
    message = str((exc.data or {}).get("message", "")) if isinstance(exc.data, dict) else ""
    return exc.status == 403 and ("retry-after" in headers or "rate limit" in message.lower())


def create_once(
    create: Callable[[], T],
    find: Callable[[], T | None] | None,
    *,
    attempts: int = CREATE_ATTEMPTS,
    backoff: float = 0.2,
) -> T:
    """Run a non-idempotent create; after a transient failure, look for what it may have created first."""
    for attempt in range(attempts):
        try:
            return create()
        except GithubException as exc:
            if not transient(exc) or attempt == attempts - 1:
                raise
            retry_after = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("retry-after")
            time.sleep(min(float(retry_after), 60.0) if retry_after and retry_after.isdigit() else backoff * 2**attempt)
            landed = find() if find else None
            if landed is not None:
                return landed
    raise AssertionError("unreachable")


def reply_marker(comment_id: int) -> str:
    return f"<!-- drift-audit:reply:{comment_id} -->"


def split_comment(markdown: str, details_url: str | None = None) -> tuple[str, str]:
    """(comment ≤ 65 536 chars, overflow for the check run text)."""
    if len(markdown) <= COMMENT_LIMIT:
        return markdown, ""
    note = _OVERFLOW_NOTE.format(where=f" ([details]({details_url}))" if details_url else "")
    room = COMMENT_LIMIT - len(note)
    cut = markdown.rfind("\n", 0, room)
    cut = cut if cut > room // 2 else room
    return markdown[:cut] + note, markdown[cut:]


def cap(text: str, limit: int = CHECK_LIMIT) -> str:
    if len(text) <= limit:
        return text
    tail = "\n\n*(cut to fit GitHub's limit)*"
    return text[: limit - len(tail)] + tail


class Publisher:
    """``login`` is the app's own account (``<slug>[bot]``): a comment is ours only if that account wrote it.
    Other bots can copy the marker; GitHub answers 403 to editing their comments, and we never try."""

    def __init__(self, repo: Any, check_name: str = "Drift Audit", *, login: str, app_id: int | None = None):
        self.repo = repo
        self.check_name = check_name
        self.login = login
        self.app_id = app_id  # check runs are ours only if this app made them (any app can reuse the name)

    # ------------------------------------------------------------------ comments
    def _ours(self, comment: Any, marker: str) -> bool:
        """Written by our account and *opening* with ``marker``: the marker text can also appear inside a
        code span of a comment we wrote (a commenter's quoted command, a PR's file name), which must never
        make that comment count as another one."""
        user = comment.user
        return (_first_line(comment.body or "") == marker and user is not None and user.type == "Bot"
                and (user.login or "").lower() == self.login.lower())

    def find_comment(self, pr: int, marker: str = COMMENT_MARKER):
        for comment in self.repo.get_issue(pr).get_comments():
            if self._ours(comment, marker):
                return comment
        return None

    def upsert_comment(self, pr: int, body: str, marker: str = COMMENT_MARKER) -> int:
        if _first_line(body) != marker:
            body = f"{marker}\n{body}"
        if len(body) > COMMENT_LIMIT:
            body, _ = split_comment(body)
        existing = self.find_comment(pr, marker)
        if existing is None:
            issue = self.repo.get_issue(pr)
            return create_once(lambda: issue.create_comment(body), lambda: self.find_comment(pr, marker)).id
        if existing.body != body:
            existing.edit(body)
        return existing.id

    def react(self, comment_id: int | None, content: str) -> None:
        """Reactions are idempotent on GitHub: the same one twice is one reaction."""
        if comment_id is None:
            return
        try:
            create_once(
                lambda: self.repo.requester.requestJsonAndCheck(
                    "POST", f"{self.repo.url}/issues/comments/{comment_id}/reactions", input={"content": content}
                ),
                None,
            )  # the same reaction twice is one reaction, so a plain retry is safe
        except GithubException as exc:
            if exc.status != 404:  # the comment was deleted meanwhile: nothing to react to
                raise

    # ------------------------------------------------------------------ check runs
    def start_check(self, head_sha: str, external_id: str, details_url: str | None, *,
                    existing_id: int | None = None, status: str = "in_progress"):
        """Create the check run (``queued`` on intake, ``in_progress`` when a worker starts), or find the one an
        earlier step or attempt created and move it to ``status``."""
        run = self.repo.get_check_run(existing_id) if existing_id else self.find_check(head_sha, external_id)
        kwargs = {"details_url": details_url} if details_url else {}
        output = {"title": "Auditing…", "summary": "The audit is running."} if status == "in_progress" else \
            {"title": "Queued", "summary": "The audit is waiting for a worker."}
        if run is None:
            return create_once(
                lambda: self.repo.create_check_run(name=self.check_name, head_sha=head_sha, status=status,
                                                   external_id=external_id, output=output, **kwargs),
                lambda: self.find_check(head_sha, external_id))
        if status == "in_progress" and run.status != "in_progress":
            run.edit(status="in_progress", output=output, **kwargs)
        return run

    def find_check(self, head_sha: str, external_id: str):
        return next((c for c in own_runs(self.repo, head_sha, self.check_name, self.app_id)
                     if c.external_id == external_id), None)

    def finish_check(
        self, run, report: Report, *, overflow: str = "", complete: bool = True, conclusion: str | None = None
    ) -> None:
        text = report.check_text
        if overflow:
            text = (overflow + ("\n\n" + text if text else "")).strip()
        title = report.check_title
        if conclusion == "action_required":
            title = f"GPU suites wait for a writer's /audit · {title}"
        output = {"title": cap(title, 1000), "summary": cap(report.check_summary or report.headline)}
        if text:
            output["text"] = cap(text)
        self._annotate(run, report.annotations, output)
        if complete:
            run.edit(status="completed", conclusion=conclusion or CONCLUSIONS[report.verdict], output=output)
        else:
            run.edit(status="in_progress", output=output)

    def _annotate(self, run, annotations: list[Annotation], output: dict) -> None:
        """Send annotations 50 per request, skipping those an earlier attempt already sent."""
        if not annotations:
            return
        posted = run.get_annotations().totalCount
        todo = annotations[posted:]
        for i in range(0, len(todo), ANNOTATION_BATCH):
            batch = [_annotation(a) for a in todo[i : i + ANNOTATION_BATCH]]
            run.edit(output=dict(output, annotations=batch))

    def conclude(self, run, conclusion: str, title: str, summary: str) -> None:
        run.edit(status="completed", conclusion=conclusion, output={"title": cap(title, 1000), "summary": cap(summary)})


def own_runs(repo: Any, head_sha: str, check_name: str, app_id: int | None):
    """This app's check runs named ``check_name`` on a commit, every one of them (``filter="all"``: GitHub's
    default lists only the latest of each name, which hides an older run of ours behind a newer one)."""
    return (c for c in repo.get_commit(head_sha).get_check_runs(check_name=check_name, filter="all")
            if made_by(c, app_id))


def made_by(run: Any, app_id: int | None) -> bool:
    """Was this check run created by our app? Another app with checks:write can create runs with our name and
    external_id; editing them fails (403), and counting them as ours would conclude nothing of ours."""
    if app_id is None:
        return True
    app = getattr(run, "app", None)
    return app is not None and getattr(app, "id", None) == app_id


def _first_line(body: str) -> str:
    return body.split("\n", 1)[0].rstrip("\r")


def _annotation(a: Annotation) -> dict:
    out = {
        "path": a.path,
        "start_line": a.start_line,
        "end_line": max(a.end_line, a.start_line),
        "annotation_level": a.level,
        "message": cap(a.message, 64 * 1024),
    }
    if a.title:
        out["title"] = cap(a.title, 255)
    return out
