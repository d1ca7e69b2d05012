"""Who may send work to self-hosted GPU runners.

Self-hosted runners execute the PR's code, so code from a fork or a first-time
contributor only reaches them after someone with write access says ``/audit``
on that head. Permissions come from the collaborator-permission API, never
from the payload's ``author_association`` alone.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from github import GithubException

WRITER_PERMISSIONS = ("admin", "maintain", "write")


@dataclass
class Gate:
    allowed: bool
    reason: str  # shown next to suites that were not run


def signature_of(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """X-Hub-Signature-256: HMAC-SHA256 of the raw body, compared in constant time."""
    if not secret or not header:
        return False
    return hmac.compare_digest(signature_of(secret, body).encode(), header.strip().encode())


def signature_matches(secret: str, blocks: Iterable[bytes], header: str | None) -> bool:
    """``verify_signature`` over a body read block by block, so a forged one is never held in memory whole."""
    if not secret or not header:
        return False
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    for block in blocks:
        mac.update(block)
    return hmac.compare_digest(("sha256=" + mac.hexdigest()).encode(), header.strip().encode())


class Redactor:
    """Removes every secret the service holds from text bound for a log line, a check run, a comment, the
    details page or the job table: the webhook secret, the results key, the App's private key (whole and line
    by line), and each installation token minted so far (raw, and in the Basic form git sends). Error text
    comes from libraries, git and GitHub, which may echo a header or a URL; this is the last filter before it
    leaves the process."""

    MIN_LENGTH = 6  # shorter "secrets" are not secret, and replacing them would garble every message

    def __init__(self, settings: Any, tokens: Callable[[], Iterable[str]] = lambda: ()):
        self.settings, self.tokens = settings, tokens

    def secrets(self) -> list[str]:
        s = self.settings
        found = [s.webhook_secret, s.results_key, s.private_key.strip()]
        found += [line.strip() for line in s.private_key.splitlines() if "-----" not in line]
        found += [urlsplit(url).password or "" for url in (s.github_url, s.public_url)]
        for token in self.tokens():
            found += [token, base64.b64encode(f"x-access-token:{token}".encode()).decode()]
        return sorted({v for v in found if v and len(v) >= self.MIN_LENGTH}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets():
            if secret in text:
                text = text.replace(secret, "***")
        return text


class RedactingFilter(logging.Filter):
    """A logging filter that passes every record through a ``Redactor``, its traceback included."""

    def __init__(self, redact: Redactor):
        super().__init__()
        self.redact = redact
        self._format = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.redact(record.getMessage()), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = self._format.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        record.exc_info = None if record.exc_text else record.exc_info
        return True


def page_key(secret: str, page: str) -> str:
    """The capability in a details-page link: audit pages of private repos are not for anyone who guesses ids."""
    return hmac.new(secret.encode(), f"audit-page:{page}".encode(), hashlib.sha256).hexdigest()[:32]


def details_url(public_url: str, secret: str, job_id: int) -> str:
    page = f"job-{job_id}"
    return f"{public_url.rstrip('/')}/audits/{page}?key={page_key(secret, page)}"


@dataclass
class Permission:
    """GET .../collaborators/{login}/permission. ``role_name`` is the role's own name, a custom repository
    role's included; ``permission`` is the legacy base level (admin | write | read | none), which is what a
    custom role inherits; ``push`` is ``user.permissions.push``."""

    role_name: str = "none"
    permission: str = "none"
    push: bool = False

    @property
    def writes(self) -> bool:
        """By what the role grants, never by its name: a custom role may be called anything."""
        return self.push or self.permission in ("admin", "write")


def permission_of(repo: Any, login: str | None) -> Permission:
    if not login:
        return Permission()
    try:
        _, data = repo.requester.requestJsonAndCheck("GET", f"{repo.url}/collaborators/{login}/permission")
    except GithubException as exc:
        if exc.status == 404:
            return Permission()
        raise
    body: dict[str, Any] = data if isinstance(data, dict) else {}
    user = body.get("user") if isinstance(body.get("user"), dict) else {}
    perms = user.get("permissions") if isinstance(user, dict) and isinstance(user.get("permissions"), dict) else {}
    data = body
    return Permission(
        role_name=str(data.get("role_name") or "none"),
        permission=str(data.get("permission") or "none"),
        push=bool(isinstance(perms, dict) and (perms.get("push") or perms.get("maintain") or perms.get("admin"))),
    )


def is_writer(repo: Any, login: str | None) -> bool:
    return permission_of(repo, login).writes


def gpu_gate(repo: Any, *, trigger: str, untrusted: bool, actor: str | None, writer: bool | None = None) -> Gate:
    """May this request's suites go to self-hosted runners? ``writer``: the actor's write access when the
    caller has asked already (else it is asked here)."""
    if trigger == "merge_group":
        return Gate(True, "")  # only code a writer queued reaches the merge queue
    if trigger in ("comment", "check_run"):
        if writer if writer is not None else is_writer(repo, actor):
            return Gate(True, "")
        return Gate(False, f"GPU suites need a /audit from someone with write access (@{actor} has none)")
    if untrusted:
        return Gate(False, "fork or first-time contributor: GPU suites wait for a writer's /audit")
    return Gate(True, "")
