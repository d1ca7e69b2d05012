"""The comment as a reviewer meets it: findings first, honest states, notes said once, caps on every list."""

from __future__ import annotations

import re

from bot.demo import build_demo_repo
from checks.model import AuditRequest, Finding, Location, Results, SuiteResult
from runner import pipeline
from runner.report import Context, render, report

BAD_QUERY_CONFIG = """
[[fact]]
id = "a"
lang = "python"
files = ["*.py"]
query = "(oops @key"

[[fact]]
id = "b"
lang = "regex"
files = ["*.py"]
regex = '(?P<key>\\w+) = 1'

[[rule]]
id = "r1"
kind = "same-set"
facts = ["a", "b"]

[[rule]]
id = "r2"
kind = "same-set"
facts = ["b", "a"]
"""


def demo_audit(tmp_path):
    base, head = build_demo_repo(tmp_path / "demo")
    audit = pipeline.plan(AuditRequest(repo=str(tmp_path / "demo"), base=base, head=head))
    assert audit.plan is not None
    suites = [SuiteResult(audit.plan.suites[0].id, audit.plan.suites[0].runner, "passed", 1.5),
              SuiteResult("ext", "cpu", "not-runnable", reason="cannot import name '_C' (extension not built)")]
    audit.results = Results(audit.plan.audit_id, audit.plan.head_sha, suites)
    audit.findings.findings.append(Finding("shrinking-gap", "wiring", "error", "2 of 3 places fixed",
                                           [Location("src/graph.cc", 3)], status="improved"))
    return audit


def test_sections_come_in_reading_order(tmp_path):
    text = report(demo_audit(tmp_path)).markdown
    marks = ["### ❌ Drift Audit", "#### Findings", "**1 new finding", "#### Tests", "#### Pillars",
             "pre-existing finding", "1 improved by this PR", "#### Not run", "\n---\n<sub>base"]
    at = [text.index(m) for m in marks]
    assert at == sorted(at), list(zip(marks, at, strict=True))
    assert "`ext` on cpu: not runnable here: cannot import name '\\_C' \\(extension not built\\)" in text
    assert "❌ 1 failed" not in text and "1 not runnable here" in text


def test_findings_link_to_the_head_blob(tmp_path):
    audit = demo_audit(tmp_path)
    blob = f"https://github.com/o/r/blob/{audit.checkout.head_sha}"
    text = report(audit, Context(blob_url=blob)).markdown
    new_part = text.split("#### Tests")[0]
    assert re.search(rf"\[src/graph\.cc:\d+\]\({re.escape(blob)}/src/graph\.cc#L\d+\)", new_part)


def test_no_rules_is_said_never_a_check_mark(repo):
    repo.write("a.py", "x = 1\n")
    base = repo.commit("base")
    repo.write("a.py", "x = 2\n")
    repo.commit("head")
    audit = pipeline.plan(AuditRequest(repo=str(repo.root), base=base, head="HEAD"))
    audit.findings.inference = ""  # inference off: init is the way to rules
    rep = report(audit)
    headline = rep.markdown.splitlines()[1]
    assert headline.startswith("### ⚠️ Drift Audit:") and "no drift rules configured" in headline
    assert "✅" not in rep.markdown
    assert "No drift rules configured" in rep.markdown and "`drift-audit init`" in rep.markdown
    assert rep.verdict == "pass"  # a warning, not a failure

    audit.findings.inference = base  # inference ran and found nothing kept in step: init would propose nothing
    rep = report(audit)
    assert "no drift rules configured or inferred" in rep.markdown.splitlines()[1] and "✅" not in rep.markdown
    assert f"none inferred from the base (`{base[:12]}`)" in rep.markdown and "`drift-audit init`" not in rep.markdown


def test_inferred_invariants_a_pr_left_nothing_to_check_are_not_no_rules(tmp_path):
    audit = demo_audit(tmp_path)
    audit.findings.findings, audit.findings.rules_run, audit.findings.unchecked = [], [], []
    audit.findings.inferred = ["same-set: enum GemmType (not checked: this PR deletes common/types.hpp, "
                               "which held one of its lists)"]
    text = report(audit).markdown
    assert "no inferred rule could be checked" in text.splitlines()[1] and "no drift rules configured" not in text
    assert "No drift rules configured" not in text and "not checked: this PR deletes" in text


def test_a_query_that_does_not_compile_warns_in_the_headline_once(repo):
    repo.write(".github/drift-audit.toml", BAD_QUERY_CONFIG)
    repo.write("m.py", "x = 1\n")
    base = repo.commit("base")
    repo.write("m.py", "x = 1\ny = 1\n")
    repo.commit("head")
    text = report(pipeline.plan(AuditRequest(repo=str(repo.root), base=base, head="HEAD"))).markdown
    top = text.split("#### Findings")[0]
    assert "> ⚠️ The config could not be fully checked: fact 'a'" in top and "query does not compile" in top
    assert "(and 2 more, folded below)" in top and "drift rules could not run" in top
    assert "✅" not in text
    notes = text.split("Could not check 3 config entries</summary>")[1].split("</details>")[0]
    assert notes.count("query does not compile") == 1
    assert "fact 'a' \\(see its entry\\)" in notes
    assert not re.search(r"fact 'a'[^\n]*fact 'a'", text)  # never "fact 'a' … fact 'a' …" on one line


def test_evidence_of_inferred_findings_is_folded(tmp_path):
    audit = demo_audit(tmp_path)
    audit.findings.findings.insert(0, Finding(
        "inferred-same-set", "wiring", "error", "'TASK_X' missing from the name map",
        [Location("src/runtime.cc", 4)], status="new", source="inferred",
        evidence=["held on the base for 12 of 12 keys", "e.g. TASK_ATTENTION in both"]))
    text = report(audit).markdown
    item = text.split("**inferred-same-set**")[1].split("\n- ")[0]
    assert "<details><summary>Evidence (inferred from the base)</summary>" in item
    assert "held on the base for 12 of 12 keys" in item.split("<summary>")[1]


def test_every_list_is_capped_and_no_line_is_longer_than_a_screen(repo):
    repo.write("seed.py", "x = 0\n")
    base = repo.commit("base")
    body = "\n".join(f"def handler_{j}_{'y' * 40}():\n    return {j}\n" for j in range(60))
    for i in range(60):
        repo.write(f"engine/layers/{'x' * 50}_{i}.py", body)
    repo.commit("head")
    text = report(pipeline.plan(AuditRequest(repo=str(repo.root), base=base, head="HEAD"))).markdown
    assert max(len(line) for line in text.splitlines()) <= 600
    assert "… 35 more files" in text  # 25 of 60 listed
    assert re.search(r"`handler_\d+_y+` \+5\d more", text)  # a few symbols per line, the rest counted


def test_inferred_invariants_are_listed_folded(tmp_path):
    audit = demo_audit(tmp_path)
    audit.findings.inferred = ["same-set: enum TaskType ⊆ task_type_to_name keys (support 5/5)", "@bot #3 [x](y)"]
    text = report(audit).markdown
    block = text.split("<details><summary>Inferred from the base: 2 invariants</summary>")[1]
    block = block.split("</details>")[0]
    assert "- same\\-set" not in block and "- same-set: enum TaskType" in block
    assert "@\u200bbot \\#\u200b3 \\[x\\]\\(y\\)" in block
    assert text.index("Inferred from the base") > text.index("#### Pillars")


def test_suite_reasons_stay_on_one_screen_line(tmp_path):
    audit = demo_audit(tmp_path)
    assert audit.plan is not None
    audit.plan.suites[0].reasons = [f"imports: tests/unit/test_{i}.py → {'pkg/' * 20}mod_{i}.py" for i in range(40)]
    text = report(audit).markdown
    line = next(ln for ln in text.splitlines() if ln.startswith(f"- `{audit.plan.suites[0].id}` on "))
    assert len(line) <= 600 and re.search(r"; … \d+ more$", line)


def test_pillar_lines_count_only_what_the_pr_did(tmp_path):
    """The demo's base already drifts in the weights pillar; that finding is the base's, not the PR's."""
    text = report(demo_audit(tmp_path)).markdown
    pillar_lines = {m.group(1): m.group(0) for m in re.finditer(r"^- \*\*.*\(`(\w+)`\): .*$", text, re.M)}
    assert "0 new findings (1 pre-existing)" in pillar_lines["weights"], pillar_lines["weights"]
    assert "**" not in pillar_lines["weights"].split("):", 1)[1]  # nothing bold: the PR touched nothing there
    assert "**1 new finding** · " in pillar_lines["wiring"], pillar_lines["wiring"]  # the new one, not the improved
    assert "pre-existing" not in pillar_lines["wiring"]


INERT_BASE = {
    "pkg/__init__.py": "",
    "pkg/norm.py": "def rms(x):\n    return x\n\n\ndef unused_helper(x):\n    return x * 2\n",
    "tests/test_rms.py": "from pkg.norm import rms\n\n\ndef test_rms():\n    assert rms(1.0)\n",
}


def test_inert_changes_are_shown_folded(tmp_path):
    """A change no code can observe selects nothing; the comment and the details page say which and why."""
    from tests.gitrepo import GitRepo

    repo = GitRepo(tmp_path / "repo")
    base = repo.commit_files(INERT_BASE, "base")
    head = repo.commit_files({"pkg/norm.py": "def rms(x):\n    return x\n"}, "drop the helper")
    audit = pipeline.plan(AuditRequest(repo=str(repo.root), base=base, head=head))
    assert audit.plan is not None and audit.plan.inert == [
        "pkg/norm.py: only adds or removes unused_helper, which nothing uses"]
    text = report(audit).markdown
    folded = re.search(r"<details><summary>1 changed file no code can observe \(selected no suite\)</summary>\n\n"
                       r"- (.*)\n\n</details>", text)
    assert folded and folded.group(1) == "pkg/norm.py: only adds or removes unused\\_helper, which nothing uses"
    assert text.index("#### Tests") < folded.start() < text.index("#### Pillars")
    page = render(audit, "html")
    assert "1 changed file no code can observe" in page and "<li>pkg/norm.py: only adds or removes" in page


def _cells(page: str) -> list[list[str]]:
    from html.parser import HTMLParser

    rows: list[list[str]] = []

    class Rows(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                rows.append([])
            elif tag == "td" and rows:
                rows[-1].append("")

        def handle_data(self, data):
            if rows and rows[-1]:
                rows[-1][-1] += data

    Rows().feed(page)
    return [r for r in rows if r]


def test_details_page_and_check_summary_list_the_selected_suites(tmp_path):
    """The page and the check run say what was selected and why, ran or not, as the comment does."""
    import json

    audit = demo_audit(tmp_path)
    audit.findings.inferred = ["same-set over TASK_* enums and the name map (support 5)"]
    page = render(audit, "html")
    tests = page[page.index("<h2>Tests</h2>"):page.index("<h2>Pillars</h2>")]
    rows = {(r[0], r[1]): r for r in _cells(tests)}
    assert rows[("wrapper-unit", "cpu")][2] == "passed"
    assert "imports: tests/unit/test_wrapper.py" in rows[("wrapper-unit", "cpu")][5]
    assert rows[("attention-parity", "sm90")][2:4] == ["selected, no result came back", "—"]
    assert "pillar 'wiring' touched" in rows[("attention-parity", "sm90")][5]
    assert rows[("ext", "cpu")][2:5] == ["not runnable here", "0.0 s",
                                         "cannot import name '_C' (extension not built)"]
    assert "Inferred from the base: 1 invariant</summary>" in page and "support 5" in page

    audit.results = None  # planned only: the page still lists the selection
    rows = {(r[0], r[1]): r for r in _cells(render(audit, "html"))}
    assert rows[("attention-parity", "sm120")][2] == "selected, not run"

    summary = json.loads(render(audit, "check-run"))["output"]["summary"]
    assert "#### Tests" in summary and "#### Not run" in summary
    assert "`attention-parity` on sm120: selected. Run it:" in summary
