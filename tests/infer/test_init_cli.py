"""`drift-audit init` and `drift-audit infer` through the console script on a real repo."""

from __future__ import annotations

import git

from bot.cli import main
from checks.audit import evaluate_tree, run_checks
from checks.config import CONFIG_PATH, load_config, parse_config
from checks.diff import build_changeset
from checks.model import AuditRequest
from checks.workspace import Tree, checkout
from tests.gitrepo import GitRepo
from tests.infer import engine


def make(tmp_path):
    r = GitRepo(tmp_path / "engine")
    return r, r.commit_files(engine.files(), "Engine with five ops")


def test_init_writes_a_config_that_loads_and_holds_at_head(tmp_path, capsys):
    r, base = make(tmp_path)
    assert main(["init", str(r.path)]) == 0
    said = capsys.readouterr().out
    assert "2 rules over" in said and "Next: read it" in said
    text = (r.path / CONFIG_PATH).read_text()
    config = parse_config(text)
    # The three registries hold one set of names; the enum and the name table also keep one order.
    assert [x.kind for x in config.rules] == ["same-set", "table-equal"]
    assert all(x.source == "declared" and x.severity == "error" for x in config.rules)
    assert "# " in text and "support 6" in text  # each rule carries its evidence as a comment
    # The checklist's pillars, as the built-in default maps this layout: init never maps a file worse.
    from checks.config import default_config
    from checks.pillars import PillarMatcher

    ours, builtin = PillarMatcher(config.pillars), PillarMatcher(default_config().pillars)
    paths = Tree(str(r.path), base).paths()
    claimed = [x for x in paths if builtin.by_path(x)]
    assert claimed and [ours.by_path(x) for x in claimed] == [builtin.by_path(x) for x in claimed]
    assert {pid for x in paths if not builtin.by_path(x) for pid, _ in ours.by_path(x)} <= {"engine"}  # else Other
    assert {p.id for p in config.pillars} >= {"wiring"} and "# built-in pillar:" in text
    assert [(s.id, s.command) for s in config.suites] == [("tests", "python -m pytest -q tests")]
    assert "engine/**" in config.suites[0].paths  # the test imports engine.registry
    side = evaluate_tree(config, Tree(str(r.path), base))
    assert side.findings == [] and side.skipped_rules == set() and side.unchecked == []


def test_the_proposed_config_unedited_catches_the_drift(tmp_path):
    r, base = make(tmp_path)
    assert main(["init", str(r.path)]) == 0
    with_config = r.commit("Adopt the proposed drift-audit config")
    head = r.commit_files(engine.files(engine.OPS + ["rope"], names=engine.OPS), "Add rope, name table forgotten")
    co = checkout(AuditRequest(repo=str(r.path), base=with_config, head=head))
    config = load_config(git.Repo(r.path), with_config)
    found = run_checks(co, config, build_changeset(co))
    new = found.with_status("new")
    assert new and {(f.source, f.severity) for f in new} == {("declared", "error")}, [f.message for f in new]
    assert any("'rope'" in f.message for f in new) and found.failing == new
    # Facts are named after what they read, and the rule says what it keeps in step.
    assert any("hold the same names: '" in f.message and "is in enum_OpKind" in f.message
               and "array_OP_NAMES" in f.message for f in new), [f.message for f in new]
    assert found.inferred == []  # declared rules exist, so inference stays off by default


def test_init_refuses_to_overwrite(tmp_path, capsys):
    r, _ = make(tmp_path)
    (r.path / ".github").mkdir()
    (r.path / CONFIG_PATH).write_text("# mine\n")
    assert main(["init", str(r.path)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert (r.path / CONFIG_PATH).read_text() == "# mine\n"


def test_infer_prints_invariants_with_support(tmp_path, capsys):
    r, _ = make(tmp_path)
    assert main(["infer", str(r.path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 invariants inferred from the code at") and "e.g. OP_ADD (csrc/ops.h:3)" in out
    assert "hold the same names (6 names, 3 files)\n   id: inferred-enum-OpKind-" in out and "in the same order" in out
    assert "allowed to differ: array OP_NAMES lacks OP_COUNT" in out  # names as written, no internal fact ids
    assert "@" not in out and "drift-audit init" in out


def test_infer_on_a_non_repo_is_a_clear_error(tmp_path, capsys):
    assert main(["infer", str(tmp_path)]) == 2
    assert "not a git repository" in capsys.readouterr().err


def test_init_writes_count_agreement_as_a_join_equal_rule_that_holds(tmp_path):
    from tests.infer.test_inference import _layers, _registers

    r = GitRepo(tmp_path / "counts")
    ops = {"embedding": 2, "rmsnorm": 2, "linear": 3, "attention": 4, "allreduce": 1}
    head = r.commit_files({"py/kernel.py": _layers(ops), "src/register.cc": _registers(ops)}, "five tasks")
    assert main(["init", str(r.path)]) == 0
    config = parse_config((r.path / CONFIG_PATH).read_text())
    joins = [x for x in config.rules if x.kind == "join-equal"]
    assert len(joins) == 1 and joins[0].options["equal"][0].endswith(".count")
    side = evaluate_tree(config, Tree(str(r.path), head))
    assert side.findings == [] and side.skipped_rules == set()


def test_init_gives_a_source_tree_no_built_in_pillar_fits_its_own(tmp_path):
    r = GitRepo(tmp_path / "engine")
    files = dict(engine.files())
    files.update({f"planner/step_{i}.py": f"def plan_{i}():\n    return {i}\n" for i in range(4)})
    r.commit_files(files, "Engine and a planner")
    assert main(["init", str(r.path)]) == 0
    config = parse_config((r.path / CONFIG_PATH).read_text())
    planner = next(p for p in config.pillars if p.id == "planner")
    assert planner.paths == ["planner/**"]


def test_init_on_a_repo_with_no_invariant_says_so_and_does_not_ask_to_prune_rules(tmp_path, capsys):
    r = GitRepo(tmp_path / "plain")
    r.commit_files({"engine/runner.py": "def step(x):\n    return x + 1\n"}, "One module, no registry")
    assert main(["init", str(r.path)]) == 0
    said = capsys.readouterr().out
    assert "0 rules over 0 facts" in said and "No rule was proposed" in said
    assert "delete the rules" not in said and "keep inferring" in said
    assert parse_config((r.path / CONFIG_PATH).read_text()).rules == []


def test_init_writes_regex_facts_as_regexes_and_they_catch_the_drift(tmp_path):
    # A Cython mirror of a C++ enum is read by a regex (no Cython grammar): init must write `regex = ...`, not an
    # empty `query`, so the file it proposes parses and keeps the two enums in step.
    from tests.infer.test_cython import OPS, header, pxd

    r = GitRepo(tmp_path / "mk")
    r.commit_files({"include/engine/ops.h": header(OPS), "python/engine/_ext/core.pxd": pxd(OPS)}, "six ops")
    assert main(["init", str(r.path)]) == 0
    text = (r.path / CONFIG_PATH).read_text()
    config = parse_config(text)
    regex_facts = [f for f in config.facts if f.regex]
    assert regex_facts and all(not f.query for f in regex_facts), text
    with_config = r.commit("Adopt the proposed drift-audit config")
    head = r.commit_files({"include/engine/ops.h": header(OPS + ["GELU"])}, "gelu in the header only")
    co = checkout(AuditRequest(repo=str(r.path), base=with_config, head=head))
    found = run_checks(co, load_config(git.Repo(r.path), with_config), build_changeset(co))
    assert any("OPK_GELU" in f.message or "GELU" in f.message for f in found.with_status("new")), \
        [f.message for f in found.findings]
