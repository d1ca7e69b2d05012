"""Deprecated home of the renderer: ``runner.report``. Kept only until the worker imports it."""

from __future__ import annotations

from checks.model import Audit, Report
from runner.report import Context, report
from runner.report.markdown import COMMENT_LIMIT, COMMENT_MARKER, environment, verdict_of
from runner.report.safe import code
from runner.report.safe import text as md

__all__ = ["COMMENT_LIMIT", "COMMENT_MARKER", "code", "environment", "md", "render", "verdict_of"]


def render(audit: Audit, *, blob_url: str | None = None, details_url: str | None = None) -> Report:
    return report(audit, Context(blob_url=blob_url, details_url=details_url))
