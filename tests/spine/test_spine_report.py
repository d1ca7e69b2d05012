"""The rendered review: structure, escaping, GitHub's size limit, and JSON that loads back."""

import json

from benchmarks.synth_repo import make_synthetic_repo
from checks.model import Audit, AuditRequest, from_json, to_json
from runner.pipeline import review
from runner.report import report
from runner.report.markdown import COMMENT_LIMIT, COMMENT_MARKER
from runner.report.safe import code
from runner.report.safe import text as md


def run_audit(request: AuditRequest) -> Audit:
    audit = review(request)
    audit.report = report(audit)
    return audit


def test_review_of_a_real_range(repo):
    repo.write("engine/model.py", "class MLA:\n    def forward(self, x):\n        return x\n")
    base = repo.commit("base")
    repo.write("engine/model.py", "class MLA:\n    def forward(self, x):\n        return x * 2\n")
    repo.commit("head")
    audit = run_audit(AuditRequest(repo=str(repo.root), base=base, head="HEAD"))
    text = audit.report.markdown
    assert text.startswith(COMMENT_MARKER)
    assert "Drift Audit" in text.splitlines()[1]
    assert "(`topology`): 1 file · 1 symbol · 0 new findings · 0 suites" in text
    assert "`engine/model.py`" in text and "`MLA.forward`" in text
    assert base[:12] in text and "config: built-in default" in text
    for stage in ("checkout", "diff", "pillars", "report"):
        assert stage in audit.timings
    assert audit.report.verdict == "pass"


def test_user_text_is_escaped(repo):
    repo.write("a.py", "x = 1\n")
    base = repo.commit("base")
    evil = "docs/<img src=x onerror=alert(1)>|[link](http:x).py"
    repo.write(evil, "y = 2\n")
    repo.commit("head")
    text = run_audit(AuditRequest(repo=str(repo.root), base=base, head="HEAD")).report.markdown
    # The path only ever appears inside a code span (rendered literally), with its pipe escaped.
    spans = ("`docs/<img src=x onerror=alert(1)>\\|[link](http:x).py`", "`docs/<img src=x onerror=alert(1)>|[link](http:x).py`")
    assert text.count("<img") == sum(text.count(span) for span in spans)
    assert text.count("<img") >= 1


def test_md_and_code_filters():
    assert md("a|b <c>") == r"a\|b \<c\>"
    assert code("x`y") == "``x`y``"
    assert code("a|b") == "`a|b`" and code("a|b", table=True) == r"`a\|b`"


def test_json_round_trips_every_stage(repo):
    repo.write("kernels/rmsnorm.py", "def rmsnorm(x):\n    return x\n")
    base = repo.commit("base")
    repo.write("kernels/rmsnorm.py", "def rmsnorm(x):\n    return x + 0\n")
    repo.mv("kernels/rmsnorm.py", "kernels/norm.py")
    repo.commit("head")
    audit = run_audit(AuditRequest(repo=str(repo.root), base=base, head="HEAD"))
    loaded = from_json(Audit, to_json(audit))
    assert loaded == audit
    assert json.loads(to_json(loaded)) == json.loads(to_json(audit))


def test_bring_up_sized_pr_fits_in_one_comment(tmp_path):
    base, head = make_synthetic_repo(tmp_path / "synth", n_files=600, change_files=129, change_lines=50_000)
    audit = run_audit(AuditRequest(repo=str(tmp_path / "synth"), base=base, head=head))
    assert len(audit.changes.files) == 129
    assert sum(f.additions + f.deletions for f in audit.changes.files) >= 50_000
    report = audit.report
    assert len(report.markdown) <= COMMENT_LIMIT
    assert len(report.check_summary) <= 65_535 and len(report.check_text) <= 65_535
    if report.truncated:
        assert "check run" in report.markdown and report.check_text


def test_overflow_is_cut_with_a_pointer(repo):
    repo.write("seed.py", "x = 0\n")
    base = repo.commit("base")
    for i in range(400):  # long paths in many files, each its own "other" touch
        repo.write(f"very/deeply/nested/directory/structure/for/path/length/{'x' * 60}_{i}.py", f"v = {i}\n")
    repo.commit("head")
    report = run_audit(AuditRequest(repo=str(repo.root), base=base, head="HEAD")).report
    assert len(report.markdown) <= COMMENT_LIMIT
    assert "375 more" in report.markdown  # long lists are capped, the rest counted
    assert len(report.check_text) <= 65_535


def test_pillars_option_restricts_the_report(repo):
    repo.write("engine/model.py", "def forward(x):\n    return x\n")
    repo.write("csrc/attn.cu", "__global__ void attn(float* o) {\n  o[0] = 1;\n}\n")
    base = repo.commit("base")
    repo.write("engine/model.py", "def forward(x):\n    return x * 2\n")
    repo.write("csrc/attn.cu", "__global__ void attn(float* o) {\n  o[0] = 2;\n}\n")
    repo.commit("head")
    from checks.model import AuditOptions

    full = run_audit(AuditRequest(repo=str(repo.root), base=base, head="HEAD"))
    only = run_audit(AuditRequest(repo=str(repo.root), base=base, head="HEAD", options=AuditOptions(pillars=["wiring"])))
    assert {"wiring", "topology"} <= {p.id for p in full.pillars.pillars}
    assert [p.id for p in only.pillars.pillars] == ["wiring"]
    assert "`csrc/attn.cu`" in only.report.markdown and "`engine/model.py`" not in only.report.markdown


def test_repeated_audits_of_one_head_get_their_own_ids():
    from runner.pipeline import audit_id_for

    a = AuditRequest(repo="r", base="b", head="h", nonce="job-1")
    b = AuditRequest(repo="r", base="b", head="h", nonce="job-2")
    assert audit_id_for(a, "f" * 40) != audit_id_for(b, "f" * 40)
    assert audit_id_for(a, "f" * 40) == audit_id_for(a, "f" * 40)
