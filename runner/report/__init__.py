"""Audit → what people read: one ``Reporter`` protocol, one module per format.

``report(audit, ctx)`` builds the ``Report`` the bot publishes (PR comment,
check-run summary/text, annotations); ``render(audit, fmt, ctx)`` gives any
single format as text (``drift-audit review --format``). Every reporter takes
the same ``Context``, so the CLI, the Action and the bot render the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from checks.model import Audit, Report


@dataclass(frozen=True)
class Context:
    """What a reporter needs beyond the audit: where things live on GitHub, if anywhere."""

    blob_url: str | None = None  # https://github.com/o/r/blob/<head sha>: file:line links
    details_url: str | None = None  # the check run's details page
    json_hint: str = "the full JSON (`drift-audit review --format json`)"


class Reporter(Protocol):
    """One output format of an audit."""

    @property
    def name(self) -> str: ...  # the --format value

    @property
    def media_type(self) -> str: ...

    def render(self, audit: Audit, ctx: Context) -> str: ...


def reporters() -> dict[str, Reporter]:
    """Every format by its ``--format`` name. Imported lazily: the HTML and JUnit ones are rarely needed."""
    from runner.report import html, jsonfmt, junit, markdown, sarif

    found: list[Reporter] = [markdown.MARKDOWN, markdown.CHECK_RUN, jsonfmt.JSON, sarif.SARIF, junit.JUNIT, html.HTML]
    return {r.name: r for r in found}


FORMATS = ("markdown", "json", "sarif", "junit", "html", "check-run")


def render(audit: Audit, fmt: str, ctx: Context | None = None) -> str:
    known = reporters()
    if fmt not in known:
        raise ValueError(f"unknown format '{fmt}'; formats: {', '.join(known)}")
    start = time.perf_counter()
    out = known[fmt].render(audit, ctx or Context())
    audit.timings["report"] = round(time.perf_counter() - start, 4)
    return out


def report(audit: Audit, ctx: Context | None = None) -> Report:
    """The comment, the check-run output and its annotations, as the bot publishes them."""
    from runner.report.markdown import build_report

    start = time.perf_counter()
    out = build_report(audit, ctx or Context())
    audit.timings["report"] = round(time.perf_counter() - start, 4)
    return out
