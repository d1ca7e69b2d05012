"""The checks stage end to end on a real repo: one finding per seeded drift, none for a clean change,
and findings sorted into new / pre-existing / fixed by fingerprint."""

from __future__ import annotations

import pytest

from checks.audit import run_checks
from checks.config import parse_config
from checks.diff import build_changeset
from checks.model import AuditRequest
from checks.packs import sample as shape
from checks.workspace import checkout


def audit(repo, base, head, config_text=shape.CONFIG):
    co = checkout(AuditRequest(repo=str(repo), base=base, head=head))
    return run_checks(co, parse_config(config_text), build_changeset(co))


def test_base_is_clean(shape_repo):
    repo, shas = shape_repo
    found = audit(repo, shas["base"], shas["base"])
    assert found.findings == [] and found.unchecked == []


def test_large_clean_change_gives_zero_findings(shape_repo):
    repo, shas = shape_repo
    found = audit(repo, shas["base"], shas["clean"])
    assert [f.message for f in found.findings] == []
    assert found.unchecked == []
    assert not found.failing


@pytest.mark.parametrize("kind", list(shape.DRIFTS))
def test_each_seeded_drift_gives_one_new_finding(shape_repo, kind):
    repo, shas = shape_repo
    rule = shape.DRIFTS[kind][0]
    found = audit(repo, shas["base"], shas[kind])
    assert [(f.rule, f.status) for f in found.findings] == [(rule, "new")], [f.message for f in found.findings]
    f = found.findings[0]
    assert f.locations and all(loc.line >= 1 for loc in f.locations)
    assert found.failing == [f]


def test_messages_name_what_drifted(shape_repo):
    repo, shas = shape_repo
    found = audit(repo, shas["base"], shas["all-drifts"])
    by_rule = {}
    for f in found.findings:
        by_rule.setdefault(f.rule, []).append(f)
    assert len(found.findings) == len(shape.DRIFTS)
    (wiring_a, wiring_b) = sorted(by_rule["pk-task-wiring"], key=lambda f: f.message)
    assert "'TASK_ATTENTION'" in wiring_a.message and "missing from pk_name_map" in wiring_a.message
    assert "'TASK_LINEAR'" in wiring_b.message and "kernels/sm100/task_header.cuh" in wiring_b.message
    assert "TASK_EMBEDDING" in by_rule["pk-register-returns-own-task"][0].message
    assert "TASK_TOPK" in by_rule["pk-register-declared-defined"][0].message
    arity = by_rule["pk-inputs-arity"][0]
    assert "TASK_RMSNORM" in arity.message and "= 3" in arity.message and "= 2" in arity.message
    assert "'wo' differs" in by_rule["shard-tables-agree"][0].message
    assert "values 9–15" in by_rule["attention-gates-partition"][0].message
    assert "'TASK_ATTENTION' is a bare operand" in by_rule["pk-metadata-bare-operand"][0].message
    assert "False, pinned to True" in by_rule["mtp-prefill-pinned"][0].message
    assert "591 == 591 == 584" in by_rule["kv-token-bytes"][0].message
    paths = {loc.path for f in found.findings for loc in f.locations}
    assert {"src/runtime.cc", "src/graph.cc", "scripts/demo.py", "include/engine/mla.h"} <= paths


def test_status_new_preexisting_fixed(shape_repo, tmp_path):
    """Base has two drifts; head fixes one, keeps one (with its lines moved) and adds one."""
    repo = shape.init_repo(tmp_path / "r")
    files = shape.base_files()
    gate = shape.DRIFTS["gate-gap"][1]
    tables = shape.DRIFTS["shard-tables-differ"][1]
    pinned = shape.DRIFTS["pinned-flag"][1]
    base = shape.commit(repo, tables(gate(files)), "base with two drifts")
    head_files = pinned(tables(files))
    head_files["scripts/demo.py"] = "# moved\n" * 7 + head_files["scripts/demo.py"]  # lines shift, fingerprint holds
    head = shape.commit(repo, head_files, "fix the gate, add a pinned drift")
    found = audit(repo, base, head)
    status = {f.rule: f.status for f in found.findings}
    assert status == {
        "mtp-prefill-pinned": "new",
        "shard-tables-agree": "pre-existing",
        "attention-gates-partition": "fixed",
    }
    kept = next(f for f in found.findings if f.rule == "shard-tables-agree")
    assert any(loc.path == "scripts/demo.py" and loc.line == 12 for loc in kept.locations)  # head lines
    assert [f.rule for f in found.failing] == ["mtp-prefill-pinned"]


def test_only_new_errors_fail(shape_repo):
    repo, shas = shape_repo
    relaxed = shape.CONFIG.replace('pillar = "runtime"\n', 'pillar = "runtime"\nseverity = "warning"\n', 1)
    found = audit(repo, shas["base"], shas["pinned-flag"], relaxed)
    assert [(f.rule, f.severity, f.status) for f in found.findings] == [("mtp-prefill-pinned", "warning", "new")]
    assert found.failing == []


def test_bad_input_is_reported_and_the_rest_still_runs(shape_repo, tmp_path):
    repo = shape.init_repo(tmp_path / "bad")
    files = shape.DRIFTS["pinned-flag"][1](shape.base_files())
    files["kernels/sm100/task_header.cuh"] += "#include \n int broken( {\n"  # does not parse
    head = shape.commit(repo, files, "head")
    config = shape.CONFIG + '''
[[fact]]
id = "broken_query"
lang = "cpp"
files = ["src/*.cc"]
query = "(function_definition name: (nonexistent_node) @key"

[[fact]]
id = "finds_nothing"
lang = "python"
files = ["python/**/*.py"]
query = "(call function: (identifier) @key (#eq? @key \\"no_such_function\\"))"

[[rule]]
id = "uses-broken"
kind = "pinned"
facts = ["broken_query"]
value = "1"
field = "key"

[[rule]]
id = "uses-nothing"
kind = "pinned"
facts = ["finds_nothing"]
value = "1"
field = "key"
'''
    co = checkout(AuditRequest(repo=str(repo), base=head, head=head))
    found = run_checks(co, parse_config(config), build_changeset(co))
    text = {u.entry.split(" (")[0]: u.reason for u in found.unchecked}
    assert "query does not compile" in text["fact 'broken_query'"]
    assert "matched nothing" in text["fact 'finds_nothing'"]
    assert "not evaluated" in text["rule 'uses-broken'"] and "not evaluated" in text["rule 'uses-nothing'"]
    syntax = [u for u in found.unchecked if "syntax error" in u.reason]
    assert syntax and "kernels/sm100/task_header.cuh:" in syntax[0].reason
    assert syntax[0].entry.startswith("fact 'pk_kernel_includes' (checks/packs/persistent_kernel.toml:")  # a pack's fact
    assert all(".github/drift-audit.toml:" in u.entry for u in found.unchecked if u not in syntax)
    # Every other rule still ran: the seeded pinned drift is found (pre-existing, since base == head).
    assert [f.rule for f in found.findings] == ["mtp-prefill-pinned"]


def test_rule_that_cannot_run_on_head_does_not_claim_fixed(tmp_path):
    repo = shape.init_repo(tmp_path / "gone")
    files = shape.DRIFTS["pinned-flag"][1](shape.base_files())
    base = shape.commit(repo, files, "base")
    del files["python/engine/config.py"]
    head = shape.commit(repo, files, "delete the flags")
    found = audit(repo, base, head)
    assert not [f for f in found.findings if f.rule == "mtp-prefill-pinned" and f.status == "fixed"]
    assert any(u.entry.startswith("rule 'mtp-prefill-pinned'") for u in found.unchecked)


def test_renaming_a_file_keeps_a_finding_preexisting(tmp_path):
    repo = shape.init_repo(tmp_path / "mv")
    files = shape.DRIFTS["shard-tables-differ"][1](shape.base_files())
    base = shape.commit(repo, files, "base")
    files["scripts/tp_demo.py"] = files.pop("scripts/demo.py")
    config = shape.CONFIG.replace('files = ["scripts/demo.py"]', 'files = ["scripts/*demo.py"]')
    repo_cfg = {**files, ".github/drift-audit.toml": config}
    head = shape.commit(repo, repo_cfg, "rename the demo")
    found = audit(repo, base, head, config)
    assert [(f.rule, f.status) for f in found.findings] == [("shard-tables-agree", "pre-existing")]
    assert found.findings[0].locations[0].path == "scripts/tp_demo.py"


def test_one_drift_in_two_places_is_one_finding_with_both_locations(tmp_path):
    repo = shape.init_repo(tmp_path / "dup")
    files = shape.base_files()
    base = shape.commit(repo, files, "base")
    flags = files["python/engine/config.py"].replace("= True", "= False")
    config = shape.CONFIG.replace('files = ["python/engine/config.py"]', 'files = ["python/engine/*config.py"]')
    head = shape.commit(repo, {**files, "python/engine/config.py": flags, "python/engine/mtp_config.py": flags,
                               ".github/drift-audit.toml": config}, "turn it off twice")
    found = audit(repo, base, head, config)
    assert [(f.rule, f.status) for f in found.findings] == [("mtp-prefill-pinned", "new")]
    assert sorted(loc.path for loc in found.findings[0].locations) == ["python/engine/config.py", "python/engine/mtp_config.py"]
