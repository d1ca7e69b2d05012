"""Where findings surface: SARIF 2.1.0 (schema-validated), the comment section, and `drift-audit facts`.

sarif-schema-2.1.0.json beside this file is the OASIS SARIF 2.1.0 errata01 JSON schema
(docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/), vendored unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from checks.audit import run_checks
from checks.config import parse_config
from checks.diff import build_changeset
from checks.model import (
    Audit,
    AuditRequest,
    ChangeSet,
    Checkout,
    Finding,
    Findings,
    Location,
    PillarMap,
    Unchecked,
    from_json,
    to_json,
)
from checks.packs import sample as shape
from checks.workspace import checkout
from runner.report.sarif import to_sarif

SCHEMA = json.loads((Path(__file__).parent / "sarif-schema-2.1.0.json").read_text())


def make_audit(repo, base, head) -> Audit:
    request = AuditRequest(repo=str(repo), base=base, head=head)
    co = checkout(request)
    changes = build_changeset(co)
    findings = run_checks(co, parse_config(shape.CONFIG), changes)
    return Audit(request=request, checkout=co, config_source="test", changes=changes, pillars=PillarMap(), findings=findings)


@pytest.fixture(scope="module")
def mixed_audit(shape_repo, tmp_path_factory):
    """New, pre-existing and fixed findings at once."""
    repo = shape.init_repo(tmp_path_factory.mktemp("mixed") / "r")
    d = {k: apply for k, (_, apply) in shape.DRIFTS.items()}
    base = shape.commit(repo, d["gate-gap"](d["shard-tables-differ"](shape.base_files())), "base")
    head = shape.commit(repo, d["bare-operand"](d["tuple-vs-new-input"](d["shard-tables-differ"](shape.base_files()))), "head")
    audit = make_audit(repo, base, head)
    audit.findings.unchecked.append(Unchecked("fact 'x' (cfg:3)", "query does not compile: <bad> `q` | x"))
    return audit


def test_sarif_validates_against_the_2_1_0_schema(mixed_audit):
    sarif = to_sarif(mixed_audit)
    jsonschema.Draft4Validator(SCHEMA).validate(sarif)
    run = sarif["runs"][0]
    results = run["results"]
    assert {(r["ruleId"], r["baselineState"]) for r in results} == {
        ("pk-inputs-arity", "new"), ("pk-metadata-bare-operand", "new"), ("shard-tables-agree", "unchanged"),
    }  # the fixed gate finding is not at head, so it is not a result
    for r in results:
        assert r["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1
        assert run["tool"]["driver"]["rules"][r["ruleIndex"]]["id"] == r["ruleId"]
        assert len(r["partialFingerprints"]["driftAudit/v1"]) == 20
    assert run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"].startswith("fact 'x'")
    json.dumps(sarif)  # serialisable as is


def test_sarif_gives_every_result_a_location(mixed_audit):
    gone = Finding("pinned-flag", "runtime", "error", "'x' is pinned to 1 but no longer found", [], "new", "f" * 20)
    audit = Audit(mixed_audit.request, mixed_audit.checkout, "t", mixed_audit.changes, PillarMap(), Findings([gone]))
    sarif = to_sarif(audit)
    jsonschema.Draft4Validator(SCHEMA).validate(sarif)
    where = sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
    assert where["artifactLocation"]["uri"] == ".github/drift-audit.toml" and where["region"]["startLine"] == 1


def test_sarif_rejects_nothing_it_should_not(mixed_audit):
    """The validator is live: a broken document fails it."""
    sarif = to_sarif(mixed_audit)
    sarif["runs"][0]["results"][0]["level"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(SCHEMA).validate(sarif)


def test_findings_round_trip_through_json(mixed_audit):
    back = from_json(Findings, to_json(mixed_audit.findings))
    assert back == mixed_audit.findings


def _render(audit, blob_url=None):
    from runner.report import Context
    from runner.report.markdown import render_at

    return render_at(audit, Context(blob_url=blob_url), 0)


def test_comment_lists_new_folds_preexisting_counts_fixed(mixed_audit):
    text = _render(mixed_audit, blob_url="https://github.com/o/r/blob/abc123")
    new_part, _, rest = text.partition("#### Pillars")
    assert "**2 new findings:**" in new_part
    assert "pk-inputs-arity" in new_part and "pk-metadata-bare-operand" in new_part
    assert "shard-tables-agree" not in new_part and "shard-tables-agree" in rest
    assert "1 pre-existing finding" in rest and "fixes 1 finding present on the base" in new_part
    assert "(https://github.com/o/r/blob/abc123/src/graph.cc#L" in new_part
    assert "Could not check 1 config entry" in rest
    assert "\\<bad\\> \\`q\\` \\| x" in text  # user text escaped for markdown and HTML
    assert "> ⚠️ The config could not be fully checked: fact 'x' \\(cfg:3\\)" in text.split("#### Findings")[0]
    plain = _render(mixed_audit)
    assert "`src/graph.cc:" in plain and "](" not in plain.partition("#### Pillars")[0]


def test_comment_links_escape_odd_paths():
    audit = Audit(
        request=AuditRequest(repo=".", base="a", head="b"),
        checkout=Checkout(".", "a" * 40, "b" * 40, "a" * 40),
        config_source="t",
        changes=ChangeSet("a", "b", "a"),
        pillars=PillarMap(),
        findings=Findings(
            [Finding("r", "wiring", "error", "<script>x</script> [link](y)", [Location("dir with space/a]b.py", 7)])]
        ),
    )
    text = _render(audit, blob_url="https://h/o/r/blob/sha")
    assert "(https://h/o/r/blob/sha/dir%20with%20space/a%5Db.py#L7)" in text
    assert "\\<script\\>" in text and "<script>" not in text and "\\[link\\]\\(y\\)" in text


def test_comment_includes_the_section(mixed_audit):
    from runner.report import report as render

    report = render(mixed_audit)
    assert "#### Findings" in report.markdown and report.verdict == "fail"


def test_facts_cli_prints_rows(shape_repo, capsys):
    from bot.cli import main

    repo, shas = shape_repo
    assert main(["facts", str(repo), "--rev", shas["clean"], "--fact", "pk_enum_tasks"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "# pk_enum_tasks: 6 row(s) from 1 file(s)"
    assert "TASK_TOPK_SOFTMAX\tinclude/engine/runtime_header.h:" in out
    assert main(["facts", str(repo), "--rev", shas["base"], "--fact", "pk_wrapper_inputs", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)[0]["rows"]
    assert {r["key"]: r["values"]["count"] for r in rows}["TASK_ATTENTION"] == "2..3"


def test_facts_cli_reads_the_work_tree_config_and_reports_errors(tmp_path, capsys):
    from bot.cli import main

    repo = shape.init_repo(tmp_path / "r")
    shape.commit(repo, {"a.h": "enum T { TASK_A };\n"}, "c")
    cfg = repo / ".github" / "drift-audit.toml"
    cfg.parent.mkdir()
    cfg.write_text('[[fact]]\nid = "e"\nlang = "cpp"\nfiles = ["*.h"]\nquery = "(enumerator name: (identifier) @key)"\n')
    assert main(["facts", str(repo)]) == 0
    assert "TASK_A\ta.h:1" in capsys.readouterr().out
    assert main(["facts", str(repo), "--fact", "nope"]) == 2
    assert "no fact 'nope'" in capsys.readouterr().err
    cfg.write_text('[[fact]]\nid = "e"\nlang = "cpp"\nfiles = ["*.h"]\nquery = "(enumerator (bogus) @key)"\n')
    assert main(["facts", str(repo)]) == 1
    assert "query does not compile" in capsys.readouterr().err
    cfg.write_text('[[fact]]\nid = "e"\nlang = "cobol"\nfiles = ["*.h"]\nquery = "(x) @key"\n')
    assert main(["facts", str(repo)]) == 2
    assert "drift-audit.toml:3: [[fact]] #1, key 'lang'" in capsys.readouterr().err


def test_facts_cli_tries_a_query_without_a_config(shape_repo, capsys):
    from bot.cli import main

    repo, shas = shape_repo
    query = '(call function: (attribute attribute: (identifier) @_r) arguments: (argument_list . (_) . (string (string_content) @key)) (#eq? @_r "register_task"))'
    assert main(["facts", str(repo), "--rev", shas["base"], "--lang", "python", "--files", "python/**/*.py", "--query", query]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# adhoc: 5 row(s) from 3 file(s)" and out[1].startswith("embedding\tpython/engine/persistent_kernel.py:")
    assert main(["facts", str(repo), "--files", "src/*.cc", "--regex", r"TASK_(?P<key>[A-Z]+)\] ="]) == 0
    assert "ATTENTION\tsrc/runtime.cc:" in capsys.readouterr().out
    assert main(["facts", str(repo), "--query", "(x) @key"]) == 2
    assert "needs --files" in capsys.readouterr().err
