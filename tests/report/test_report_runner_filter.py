"""`--runner LABEL` keeps one label's suites; what it left out is said, with how to run it, never hidden."""

from __future__ import annotations

from checks.model import AuditOptions, AuditRequest
from runner import pipeline
from runner.report import render, report

CONFIG = '''
[[suite]]
id = "parity"
kind = "parity"
command = "true"
runners = ["sm90"]
paths = ["kernels/**"]

[[suite]]
id = "unit"
kind = "unit"
command = "true"
runners = ["cpu", "sm90"]
paths = ["python/**"]
'''


def review(repo, files, **options):
    base = repo.commit_files({".github/drift-audit.toml": CONFIG, "kernels/a.cu": "int a;\n",
                              "python/w.py": "X = 1\n"}, "base")
    head = repo.commit_files(files, "head")
    audit = pipeline.review(AuditRequest(repo=str(repo.root), base=base, head=head, options=AuditOptions(**options)))
    audit.report = report(audit)
    return audit


def test_every_suite_filtered_out_is_said_not_called_undeclared(repo):
    audit = review(repo, {"kernels/a.cu": "int a = 1;\n"}, runner="cpu", run=True)
    assert audit.plan is not None and audit.plan.suites == []
    assert [(s.id, s.runner) for s in audit.plan.filtered] == [("parity", "sm90")]
    text = audit.report.markdown
    assert "No test suites are declared" not in text and "No suite is affected" not in text
    assert "No selected suite runs on cpu: 1 suite run on sm90 was left out by `--runner cpu`" in text
    assert ("- `parity` on sm90: selected, left out by `--runner cpu`. Run it: `/audit run parity on sm90`"
            in text)
    assert "- `parity` on sm90: path 'kernels/\\*\\*' matched kernels/a.cu" in text  # why, still
    page = render(audit, "html")
    assert "selected, left out by --runner cpu" in page


def test_a_suite_asked_for_by_id_never_vanishes(repo):
    audit = review(repo, {"python/w.py": "X = 2\n"}, runner="cpu", suites=["parity"])
    assert audit.plan is not None and audit.plan.suites == []
    assert [(s.id, s.runner) for s in audit.plan.filtered] == [("parity", "sm90")]
    assert "`parity` on sm90: selected, left out by `--runner cpu`" in audit.report.markdown


def test_mixed_labels_run_one_and_list_the_other(repo):
    audit = review(repo, {"python/w.py": "X = 2\n"}, runner="cpu", run=True)
    assert audit.results is not None
    assert [(r.suite, r.runner, r.outcome) for r in audit.results.suites] == [("unit", "cpu", "passed")]
    text = audit.report.markdown
    assert "✅ 1 passed" in text
    assert "- `unit` on sm90: selected, left out by `--runner cpu`." in text
