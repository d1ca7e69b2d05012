"""A kernel-source change selects the tests that run the compiled code, on real git repos with no config.

The code runs through the modules that load the package's compiled extension (every name using that
binding) or, for a JIT header, through the code that names the source file. A test that only imports a
pure-Python part of the package (a gate, a DSL kernel) is not selected, though importing the package runs
its ``__init__`` (which loads the extension and sets it up).
"""

from __future__ import annotations

from tests.selection.plans import selected_reasons

REPO = {
    "setup.py": "from torch.utils.cpp_extension import CUDAExtension\n"
                "ext = [CUDAExtension(name='ep._C', sources=['csrc/api.cu'])]\n",
    "csrc/api.cu": "__global__ void dispatch() {}\n",
    "ep/include/ep/impls/combine.cuh": "__device__ void combine() {}\n",
    "ep/include/ep/impls/dispatch.cuh": "__device__ void dispatch() {}\n",
    "ep/__init__.py": "def init_jit():\n    from ep import _C\n    _C.init_jit('include')\n\n\ninit_jit()\n\n"
                      "from ep.buffer import Buffer\nfrom ep.jit import combine\n",
    "ep/buffer.py": "import ep._C as _C\n\n\nclass Buffer:\n    def dispatch(self, x):\n"
                    "        return _C.dispatch(x)\n",
    "ep/jit.py": "def combine(x):\n    src = '#include <ep/impls/combine.cuh>'\n    return compile_and_run(src, x)\n\n\n"
                 "def compile_and_run(src, x):\n    return x\n",
    "ep/gate.py": "def scores(n):\n    return [0] * n\n",
    "tests/test_buffer.py": "import ep\n\n\ndef test_b():\n    assert ep.Buffer().dispatch(1)\n",
    "tests/test_combine.py": "from ep import combine\n\n\ndef test_c():\n    assert combine(1)\n",
    "tests/test_gate.py": "from ep.gate import scores\n\n\ndef test_g():\n    assert scores(2) == [0, 0]\n",
}


def selected(git_repo, files, tree=REPO):
    return selected_reasons(git_repo, tree, files)


def test_compiled_code_runs_through_the_extension_users_not_every_importer(git_repo):
    got = selected(git_repo, {"csrc/api.cu": "__global__ void dispatch() { int x = 1; }\n"})
    # test_gate imports ep (its __init__ loads _C and calls init_jit) but runs no kernel; test_combine's
    # path never touches _C either
    assert sorted(got) == ["tests/test_buffer.py"]
    assert got["tests/test_buffer.py"].startswith("kernel source of ep changed: csrc/api.cu, run through ep/")


def test_a_jit_header_runs_through_the_code_that_names_it(git_repo):
    got = selected(git_repo, {"ep/include/ep/impls/combine.cuh": "__device__ void combine() { int y; }\n"})
    # the extension's users may compile it too (a C++ JIT names it): Buffer; ep.jit.combine names it itself
    assert sorted(got) == ["tests/test_buffer.py", "tests/test_combine.py"]
    assert got["tests/test_combine.py"].startswith(
        "kernel source of ep changed: ep/include/ep/impls/combine.cuh, run through ep/")


def test_without_an_extension_user_every_importer_of_the_package_counts(git_repo):
    tree = {**REPO, "ep/buffer.py": "class Buffer:\n    def dispatch(self, x):\n        return x\n",
            "ep/__init__.py": "from ep.buffer import Buffer\nfrom ep.jit import combine\n",
            "ep/jit.py": "def combine(x):\n    return x\n"}
    got = selected(git_repo, {"csrc/api.cu": "__global__ void dispatch() { int x = 2; }\n"}, tree)
    assert sorted(got) == ["tests/test_buffer.py", "tests/test_combine.py", "tests/test_gate.py"]


def test_with_no_narrower_path_the_prs_own_tests_stand_for_a_package_every_test_imports(git_repo):
    # more importers than OWN_TESTS_ABOVE (a compiler, a runtime): the PR's own test stands for them
    tree = {**REPO, "ep/buffer.py": "class Buffer:\n    def dispatch(self, x):\n        return x\n",
            "ep/__init__.py": "from ep.buffer import Buffer\nfrom ep.jit import combine\n",
            "ep/jit.py": "def combine(x):\n    return x\n",
            **{f"tests/test_many_{i}.py": "import ep\n\n\ndef test_m():\n    assert ep\n" for i in range(20)}}
    got = selected(git_repo, {"csrc/api.cu": "__global__ void dispatch() { int x = 2; }\n",
                              "tests/test_buffer.py": "import ep\n\n\ndef test_b():\n    assert ep.Buffer().dispatch(2)\n"},
                   tree)
    assert sorted(got) == ["tests/test_buffer.py"]


def test_with_no_narrower_path_a_package_few_tests_import_runs_them_all(git_repo):
    tree = {**REPO, "ep/buffer.py": "class Buffer:\n    def dispatch(self, x):\n        return x\n",
            "ep/__init__.py": "from ep.buffer import Buffer\nfrom ep.jit import combine\n",
            "ep/jit.py": "def combine(x):\n    return x\n"}
    got = selected(git_repo, {"csrc/api.cu": "__global__ void dispatch() { int x = 2; }\n",
                              "tests/test_buffer.py": "import ep\n\n\ndef test_b():\n    assert ep.Buffer().dispatch(2)\n"},
                   tree)
    assert sorted(got) == ["tests/test_buffer.py", "tests/test_combine.py", "tests/test_gate.py"], got


def test_a_source_of_one_part_runs_through_that_parts_module(git_repo):
    tree = {**REPO, "csrc/legacy/intranode.cu": "__global__ void k() {}\n",
            "csrc/elastic/dispatch.cu": "__global__ void d() {}\n",
            "ep/buffers/__init__.py": "",
            "ep/buffers/legacy.py": "import ep._C as _C\n\n\nclass Legacy:\n    def run(self, x):\n"
                                    "        return _C.intranode(x)\n",
            "ep/buffers/elastic.py": "import ep._C as _C\n\n\nclass Elastic:\n    def run(self, x):\n"
                                     "        return _C.dispatch(x)\n",
            "tests/test_legacy.py": "from ep.buffers.legacy import Legacy\n\n\ndef test_l():\n    assert Legacy().run(1)\n",
            "tests/test_elastic.py": "from ep.buffers.elastic import Elastic\n\n\ndef test_e():\n"
                                     "    assert Elastic().run(1)\n"}
    got = selected(git_repo, {"csrc/legacy/intranode.cu": "__global__ void k() { int z; }\n"}, tree)
    assert sorted(got) == ["tests/test_legacy.py"]
