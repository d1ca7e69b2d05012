"""``--format json``: every stage object, the rendered report included; it loads back into
checks.model's dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from checks.model import Audit, to_json
from runner.report import Context


@dataclass(frozen=True)
class _Json:
    name: str = "json"
    media_type: str = "application/json"

    def render(self, audit: Audit, ctx: Context) -> str:
        if audit.report is None:
            from runner.report import report

            audit.report = report(audit, ctx)
        return to_json(audit)


JSON = _Json()
