"""Who may send work to self-hosted GPU runners.

Self-hosted runners execute the PR's code, so code from a fork or a first-time
contributor only reaches them after someone with write access says ``/audit``
on that head. Permissions come from the collaborator-permission API, never
from the payload's ``author_association`` alone.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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
        return self.push or self.permission in ("admin", "write") or self.role_name in WRITER_PERMISSIONS


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


def gpu_gate(repo: Any, *, trigger: str, untrusted: bool, actor: str | None) -> Gate:
    """May this request's suites go to self-hosted runners?"""
    if trigger == "merge_group":
        return Gate(True, "")  # only code a writer queued reaches the merge queue
    if trigger in ("comment", "check_run"):
        if is_writer(repo, actor):
            return Gate(True, "")
        return Gate(False, f"GPU suites need a /audit from someone with write access (@{actor} has none)")
    if untrusted:
        return Gate(False, "fork or first-time contributor: GPU suites wait for a writer's /audit")
    return Gate(True, "")
