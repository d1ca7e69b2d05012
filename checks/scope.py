"""What the report covers: pillars the findings sit in, and ``--pillars`` restriction.

Both edit the pillar map after the checks ran, so they live beside the checks
rather than in whichever front end (CLI, bot) happens to render the report.
"""

from __future__ import annotations

from checks.config import Config
from checks.model import Findings, PillarHit, PillarMap


class ScopeError(ValueError):
    """``--pillars`` / ``/audit pillars=`` named a pillar the config does not define."""


def add_finding_pillars(pillars: PillarMap, findings: Findings, config: Config) -> None:
    """A finding can sit in a pillar the diff did not touch (a table edited in one file drifts from
    its copy in another): give that pillar a row so the finding shows in the summary."""
    present = {p.id for p in pillars.pillars}
    for pid in dict.fromkeys(f.pillar for f in findings.findings if f.status != "fixed"):
        if pid not in present:
            pillar = config.pillar(pid)
            pillars.pillars.append(PillarHit(id=pid, title=pillar.title if pillar else pid))
            present.add(pid)


def check_pillar_ids(pillar_ids: list[str], config: Config) -> None:
    """Refuse unknown ids up front: a typo would otherwise read as "nothing changed"."""
    known = [p.id for p in config.pillars]
    unknown = [pid for pid in pillar_ids if pid not in known]
    if unknown:
        raise ScopeError(
            f"unknown pillar {', '.join(map(repr, unknown))} in {config.source}; known pillars: {', '.join(known)}"
        )


def restrict_pillars(pillars: PillarMap, findings: Findings, pillar_ids: list[str]) -> None:
    """Keep only these pillars, their hunks and their findings (the rules that ran are still listed)."""
    keep = set(pillar_ids)
    pillars.pillars = [p for p in pillars.pillars if p.id in keep]
    pillars.hunks = [h for h in pillars.hunks if keep & set(h.pillars)]
    findings.findings = [f for f in findings.findings if f.pillar in keep]
