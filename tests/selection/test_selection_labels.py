"""Implicit test files run where their imports say: triton, torch.cuda or a compiled extension need a GPU label."""

from __future__ import annotations

import time

from checks.config import load_config
from checks.diff import build_changeset
from checks.model import AuditOptions, AuditRequest, Findings
from checks.model import TestPlan as Plan
from checks.pillars import map_pillars
from checks.workspace import Tree, checkout, open_repo
from runner.local import run_plan
from runner.select import select_tests

BASE = {
    "setup.py": "from torch.utils.cpp_extension import CUDAExtension\n"
                "ext = [CUDAExtension(name='fastops', sources=['csrc/ops.cu'])]\n",
    "csrc/ops.cu": "__global__ void k() {}\n",
    "pkg/__init__.py": "",
    "pkg/util.py": "def value():\n    return 1\n",
    "pkg/kern.py": "import triton\n\nfrom pkg.util import value\n\n\ndef launch():\n    return value()\n",
    "ext/__init__.py": "from ext import _C\nfrom pkg.util import value\n",
    "tests/test_plain.py": "from pkg.util import value\n\n\ndef test_v():\n    assert value() == 1\n",
    "tests/test_triton.py": "from pkg.kern import launch\n\n\ndef test_l():\n    assert launch()\n",
    "tests/interp/conftest.py": "import os\n\nos.environ['TRITON_INTERPRET'] = '1'\n",
    "tests/interp/test_interp.py": "from pkg.kern import launch\n\n\ndef test_l():\n    assert launch()\n",
    "tests/test_ext.py": "import ext\n\n\ndef test_e():\n    assert ext.value()\n",
    "tests/test_declared.py": "import fastops\nfrom pkg.util import value\n\n\ndef test_d():\n    assert value()\n",
    "tests/test_cuda.py": "import torch\nfrom pkg.util import value\n\n\ndef test_c():\n"
                          "    assert torch.ones(1).cuda().sum() == value()\n",
    "tests/test_either.py": "import torch\nfrom pkg.util import value\n\nDEV = 'cuda' if torch.cuda.is_available() "
                            "else 'cpu'\n\n\ndef test_e():\n    assert torch.ones(1, device=DEV).sum() == value()\n",
}
SM120_ONLY = '''
[[suite]]
id = "p"
kind = "parity"
command = "python -m p"
runners = ["sm120"]
paths = ["csrc/**"]
'''


def plan_of(git_repo, extra=None):
    base = git_repo.commit_files({**BASE, **(extra or {})}, "base")
    head = git_repo.commit_files({"pkg/util.py": "def value():\n    return 2\n"})
    co = checkout(AuditRequest(repo=str(git_repo.path), base=base, head=head))
    config = load_config(open_repo(co.repo), co.base_sha)
    changes = build_changeset(co)
    return select_tests(config, changes, map_pillars(co, config, changes), Findings(), AuditOptions(),
                        Tree(co.repo, co.head_sha), "aid")


def test_imports_decide_the_runner_label(git_repo):
    plan = plan_of(git_repo)
    got = {s.id.removeprefix("pytest:"): (s.runner, s.reasons[-1]) for s in plan.suites}
    assert got == {
        "tests/interp/test_interp.py": ("cpu", "imports: tests/interp/test_interp.py → pkg/kern.py → pkg/util.py"),
        "tests/test_cuda.py": ("sm90", "runs on sm90 (guessed: no arch in its name or marks; [settings] gpu_runner sets it): tests/test_cuda.py uses CUDA tensors"),
        "tests/test_declared.py": ("sm90", "runs on sm90 (guessed: no arch in its name or marks; [settings] gpu_runner sets it): tests/test_declared.py imports fastops, a compiled extension"),
        "tests/test_either.py": ("cpu", "imports: tests/test_either.py → pkg/util.py"),  # asks is_available()
        "tests/test_ext.py": ("sm90", "runs on sm90 (guessed: no arch in its name or marks; [settings] gpu_runner sets it): ext/__init__.py imports ext._C, a compiled extension"),
        "tests/test_plain.py": ("cpu", "imports: tests/test_plain.py → pkg/util.py"),
        "tests/test_triton.py": ("sm90", "runs on sm90 (guessed: no arch in its name or marks; [settings] gpu_runner sets it): pkg/kern.py imports triton"),
    }


def test_the_gpu_label_follows_the_repo_suites(git_repo):
    plan = plan_of(git_repo, {".github/drift-audit.toml": SM120_ONLY})
    assert {s.runner for s in plan.suites if s.id.startswith("pytest:")} == {"cpu", "sm120"}


def test_the_gpu_runner_setting_wins(git_repo):
    plan = plan_of(git_repo, {".github/drift-audit.toml": SM120_ONLY + '\n[settings]\ngpu_runner = "sm100"\n'})
    assert {s.runner for s in plan.suites if s.id.startswith("pytest:")} == {"cpu", "sm100"}


def test_symbol_selection_off_is_module_level(git_repo):
    plan = plan_of(git_repo, {".github/drift-audit.toml": "[settings]\nsymbol_selection = false\n",
                              "tests/test_unused.py": "import pkg.util\n\n\ndef test_u():\n    pass\n"})
    assert "pytest:tests/test_unused.py" in {s.id for s in plan.suites}  # imports pkg.util, uses nothing of it
    plan = plan_of(git_repo.__class__(git_repo.path.parent / "again"),
                   {"tests/test_unused.py": "import pkg.util\n\n\ndef test_u():\n    pass\n"})
    assert "pytest:tests/test_unused.py" not in {s.id for s in plan.suites}


def test_on_a_cpu_box_gpu_test_files_are_skipped_not_failed(git_repo, tmp_path):
    plan = plan_of(git_repo)
    results = run_plan(Plan(plan.audit_id, plan.head_sha, [s for s in plan.suites if s.runner == "sm90"]),
                       str(tmp_path), capability="cpu")
    assert {(r.outcome, r.reason) for r in results.suites} == {("skipped", "needs sm90")}


def test_an_empty_plan_costs_nothing(tmp_path):
    start = time.perf_counter()
    results = run_plan(Plan("a", "h", []), str(tmp_path))  # capability None would probe the GPU
    assert results.suites == [] and results.devices == []
    assert time.perf_counter() - start < 0.5


ARCH_TESTS = {
    "tests/test_fmha_sm100.py": "import torch\nfrom pkg.util import value\n\n\ndef test_f():\n"
                                "    assert torch.ones(1).cuda().sum() == value()\n",
    "tests/test_marked.py": "import pytest\nimport torch\nfrom pkg.util import value\n\n\n@pytest.mark.sm120\n"
                            "def test_m():\n    assert torch.ones(1).cuda().sum() == value()\n",
    "tests/test_gemm_sm80.py": "import torch\nfrom pkg.util import value\n\n\ndef test_g():\n"
                               "    assert torch.ones(1).cuda().sum() == value()\n",
}


def test_an_arch_in_the_name_or_marks_picks_a_known_label(git_repo):
    plan = plan_of(git_repo, ARCH_TESTS)
    got = {s.id.removeprefix("pytest:"): (s.runner, s.reasons[-1]) for s in plan.suites}
    assert got["tests/test_fmha_sm100.py"] == (
        "sm100", "runs on sm100 (its name says sm100): tests/test_fmha_sm100.py uses CUDA tensors")
    assert got["tests/test_marked.py"] == (
        "sm120", "runs on sm120 (it is marked sm120): tests/test_marked.py uses CUDA tensors")
    # sm80 is no label here (no suite, not standard, not in runner_labels): the default, said to be a guess
    assert got["tests/test_gemm_sm80.py"][0] == "sm90" and "guessed" in got["tests/test_gemm_sm80.py"][1]


def test_a_declared_label_named_by_a_test_file_is_used(git_repo):
    plan = plan_of(git_repo, {**ARCH_TESTS, ".github/drift-audit.toml": '[settings]\nrunner_labels = ["sm80"]\n'})
    got = {s.id.removeprefix("pytest:"): (s.runner, s.reasons[-1]) for s in plan.suites}
    assert got["tests/test_gemm_sm80.py"] == (
        "sm80", "runs on sm80 (its name says sm80): tests/test_gemm_sm80.py uses CUDA tensors")
    assert got["tests/test_cuda.py"][0] == "sm90"


KERNEL_REPO = {
    "kern/__init__.py": "from kern import _C\n\n\ndef gemm(a):\n    return _C.gemm(a)\n",
    "kern/include/gemm.cuh": "template <int N> __device__ void gemm() {}\n",
    "other/__init__.py": "X = 1\n",
    "csrc/gemm.cu": "__global__ void g() {}\n",
    "setup.py": "from torch.utils.cpp_extension import CUDAExtension\n"
                "ext = [CUDAExtension(name='kern._C', sources=['csrc/gemm.cu'])]\n",
    "tests/test_gemm.py": "from kern import gemm\n\n\ndef test_g():\n    assert gemm(1)\n",
    "tests/test_other.py": "from other import X\n\n\ndef test_o():\n    assert X\n",
}


def kernel_plan(git_repo, files):
    base = git_repo.commit_files(KERNEL_REPO, "base")
    head = git_repo.commit_files(files)
    co = checkout(AuditRequest(repo=str(git_repo.path), base=base, head=head))
    config = load_config(open_repo(co.repo), co.base_sha)
    changes = build_changeset(co)
    return select_tests(config, changes, map_pillars(co, config, changes), Findings(), AuditOptions(),
                        Tree(co.repo, co.head_sha), "aid")


def test_a_kernel_only_change_selects_the_tests_of_its_package(git_repo):
    plan = kernel_plan(git_repo, {"csrc/gemm.cu": "__global__ void g() { int x = 1; }\n"})
    assert [(s.id, s.runner) for s in plan.suites] == [("pytest:tests/test_gemm.py", "sm90")]
    assert plan.suites[0].reasons[0] == "kernel source of kern changed: csrc/gemm.cu, run through kern/__init__.py"
    assert plan.suites[0].reasons[-1].endswith("kern/__init__.py imports kern._C, a compiled extension")


def test_a_header_inside_a_package_belongs_to_it(git_repo):
    plan = kernel_plan(git_repo, {"kern/include/gemm.cuh": "template <int N> __device__ void gemm() { }\n"})
    assert [s.id for s in plan.suites] == ["pytest:tests/test_gemm.py"]
    assert plan.suites[0].reasons[0] == (
        "kernel source of kern changed: kern/include/gemm.cuh, run through kern/__init__.py")
