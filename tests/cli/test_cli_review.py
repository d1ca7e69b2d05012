"""`drift-audit review` options beyond the defaults: --config, formats, help, the demo's clean-up, and
nothing to run costing nothing."""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET

from bot.cli import main
from checks.model import AuditOptions, AuditRequest
from runner import pipeline
from tests.cli.configs import PINNED_CONFIG


def test_config_file_is_tried_on_the_range_and_the_footer_says_so(capsys, repo, tmp_path):
    repo.write("engine/model.py", "LIMIT = 8\n")
    base = repo.commit("base")
    repo.write("engine/model.py", "LIMIT = 9\n")
    repo.commit("head")
    trial = tmp_path / "trial.toml"
    trial.write_text(PINNED_CONFIG)
    code = main(["review", str(repo.root), "--base", base, "--config", str(trial)])
    out = capsys.readouterr().out
    assert code == 1  # the uncommitted config's rule ran and failed the verdict
    assert "limit-pinned" in out
    footer = out.rsplit("\n---\n", 1)[1]
    assert "not the base's committed config" in footer and "trial.toml" in footer
    code = main(["review", str(repo.root), "--base", base])  # the base has no config: nothing fails
    assert code == 0 and "No drift rules configured" in capsys.readouterr().out


def test_config_file_that_does_not_exist(capsys, two_commits, tmp_path):
    repo, base, _ = two_commits
    code = main(["review", str(repo.root), "--base", base, "--config", str(tmp_path / "nope.toml")])
    err = capsys.readouterr().err
    assert code == 2 and "--config" in err and "no such file" in err and "Traceback" not in err


def test_junit_has_findings_and_suites_as_test_cases(capsys, repo, tmp_path):
    repo.write("engine/model.py", "LIMIT = 8\n")
    base = repo.commit("base")
    repo.write("engine/model.py", "LIMIT = 9\n")
    repo.commit("head")
    trial = tmp_path / "trial.toml"
    trial.write_text(PINNED_CONFIG + '\n[[suite]]\nid = "unit"\nkind = "unit"\ncommand = "true"\n'
                     'runners = ["cpu"]\npaths = ["engine/**"]\n')
    out_file = tmp_path / "audit.xml"
    code = main(["review", str(repo.root), "--base", base, "--config", str(trial), "--format", "junit",
                 "--run", "-o", str(out_file)])
    assert code == 1, capsys.readouterr().err
    root = ET.parse(out_file).getroot()
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    findings, runs = suites["drift-audit.findings"], suites["drift-audit.suites"]
    failed = [c for c in findings.findall("testcase") if c.find("failure") is not None]
    assert len(failed) == 1 and failed[0].get("name").startswith("limit-pinned: ")
    assert ":" not in failed[0].get("name").split("[", 1)[-1]  # a file, no line number: lines move
    assert failed[0].find("failure").get("message").endswith(audit_message(out_file.parent, repo, base, trial))
    assert failed[0].get("classname") == "findings.runtime"
    unit = [c for c in runs.findall("testcase") if c.get("classname") == "suites.cpu.unit"]
    assert len(unit) == 1 and not list(unit[0])  # `true` passed: no failure, error or skipped child
    assert root.get("failures") == "1" and int(root.get("tests")) == len(root.findall(".//testcase"))


def test_help_lists_formats_exit_codes_and_what_implies_run(capsys):
    try:
        main(["review", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    text = capsys.readouterr().out
    for fmt in ("markdown", "json", "sarif", "junit", "html", "check-run"):
        assert f"  {fmt} " in text
    assert "exit codes:" in text and "0  the verdict passed" in text and "2  bad input" in text
    assert "--suite ID and --all imply --run" in text


def test_serve_help_shows_its_defaults(capsys):
    try:
        main(["serve", "--help"])
    except SystemExit:
        pass
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 127.0.0.1)" in text and "(default: 8080)" in text and "else drift-audit.db" in text


def test_demo_removes_its_temp_repo_unless_keep(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    assert main(["demo", "--no-run"]) == 0
    assert not list(tmp_path.glob("drift-audit-demo-*"))
    err = capsys.readouterr().err
    assert "sample repo removed; --keep keeps it" in err
    assert main(["demo", "--no-run", "--keep"]) == 0
    kept = list(tmp_path.glob("drift-audit-demo-*"))
    assert len(kept) == 1 and (kept[0] / ".git").is_dir()
    assert f"drift-audit review {kept[0]} --base" in capsys.readouterr().err


def test_nothing_to_run_costs_nothing(repo):
    repo.write("a.py", "x = 1\n")
    base = repo.commit("base")
    repo.write("a.py", "x = 2\n")
    repo.commit("head")
    request = AuditRequest(repo=str(repo.root), base=base, head="HEAD", options=AuditOptions(run=True, all_suites=True))

    def refuse(plan):
        raise AssertionError("an empty plan must not reach a backend")

    audit = pipeline.review(request, backend=refuse)
    assert audit.plan is not None and audit.plan.suites == []
    assert audit.results is not None and audit.results.suites == []
    assert "dispatch" not in audit.timings
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo.root, capture_output=True, text=True).stdout
    assert len(worktrees.splitlines()) == 1


def test_run_hands_the_plan_to_the_backend(repo):
    repo.write(".github/drift-audit.toml", '[[suite]]\nid = "unit"\nkind = "unit"\ncommand = "true"\n'
               'runners = ["sm90"]\npaths = ["**"]\n')
    repo.write("a.py", "x = 1\n")
    base = repo.commit("base")
    repo.write("a.py", "x = 2\n")
    repo.commit("head")
    seen = []

    def backend(plan):
        from checks.model import Results, SuiteResult

        seen.append(plan)
        return Results(plan.audit_id, plan.head_sha, [SuiteResult("unit", "sm90", "not-run", reason="dispatched")])

    audit = pipeline.review(AuditRequest(repo=str(repo.root), base=base, head="HEAD",
                                         options=AuditOptions(suites=["unit"])), backend=backend)
    assert [s.id for s in seen[0].suites] == ["unit"]
    assert audit.results.suites[0].reason == "dispatched" and "dispatch" in audit.timings
    assert os.path.isdir(audit.checkout.repo) and audit.checkout.git is not None


def test_a_pull_request_already_merged_into_its_base_is_an_empty_audit(repo):
    repo.write("a.py", "x = 1\n")
    head = repo.commit("the PR")
    repo.write("a.py", "x = 2\n")
    base = repo.commit("main moved on, the PR merged")
    audit = pipeline.plan(AuditRequest(repo=str(repo.root), base=base, head=head, pr=7, trigger="pull_request"))
    assert audit.changes.files == []
    try:
        pipeline.plan(AuditRequest(repo=str(repo.root), base=base, head=head))
    except pipeline.RequestError as exc:
        assert isinstance(exc, ValueError) and "reversed range" in str(exc)
    else:
        raise AssertionError("the CLI's reversed range must be refused")


def test_facts_with_none_declared_says_so(capsys, two_commits):
    repo, _, _ = two_commits
    code = main(["facts", str(repo.root)])
    captured = capsys.readouterr()
    assert code == 0 and captured.out == ""
    assert captured.err.startswith("drift-audit facts: no [[fact]] in built-in default")
    assert ".github/drift-audit.toml" in captured.err and "drift-audit infer" in captured.err


def test_headline_of_a_change_only_other_holds(capsys, repo):
    repo.write("src/a.txt", "one\n")
    base = repo.commit("base")
    repo.write("src/a.txt", "two\n")
    repo.commit("head")
    main(["review", str(repo.root), "--base", base])
    out = capsys.readouterr().out
    assert "### ⚠️ Drift Audit: only Other touched \\(1 file\\)" in out.splitlines()[1], out.splitlines()[1]
    assert "0 pillars touched" not in out


def test_a_pr_that_breaks_the_config_is_warned_in_that_pr(capsys, repo, tmp_path):
    repo.write(".github/drift-audit.toml", PINNED_CONFIG)
    repo.write("engine/model.py", "LIMIT = 8\n")
    base = repo.commit("base")
    repo.write(".github/drift-audit.toml", "[settings\n")
    repo.commit("head")
    code = main(["review", str(repo.root), "--base", base])
    out = capsys.readouterr().out
    assert code == 0  # audited with the base's config, which still passes
    warning = next(line for line in out.splitlines() if "does not load" in line)
    assert warning.startswith("> ⚠️ This PR's `.github/drift-audit.toml` does not load, so this audit used the base's")
    assert ".github/drift-audit.toml@" in warning and "line 1" in warning, warning
    main(["review", str(repo.root), "--base", base, "--format", "html", "-o", str(tmp_path / "d.html")])
    assert "does not load, so this audit used the base" in (tmp_path / "d.html").read_text()

    repo.write(".github/drift-audit.toml", PINNED_CONFIG + "\n# still fine\n")
    repo.commit("repaired")
    main(["review", str(repo.root), "--base", base])
    assert "does not load" not in capsys.readouterr().out


def audit_message(tmp, repo, base, trial):
    main(["review", str(repo.root), "--base", base, "--config", str(trial), "--format", "json",
          "-o", str(tmp / "a.json")])
    from checks.model import Audit, from_json

    return from_json(Audit, (tmp / "a.json").read_text()).findings.findings[0].message


def test_junit_case_names_are_rule_key_and_file_only():
    from checks.model import Finding, Location
    from runner.report.junit import case_name

    f = Finding("pk-task-wiring", "wiring", "error",
                "task wiring is incomplete: 'TASK_TOPK_SOFTMAX' is in pk_enum_tasks but missing from pk_name_map",
                [Location("include/engine/runtime_header.h", 9)], fingerprint="ab" * 20)
    assert case_name(f) == "pk-task-wiring: TASK_TOPK_SOFTMAX [include/engine/runtime_header.h]"
    reworded = Finding(f.rule, f.pillar, f.severity, "'TASK_TOPK_SOFTMAX' lacks pk_name_map (and more)",
                       [Location("include/engine/runtime_header.h", 12)], fingerprint=f.fingerprint)
    assert case_name(reworded) == case_name(f)
    bare = Finding("limits", "runtime", "error", "LIMIT is 9", [], fingerprint="cd" * 20)
    assert case_name(bare) == "limits: " + "cd" * 6
