"""The comment's test section: per-runner tables, metrics, folded failures, the not-run list, escaping."""

from __future__ import annotations

import re

import pytest

from checks.model import (
    Audit,
    AuditRequest,
    CaseResult,
    ChangeSet,
    Checkout,
    DeviceFingerprint,
    PillarMap,
    PlannedSuite,
    Results,
    SuiteResult,
)
from checks.model import (
    TestPlan as Plan,
)
from runner.report import Context
from runner.report import report as render
from runner.report.markdown import _LEVELS, render_at

LIMITS = {"files": 1000, "symbols": 1000, "findings": 1000, "cases": 2, "places": 20, "evidence": 10}


def audit_with(plan, results):
    co = Checkout(repo="/r", base_sha="a" * 40, head_sha="b" * 40, merge_base_sha="a" * 40)
    return Audit(request=AuditRequest(repo="/r", base="a", head="b"), checkout=co, config_source="test",
                 changes=ChangeSet("a" * 40, "b" * 40, "a" * 40), pillars=PillarMap(), plan=plan, results=results)


@pytest.fixture
def audit():
    plan = Plan(
        audit_id="da-1", head_sha="b" * 40,
        suites=[
            PlannedSuite("parity-rmsnorm", "parity", "pytest tests/kernels", "sm90", reasons=["pillar 'wiring' touched"]),
            PlannedSuite("decode", "decode", "python -m engine.decode", "sm90", reasons=["path 'engine/**' matched engine/model.py"]),
            PlannedSuite("pytest:tests/x/test_<b>.py", "unit", "pytest", "cpu", reasons=["imports: a → b"]),
            PlannedSuite("parity-mxfp4", "parity", "pytest", "sm120", requires="cc >= 12.0", reasons=["pillar 'wiring' touched"]),
        ],
        not_affected=["engine-unit"],
    )
    results = Results(
        audit_id="da-1", head_sha="b" * 40,
        suites=[
            SuiteResult("parity-rmsnorm", "sm90", "passed", 12.5, metrics={"max_abs": 0.0039062, "cos_diff": 2.1e-7}),
            SuiteResult("decode", "sm90", "failed", 40.0, reason="diverges from 'g.jsonl' at step 17",
                        output_tail="Traceback\n```` fence\n<script>alert(1)</script>",
                        cases=[CaseResult(f"prompt[{i}]", "failed", 1.0, "token 17 != 9", {"first_divergence": 17})
                               for i in range(3)],
                        metrics={"first_divergence": 17, "near_tie_margin": 0.0312}),
            SuiteResult("pytest:tests/x/test_<b>.py", "cpu", "skipped", reason="needs sm90"),
        ],
        devices=[DeviceFingerprint(label="sm90", gpu="NVIDIA H200", compute_capability="9.0", driver="570.1",
                                   cuda="12.8", torch="2.11.0", triton="3.6.0")],
    )
    return audit_with(plan, results)


def section(audit, limits=LIMITS):
    """The comment's Tests and Not run sections (everything from "#### Tests" to the footer)."""
    _LEVELS.append(limits)
    try:
        text = render_at(audit, Context(), len(_LEVELS) - 1)
    finally:
        _LEVELS.pop()
    if "#### Tests" not in text:
        return ""
    return "#### Tests" + text.split("#### Tests", 1)[1].rsplit("\n---\n", 1)[0]


def test_results_table_per_runner_with_metrics(audit):
    text = section(audit)
    assert "**sm90** · NVIDIA H200 (cc 9.0), driver 570.1, CUDA 12.8, torch 2.11.0, triton 3.6.0" in text
    assert "| `parity-rmsnorm` | ✅ passed | 12.5 s | max_abs 0.00391 · cos_diff 2.1e-07 | — |" in text
    assert ("| `decode` | ❌ failed: diverges from 'g.jsonl' at step 17 | 40.0 s | near_tie_margin 0.0312 | "
            "step 17 (near-tie margin 0.0312) |") in text
    assert "<details><summary>❌ decode on sm90: failed, diverges from 'g.jsonl' at step 17</summary>" in text
    assert "- `prompt[0]`: failed, token 17 \\!= 9 · first_divergence 17" in text
    assert "triton 3.6.0\n\n| Suite |" in text
    assert "- … 1 more" in text and "prompt[2]" not in text


def test_user_text_is_escaped(audit):
    text = section(audit)
    # The tail holds a run of 4 backticks, so its fence is a run of 5 that the tail cannot close.
    tail = text.split("`````text\n")[1].split("\n`````\n")[0]
    assert "<script>" in tail and "```` fence" in tail
    assert text.count("`````text") == 1
    # File names from the PR reach the comment only inside code spans, which GitHub renders literally.
    outside = text.split("`````text")[0] + text.split("\n`````\n")[-1]
    outside_code = re.sub(r"``.*?``|`[^`]*`", "", outside)
    assert "test_" in text and "<b>" not in outside_code


def test_not_run_list_says_how(audit):
    text = section(audit)
    assert ("- `pytest:tests/x/test_<b>.py` on cpu: needs sm90. Run it: `/audit run pytest:tests/x/test_<b>.py` · "
            "`drift-audit review --run --suite pytest:tests/x/test_<b>.py`") in text
    assert ("- `parity-mxfp4` on sm120: selected, no result came back. Run it: `/audit run parity-mxfp4 on sm120` · "
            "`drift-audit review --run --suite parity-mxfp4`") in text
    assert "<details><summary>1 suite not affected by this change</summary>" in text
    assert "- `engine-unit`: `/audit run engine-unit` · `drift-audit review --run --suite engine-unit`" in text
    assert "- `decode` on sm90: path 'engine/\\*\\*' matched engine/model.py" in text


def test_plan_without_results_and_empty_plan(audit):
    audit.results = None
    text = section(audit)
    assert "| Suite |" not in text
    assert "4 suite runs selected, not run in this audit" in text
    assert "Run the selected suites with `drift-audit review --run`, or one with `/audit run <suite>`" in text
    assert "selected, no result came back" not in text
    assert "- `engine-unit`: `/audit run engine-unit`" in text
    audit.plan = Plan("da-1", "b" * 40)
    assert "No test suites are declared" in section(audit)
    audit.plan = None
    assert section(audit).strip() == ""


def test_not_runnable_is_listed_with_its_reason_never_failed(audit):
    audit.results.suites.append(SuiteResult("ext-unit", "cpu", "not-runnable",
                                            reason="cannot import name '_C': the extension is not built"))
    text = section(audit)
    assert ("- `ext-unit` on cpu: not runnable here: cannot import name '\\_C': the extension is not built. "
            "Run it: `/audit run ext-unit`") in text
    assert "| `ext-unit` |" not in text  # not in the table of suites that ran
    assert "1 not runnable here" in text
    audit.results.suites = [s for s in audit.results.suites if s.outcome != "failed"]
    assert render(audit).verdict == "pass"


def test_included_in_the_comment(audit):
    report = render(audit)
    assert "#### Tests" in report.markdown and "parity-rmsnorm" in report.markdown
    assert report.verdict == "fail"


def test_long_lists_are_capped_by_the_comment_limits(audit):
    audit.plan.suites += [PlannedSuite(f"pytest:tests/t{i}.py", "unit", "pytest", "cpu", reasons=["a", "b", "c"])
                          for i in range(30)]
    audit.plan.not_affected += [f"suite-{i}" for i in range(30)]
    limits = {"files": 3, "symbols": 1, "findings": 3, "cases": 1, "places": 1, "evidence": 1}
    text = section(audit, limits)
    assert "- … 31 more\n" in text  # 34 planned, 3 shown
    assert "- … 28 more\n" in text  # 31 not affected, 3 shown
    assert "- … 28 more not run" in text  # 31 with no result, 3 shown
    assert "`pytest:tests/t29.py`" not in text
    audit.plan.suites[0].reasons = ["a", "b", "c"]
    text = section(audit, limits)
    assert "- `parity-rmsnorm` on sm90: a; … 2 more" in text
    full = section(audit)
    assert "`pytest:tests/t29.py`" in full and "`suite-29`" in full
