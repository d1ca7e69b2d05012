"""The check run's details page (``--format html``): everything, for a browser, with no script.

Autoescaped HTML; pictures (parity error against tolerance, decode top-2
margins) are inline SVG built in ``runner.report.charts``. The bot's details
route calls ``details_page`` with its job record; the CLI renders the audit alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jinja2

from checks.model import Audit
from runner.report import Context


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("runner.report", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.ChainableUndefined,
    )


def details_page(audit: Audit | None, *, record: Any = None, job: Any = None, missing: str | None = None) -> str:
    """The page for one audit. ``record`` (the bot's AuditRecord: repo, pr, verdict, status, pending)
    and ``job`` (its JobRow) are optional; ``missing`` names an audit id that has no record yet."""
    from runner.report import charts
    from runner.report.markdown import verdict_of

    figures = charts.figures(audit) if audit is not None else []
    verdict, headline = verdict_of(audit) if audit is not None else ("neutral", "")
    tests = test_rows(audit) if audit is not None else []
    return environment().get_template("details.html.j2").render(
        audit=audit, record=record, job=job, missing=missing, figures=figures, verdict=verdict, headline=headline,
        tests=tests,
    )


@dataclass(frozen=True)
class TestRow:
    """One suite run on the page: what was selected and why, beside what came back (if anything)."""

    suite: str
    runner: str
    outcome: str  # a result's outcome, or "selected, not run" / "selected, no result came back"
    duration: float | None
    reason: str  # the result's reason (why it failed, why not runnable)
    why: str  # why the plan selected it; empty for a result nothing planned (run by id in the bot)


def test_rows(audit: Audit) -> list[TestRow]:
    """Planned suites in plan order with their results, then results the plan did not list: the page
    shows the selection even when nothing ran, as the comment does."""
    results = {(r.suite, r.runner): r for r in (audit.results.suites if audit.results else [])}
    rows = []
    for s in audit.plan.suites if audit.plan else []:
        r = results.pop((s.id, s.runner), None)
        if r is None:
            outcome = "selected, no result came back" if audit.results else "selected, not run"
            rows.append(TestRow(s.id, s.runner, outcome, None, "", "; ".join(s.reasons)))
        else:
            rows.append(TestRow(s.id, s.runner, _outcome(r.outcome), r.duration, r.reason, "; ".join(s.reasons)))
    rows += [TestRow(r.suite, r.runner, _outcome(r.outcome), r.duration, r.reason, "") for r in results.values()]
    left = f"selected, left out by --runner {audit.request.options.runner}"
    rows += [TestRow(s.id, s.runner, left, None, "", "; ".join(s.reasons))
             for s in (audit.plan.filtered if audit.plan else [])]
    return rows


def _outcome(outcome: str) -> str:
    return "not runnable here" if outcome == "not-runnable" else outcome


@dataclass(frozen=True)
class _Html:
    name: str = "html"
    media_type: str = "text/html"

    def render(self, audit: Audit, ctx: Context) -> str:
        return details_page(audit)


HTML = _Html()
