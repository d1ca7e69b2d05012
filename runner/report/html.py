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
    return environment().get_template("details.html.j2").render(
        audit=audit, record=record, job=job, missing=missing, figures=figures, verdict=verdict, headline=headline
    )


@dataclass(frozen=True)
class _Html:
    name: str = "html"
    media_type: str = "text/html"

    def render(self, audit: Audit, ctx: Context) -> str:
        return details_page(audit)


HTML = _Html()
