"""A change made only of code for one arch (``flash_fwd_sm100.py``) runs its GPU tests on that arch's label."""

from __future__ import annotations

from tests.selection.plans import plan_for

REPO = {
    "attn/__init__.py": "",
    "attn/fwd_sm100.py": "def fwd(x):\n    return x + 1\n",
    "attn/fwd_sm90.py": "def fwd(x):\n    return x + 2\n",
    "attn/interface.py": "from attn import fwd_sm90, fwd_sm100\n\n\ndef run(x, arch):\n"
                         "    return (fwd_sm100 if arch >= 100 else fwd_sm90).fwd(x)\n",
    "tests/test_attn.py": "import torch\nfrom attn.interface import run\n\n\ndef test_run():\n"
                          "    assert run(torch.ones(1).cuda(), 90)\n",
}


def runners(git_repo, files):
    base = git_repo.commit_files(REPO, "base")
    head = git_repo.commit_files(files)
    plan = plan_for(git_repo.path, base, head)
    return {s.id.removeprefix("pytest:"): (s.runner, s.reasons[-1]) for s in plan.suites}


def test_code_for_one_arch_runs_its_tests_there(git_repo):
    got = runners(git_repo, {"attn/fwd_sm100.py": "def fwd(x):\n    return x + 3\n"})
    assert got == {"tests/test_attn.py": (
        "sm100", "runs on sm100 (the change is only sm100 code: attn/fwd_sm100.py): "
                 "tests/test_attn.py uses CUDA tensors")}


def test_code_for_several_archs_keeps_the_default_label(git_repo):
    got = runners(git_repo, {"attn/fwd_sm100.py": "def fwd(x):\n    return x + 3\n",
                             "attn/fwd_sm90.py": "def fwd(x):\n    return x + 4\n"})
    assert got["tests/test_attn.py"][0] == "sm90" and "guessed" in got["tests/test_attn.py"][1]
