"""The details page: parity error against tolerance and decode margins as inline SVG, and no script,
checked in headless Chromium (skipped only where no Chromium is installed)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from checks.model import (
    Audit,
    AuditRequest,
    CaseResult,
    ChangeSet,
    Checkout,
    Finding,
    Findings,
    Location,
    PillarMap,
    Results,
    SuiteResult,
)
from runner.report import render
from runner.report.charts import figures
from runner.report.html import details_page


class _Live(HTMLParser):
    """Collects what could run: script elements, on* handler attributes, javascript: URLs, external loads."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "iframe", "object", "embed", "link"):
            self.found.append(tag)
        for name, value in attrs:
            if name.startswith("on") or (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"{tag} {name}={value}")
            if name in ("src", "href") and tag not in ("a",):
                self.found.append(f"{tag} loads {value}")


def live(page: str) -> list[str]:
    parser = _Live()
    parser.feed(page)
    return parser.found


EVIL = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"


def chart_audit() -> Audit:
    cases = [CaseResult(f"rmsnorm[{i}]", "passed" if v <= 1e-2 else "failed", 0.1, "",
                        {"metric": "max_abs", "value": v, "tol": 1e-2})
             for i, v in enumerate([1e-5, 3e-3, 2.5e-2, 0.0])]
    cases.append(CaseResult(EVIL, "passed", 0.1, "", {"metric": "cos_diff", "value": 1e-7, "tol": 1e-5}))
    decode = SuiteResult("decode", "sm90", "failed", 3.0, reason="prompt 1 breaks at step 5", metrics={
        "near_tie_threshold": 0.05,
        "decode_prompts": [
            {"index": 0, "status": "match", "first_divergence": None, "margins": [2.0, 1.5, 0.9, 3.1, 2.2]},
            {"index": 1, "status": "break", "first_divergence": 5,
             "margins": [1.0, 0.8, 0.6, 0.4, 0.3, 0.02, 0.5, 1.1]},
        ]})
    results = Results("da-1", "b" * 40, [SuiteResult("parity", "sm90", "failed", 2.0, cases=cases), decode])
    return Audit(AuditRequest("/r", "a", "b"), Checkout("/r", "a" * 40, "b" * 40, "a" * 40), "cfg",
                 ChangeSet("a" * 40, "b" * 40, "a" * 40), PillarMap(),
                 Findings([Finding("r", "wiring", "error", EVIL, [Location(EVIL, 1)])]), results=results)


def test_figures_mark_tolerance_and_first_divergence():
    figs = figures(chart_audit())
    parity, prompt0, prompt1 = figs
    assert "error against tolerance" in parity.title and "4 past tolerance" not in parity.caption
    assert "1 past tolerance" in parity.caption  # 2.5e-2 > 1e-2
    svg = str(parity.svg)
    assert svg.count('class="over"') == 1 and svg.count('class="under"') == 4 and 'class="tolerance"' in svg
    assert "&lt;script&gt;" in svg and "<script" not in svg
    assert 'class="divergence"' not in str(prompt0.svg) and "matches the golden" in prompt0.caption
    assert 'class="divergence"' in str(prompt1.svg) and "first divergence: step 5" in str(prompt1.svg)
    assert 'class="near-tie"' in str(prompt1.svg)


def test_page_has_no_script_anywhere():
    page = render(chart_audit(), "html")
    assert "<svg" in page and page.count("<figure>") == 3
    assert live(page) == []
    assert live(EVIL) != []  # the check sees what it looks for
    assert "default-src 'none'" in page  # even an injected script would not run


def test_bot_page_for_a_missing_audit():
    page = details_page(None, missing="da-123")
    assert "No audit da-123" in page and "<script" not in page


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")), reason="no Chromium here")
def test_renders_in_headless_chromium_and_runs_no_script(tmp_path: Path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    page = tmp_path / "details.html"
    page.write_text(render(chart_audit(), "html"), encoding="utf-8")
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={tmp_path}/p"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "<svg" in dom and 'class="divergence"' in dom and 'class="tolerance"' in dom
    assert "pwned" not in dom.split("<title>")[1].split("</title>")[0]  # the payload never ran
    assert live(dom) == []
    shot = tmp_path / "page.png"
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000  # drawn, not blank


def test_decode_suite_results_carry_the_margins_the_page_draws(tmp_path: Path):
    from engine.golden import GoldenRecord, write_golden
    from runner.golden import compare_files

    ref = write_golden(tmp_path / "golden.jsonl", [
        GoldenRecord(0, [5, 6], [1, 2, 3, 4], [2.0, 1.0, 0.5, 0.7]),
        GoldenRecord(1, [7], [9, 9, 9], [0.9, 0.01, 0.4]),
    ])
    out = write_golden(tmp_path / "out.jsonl", [GoldenRecord(0, [5, 6], [1, 2, 8, 4]), GoldenRecord(1, [7], [9, 9, 9])])
    outcome, _, metrics = compare_files(str(ref), str(out), "golden.jsonl")
    assert outcome == "failed"
    traces = metrics["decode_prompts"]
    assert traces[0] == {"index": 0, "status": "break", "first_divergence": 2, "margins": [2.0, 1.0, 0.5, 0.7]}
    assert traces[1]["first_divergence"] is None and traces[1]["margins"] == [0.9, 0.01, 0.4]
    audit = chart_audit()
    assert audit.results is not None
    audit.results.suites = [SuiteResult("decode", "sm90", outcome, metrics=metrics)]
    svg = str(figures(audit)[0].svg)
    assert "first divergence: step 2" in svg
