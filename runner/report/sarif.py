"""Findings as SARIF 2.1.0, the format GitHub code scanning ingests (``--format sarif``).

Fixed findings are left out: they describe code that no longer exists at head.
Pre-existing ones carry ``baselineState: unchanged``, changed and improved ones
``updated``, so code scanning can tell them from what the PR introduced; ``partialFingerprints`` carries our own
line-independent fingerprint so alerts track across pushes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from checks.config import CONFIG_PATH
from checks.model import Audit, Finding, Location
from runner.report import Context

SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {"error": "error", "warning": "warning", "note": "note"}
# SARIF baselineState per finding status; "fixed" is absent at head and left out.
_BASELINE = {"new": "new", "changed": "updated", "pre-existing": "unchanged", "improved": "updated",
             "no-baseline": "new"}


def _physical(loc: Location) -> dict[str, Any]:
    region: dict[str, Any] = {"startLine": max(1, loc.line)}
    if loc.end_line and loc.end_line >= region["startLine"]:
        region["endLine"] = loc.end_line
    return {"artifactLocation": {"uri": loc.path, "uriBaseId": "%SRCROOT%"}, "region": region}


def _result(f: Finding, rule_index: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": f.rule,
        "ruleIndex": rule_index,
        "level": _LEVEL.get(f.severity, "warning"),
        "message": {"text": f.message},
        "baselineState": _BASELINE[f.status],
        "partialFingerprints": {"driftAudit/v1": f.fingerprint},
        "properties": {"pillar": f.pillar, "status": f.status, "source": f.source},
    }
    locations = f.locations or [Location(CONFIG_PATH, 1, note="no code location: the rule is declared in the config")]
    if locations:
        first, rest = locations[0], locations[1:]
        result["locations"] = [{"physicalLocation": _physical(first), "message": {"text": first.note or f.rule}}]
        if rest:  # code scanning keeps at most 1000 related locations per result
            result["relatedLocations"] = [
                {"id": i, "physicalLocation": _physical(loc), "message": {"text": loc.note or f.rule}}
                for i, loc in enumerate(rest[:1000], 1)
            ]
    return result


def to_sarif(audit: Audit) -> dict[str, Any]:
    """One run for one audit. Code scanning wants a location on every result, so a finding with
    none (a pinned key that disappeared) points at the config file."""
    shown = [f for f in audit.findings.findings if f.status in _BASELINE]
    rules: dict[str, dict[str, Any]] = {}
    for f in shown:
        if f.rule not in rules:
            rules[f.rule] = {
                "id": f.rule,
                "name": "".join(part.capitalize() for part in f.rule.replace("_", "-").split("-") if part) or f.rule,
                "shortDescription": {"text": f"drift-audit rule {f.rule}"},
                "defaultConfiguration": {"level": _LEVEL.get(f.severity, "warning")},
                "properties": {"pillar": f.pillar},
            }
    index = {rid: i for i, rid in enumerate(rules)}
    notifications = [
        {"level": "warning", "message": {"text": f"{u.entry}: {u.reason}"}, "descriptor": {"id": "unchecked"}}
        for u in audit.findings.unchecked
    ]
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "drift-audit",
                "informationUri": "https://github.com/drift-audit/drift-audit",
                "rules": list(rules.values()),
            }
        },
        "automationDetails": {"id": f"drift-audit/{audit.checkout.head_sha[:12]}"},
        "invocations": [{"executionSuccessful": True, "toolExecutionNotifications": notifications}],
        "results": [_result(f, index[f.rule]) for f in shown],
        "versionControlProvenance": [
            {"repositoryUri": _repo_uri(audit.request.repo), "revisionId": audit.checkout.head_sha}
        ],
        "properties": {"baseSha": audit.checkout.base_sha, "mergeBaseSha": audit.checkout.merge_base_sha},
    }
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}


def _repo_uri(repo: str) -> str:
    if "://" in repo:
        return repo
    if repo.count("/") == 1 and not repo.startswith(("/", ".")):
        return f"https://github.com/{repo}"
    from pathlib import Path

    return Path(repo).resolve().as_uri()


@dataclass(frozen=True)
class _Sarif:
    name: str = "sarif"
    media_type: str = "application/sarif+json"

    def render(self, audit: Audit, ctx: Context) -> str:
        return json.dumps(to_sarif(audit), indent=2)


SARIF = _Sarif()
