"""Selection on real git repos: declared suites by path / pillar / symbol / finding, plus the import graph."""

from __future__ import annotations

import pytest

from checks.config import load_config
from checks.diff import build_changeset
from checks.model import AuditOptions, AuditRequest, Finding, Findings, Location, from_json, to_json
from checks.model import TestPlan as Plan
from checks.pillars import map_pillars
from checks.workspace import Tree, checkout, open_repo
from runner.select import SelectionError, select_tests

CONFIG = '''
[[pillar]]
id = "topology"
title = "Topology"
paths = ["engine/**"]

[[pillar]]
id = "wiring"
title = "Wiring"
paths = ["kernels/**"]

[[suite]]
id = "parity-rmsnorm"
kind = "parity"
command = "pytest tests/kernels/test_rmsnorm.py"
runners = ["sm90", "sm120"]
paths = ["kernels/rmsnorm.py"]

[[suite]]
id = "parity-mxfp4"
kind = "parity"
command = "pytest tests/kernels/test_mxfp4.py"
runners = ["sm120"]
requires = "cc >= 12.0"
paths = ["kernels/mxfp4.py"]

[[suite]]
id = "decode"
kind = "decode"
command = "python -m engine.decode"
runners = ["sm90"]
pillars = ["topology"]
timeout = 120

[[suite]]
id = "engine-unit"
kind = "unit"
command = "pytest -q tests/engine"
runners = ["cpu"]
symbols = ["engine/**::Attention.*"]

[settings]
run_all = ["pyproject.toml"]
'''

BASE = {
    ".github/drift-audit.toml": CONFIG,
    "pyproject.toml": "[project]\nname='x'\n",
    "README.md": "hello\n",
    "kernels/__init__.py": "",
    "kernels/rmsnorm.py": "def rms(x):\n    return x\n",
    "kernels/mxfp4.py": "def q(x):\n    return x\n",
    "engine/__init__.py": "",
    "engine/model.py": (
        "from kernels.rmsnorm import rms\n\n\nclass Attention:\n    def forward(self, x):\n        return rms(x)\n\n"
        "    def extra(self):\n        return 1\n\n\ndef helper():\n    return 2\n"
    ),
    "engine/util.py": "from . import consts\nVALUE = consts.K\n",
    "engine/consts.py": "K = 1\n",
    "engine/gone.py": "X = 1\n",
    "tests/unit/helpers.py": "from engine.util import VALUE\n",
    "tests/unit/test_model.py": "from engine.model import Attention\n\ndef test_a():\n    assert Attention\n",
    "tests/unit/test_helper_user.py": "from helpers import VALUE\n\ndef test_v():\n    assert VALUE\n",
    "tests/unit/test_gone.py": "from engine.gone import X\n\ndef test_x():\n    assert X\n",
    "tests/unit/test_broken.py": "import engine.consts\ndef test_(:\n",
    "tests/engine/test_engine.py": "import engine.model\n\ndef test_e():\n    assert engine.model.Attention\n",
    "tests/kernels/test_rmsnorm.py": "from kernels.rmsnorm import rms\n\ndef test_r():\n    pass\n",
    "tests/conftest.py": "",
    "tests/fast/conftest.py": "from engine.consts import K\n",
    "tests/fast/test_fast.py": "def test_f():\n    pass\n",
}


def plan_of(repo, base, head, options=None, findings=None):
    options = options or AuditOptions()
    co = checkout(AuditRequest(repo=str(repo.path), base=base, head=head, options=options))
    config = load_config(open_repo(co.repo), co.base_sha)
    changes = build_changeset(co)
    pillars = map_pillars(co, config, changes)
    return select_tests(config, changes, pillars, findings or Findings(), options, Tree(co.repo, co.head_sha), "aid-1")


@pytest.fixture
def repo(git_repo):
    git_repo.base = git_repo.commit_files(BASE, "base")
    return git_repo


def by_id(plan):
    out = {}
    for s in plan.suites:
        out.setdefault(s.id, []).append(s)
    return out


def test_path_glob_selects_suite_once_per_runner_label(repo):
    head = repo.commit_files({"kernels/rmsnorm.py": "def rms(x):\n    return x * 1\n"})
    plan = plan_of(repo, repo.base, head)
    suites = by_id(plan)
    assert [s.runner for s in suites["parity-rmsnorm"]] == ["sm90", "sm120"]
    assert "path 'kernels/rmsnorm.py' matched kernels/rmsnorm.py" in suites["parity-rmsnorm"][0].reasons
    assert "parity-mxfp4" not in suites and "parity-mxfp4" in plan.not_affected
    assert plan.audit_id == "aid-1" and plan.head_sha == head
    # the import graph reaches rmsnorm from the engine tests through engine/model.py
    assert any(r.startswith("imports: tests/engine/test_engine.py → engine/model.py → kernels/rmsnorm.py")
               for r in suites["engine-unit"][0].reasons)
    assert suites["pytest:tests/unit/test_model.py"][0].runner == "cpu"
    assert suites["pytest:tests/unit/test_model.py"][0].kind == "unit"
    # the test file named by the declared suite's command is not planned twice
    assert "pytest:tests/kernels/test_rmsnorm.py" not in suites
    assert any("imports: tests/kernels/test_rmsnorm.py" in r for r in suites["parity-rmsnorm"][0].reasons)
    assert "pytest:tests/unit/test_helper_user.py" not in suites
    assert from_json(Plan, to_json(plan)) == plan


def test_symbol_and_pillar_reasons(repo):
    text = BASE["engine/model.py"].replace("return rms(x)", "return rms(x) + 0")
    plan = plan_of(repo, repo.base, repo.commit_files({"engine/model.py": text}))
    suites = by_id(plan)
    assert "symbol 'engine/**::Attention.*' matched engine/model.py::Attention.forward" in suites["engine-unit"][0].reasons
    assert suites["decode"][0].reasons[0] == "pillar 'topology' touched"
    assert suites["decode"][0].timeout == 120


def test_symbol_outside_pattern_does_not_select(repo):
    text = BASE["engine/model.py"].replace("return 2", "return 3")
    plan = plan_of(repo, repo.base, repo.commit_files({"engine/model.py": text}))
    # helper() is neither in the suite's symbols nor used by any test: importing engine.model is not using it
    assert "engine-unit" not in by_id(plan)
    text = BASE["engine/model.py"].replace("return 1", "return 5")  # inside Attention, which the test uses
    reasons = by_id(plan_of(repo, repo.base, repo.commit_files({"engine/model.py": text})))["engine-unit"][0].reasons
    assert "imports: tests/engine/test_engine.py → engine/model.py" in reasons


def test_relative_and_local_imports_reach_changed_module(repo):
    plan = plan_of(repo, repo.base, repo.commit_files({"engine/consts.py": "K = 2\n"}))
    suites = by_id(plan)
    chain = suites["pytest:tests/unit/test_helper_user.py"][0].reasons
    assert chain == ["imports: tests/unit/test_helper_user.py → tests/unit/helpers.py → engine/util.py → engine/consts.py"]
    # a file that does not parse still has its imports read (tree-sitter fallback)
    assert "pytest:tests/unit/test_broken.py" in suites
    assert "pytest:tests/unit/test_model.py" not in suites
    assert "parity-rmsnorm" not in suites
    # pytest loads conftest.py files without an import statement
    assert suites["pytest:tests/fast/test_fast.py"][0].reasons == [
        "imports: tests/fast/test_fast.py → tests/fast/conftest.py → engine/consts.py"]


def test_deleted_module_selects_its_importers(repo):
    plan = plan_of(repo, repo.base, repo.commit_files({"engine/gone.py": None}))
    assert by_id(plan)["pytest:tests/unit/test_gone.py"][0].reasons == ["imports: tests/unit/test_gone.py → engine/gone.py"]


def test_changed_test_file_selects_itself_only(repo):
    plan = plan_of(repo, repo.base, repo.commit_files({"tests/unit/test_model.py": BASE["tests/unit/test_model.py"] + "\n"}))
    assert [s.id for s in plan.suites] == ["pytest:tests/unit/test_model.py"]
    assert plan.suites[0].reasons == ["changed test file"]
    assert plan.not_affected == ["parity-rmsnorm", "parity-mxfp4", "decode", "engine-unit"]


def test_unrelated_change_selects_nothing(repo):
    plan = plan_of(repo, repo.base, repo.commit_files({"README.md": "bye\n"}))
    assert plan.suites == []
    assert len(plan.not_affected) == 4


def test_run_all_glob_all_flag_and_config_change(repo):
    head = repo.commit_files({"pyproject.toml": "[project]\nname='y'\n"})
    plan = plan_of(repo, repo.base, head)
    assert {s.id for s in plan.suites} >= {"parity-rmsnorm", "parity-mxfp4", "decode", "engine-unit"}
    assert plan.not_affected == []
    assert by_id(plan)["decode"][0].reasons == ["run-all pattern 'pyproject.toml' matched pyproject.toml"]

    head = repo.commit_files({".github/drift-audit.toml": CONFIG + "\n# touched\n"})
    plan = plan_of(repo, head + "~1", head)
    assert by_id(plan)["parity-mxfp4"][0].reasons == [".github/drift-audit.toml changed"]

    head = repo.commit_files({"README.md": "x\n"})
    plan = plan_of(repo, head + "~1", head, AuditOptions(all_suites=True))
    assert len(plan.suites) == 5  # rmsnorm on two labels
    assert all(s.reasons == ["every suite requested (--all)"] for s in plan.suites)


def test_explicit_ids_and_runner_filter(repo):
    head = repo.commit_files({"kernels/rmsnorm.py": "def rms(x):\n    return -x\n"})
    plan = plan_of(repo, repo.base, head, AuditOptions(suites=["parity-mxfp4", "pytest:tests/unit/test_gone.py"]))
    assert [(s.id, s.runner, s.requires) for s in plan.suites] == [
        ("parity-mxfp4", "sm120", "cc >= 12.0"),
        ("pytest:tests/unit/test_gone.py", "cpu", None),
    ]
    assert "parity-rmsnorm" in plan.not_affected
    plan = plan_of(repo, repo.base, head, AuditOptions(runner="sm120"))
    assert [(s.id, s.runner) for s in plan.suites] == [("parity-rmsnorm", "sm120")]
    with pytest.raises(SelectionError, match="unknown suite 'parity-nope'; known suites: decode, engine-unit"):
        plan_of(repo, repo.base, head, AuditOptions(suites=["parity-nope"]))


def test_new_finding_in_suite_paths_selects_it(repo):
    head = repo.commit_files({"README.md": "x\n"})
    finding = Finding(rule="chain", pillar="wiring", severity="error", message="m",
                      locations=[Location("kernels/mxfp4.py", 3)])
    plan = plan_of(repo, repo.base, head, findings=Findings([finding]))
    assert by_id(plan)["parity-mxfp4"][0].reasons == ["new finding 'chain' at kernels/mxfp4.py:3"]
    finding.status = "pre-existing"
    assert plan_of(repo, repo.base, head, findings=Findings([finding])).suites == []


def test_rename_matches_the_old_path(repo):
    repo.git("mv", "kernels/rmsnorm.py", "kernels/norm_old.py")
    plan = plan_of(repo, repo.base, repo.commit_files(
        {"engine/model.py": BASE["engine/model.py"].replace("kernels.rmsnorm", "kernels.norm_old")}))
    assert "path 'kernels/rmsnorm.py' matched kernels/rmsnorm.py" in by_id(plan)["parity-rmsnorm"][0].reasons
