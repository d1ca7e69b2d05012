"""Every format from one Reporter protocol: the registry, SARIF for every finding state, the check run."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from checks.model import Audit, AuditRequest, ChangeSet, Checkout, Finding, Findings, Location, PillarMap
from runner.report import FORMATS, Context, render, reporters

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "checks/sarif-schema-2.1.0.json").read_text())


def audit_with(*statuses: str) -> Audit:
    findings = [Finding(f"rule-{s}", "wiring", "error", f"{s} finding", [Location("src/a.cc", i + 1)],
                        status=s, fingerprint=f"{i:020d}")  # type: ignore[arg-type]
                for i, s in enumerate(statuses)]
    return Audit(AuditRequest("/r", "a", "b"), Checkout("/r", "a" * 40, "b" * 40, "a" * 40), "cfg",
                 ChangeSet("a" * 40, "b" * 40, "a" * 40), PillarMap(), Findings(findings, rules_run=["x"]))


def test_every_format_has_a_reporter():
    from bot.review_cli import FORMATS as CLI_FORMATS  # kept literal there so `--help` imports nothing heavy

    known = reporters()
    assert set(known) == set(FORMATS) == set(CLI_FORMATS)
    for name, rep in known.items():
        assert rep.name == name and "/" in rep.media_type
        assert render(audit_with("new"), name, Context())  # each renders something
    with pytest.raises(ValueError, match="unknown format 'xml'; formats: "):
        render(audit_with("new"), "xml")


def test_sarif_baseline_state_for_every_finding_state():
    statuses = ("new", "changed", "pre-existing", "improved", "no-baseline", "fixed")
    sarif = json.loads(render(audit_with(*statuses), "sarif"))
    jsonschema.Draft4Validator(SCHEMA).validate(sarif)
    states = {r["ruleId"]: r["baselineState"] for r in sarif["runs"][0]["results"]}
    assert states == {"rule-new": "new", "rule-changed": "updated", "rule-pre-existing": "unchanged",
                      "rule-improved": "updated", "rule-no-baseline": "new"}  # fixed is not at head


def test_check_run_output_annotates_new_and_changed_findings():
    out = json.loads(render(audit_with("new", "changed", "pre-existing"), "check-run"))
    assert out["conclusion"] == "failure"
    assert out["output"]["title"] == "Drift Audit: 2 failing findings"
    assert [a["start_line"] for a in out["output"]["annotations"]] == [1, 2]
    assert {a["level"] for a in out["output"]["annotations"]} == {"failure"}
