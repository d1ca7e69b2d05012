"""A zero-config audit of one commit range, and the inferred findings it made new."""

from __future__ import annotations

from checks.audit import run_checks
from checks.config import default_config
from checks.diff import build_changeset
from checks.model import AuditRequest, Findings
from checks.workspace import checkout


def audit(repo, base: str, head: str) -> Findings:
    co = checkout(AuditRequest(repo=str(repo), base=base, head=head))
    return run_checks(co, default_config(), build_changeset(co))


def inferred(found: Findings) -> list:
    return [f for f in found.with_status("new") if f.source == "inferred"]
