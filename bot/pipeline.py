"""Deprecated home of the pipeline: ``runner.pipeline`` (plan/run) and ``runner.report`` (render).

Kept only until the worker imports those; nothing new may use it.
"""

from __future__ import annotations

from checks.model import Audit, AuditRequest
from runner import pipeline
from runner.pipeline import audit_id_for
from runner.report import Context, report

__all__ = ["audit_id_for", "run_audit"]


def run_audit(request: AuditRequest, *, progress=None, render: bool = True, blob_url: str | None = None,
              details_url: str | None = None, dispatch=None) -> Audit:
    audit = pipeline.review(request, backend=dispatch, progress=progress)
    if render:
        audit.report = report(audit, Context(blob_url=blob_url, details_url=details_url))
    return audit
