"""Compiled code followed by name to the Python that calls it, on real git repos with no config.

A changed C/C++ function is followed to its callers across the project's sources, up to the pybind11 binding
that names it for Python (``m.def("scale", &scale)``); only Python code spelling that name runs it. What
cannot be told that way (a struct in a header, a function handed out as a value) keeps the package-wide
answer. A sub-project (its own setup.py and package beside the tree's) owns the sources under it.
"""

from __future__ import annotations

from tests.selection.plans import plan_for, selected_reasons

REPO = {
    "setup.py": "from torch.utils.cpp_extension import CUDAExtension\n"
                "ext = [CUDAExtension(name='pk_ext', sources=['csrc/kern.cu', 'csrc/api.cpp', 'csrc/bind.cpp'])]\n"
                "packages = ['pk']\n",
    "csrc/kern.h": "struct Params {\n  int n;\n};\nvoid scale_impl(float* x);\n",
    "csrc/kern.cu": "#include \"kern.h\"\n\nvoid scale_impl(float* x) {\n  x[0] *= 2;\n}\n\n"
                    "void other_impl(float* x) {\n  x[0] += 1;\n}\n",
    "csrc/api.cpp": "#include \"kern.h\"\n\nvoid scale(float* x) {\n  scale_impl(x);\n}\n\n"
                    "void other(float* x) {\n  other_impl(x);\n}\n",
    "csrc/bind.cpp": "PYBIND11_MODULE(pk_ext, m) {\n  m.def(\"scale\", &scale);\n  m.def(\"other\", &other);\n}\n",
    "pk/__init__.py": "",
    "pk/ops.py": "import pk_ext\n\n\ndef scale(x):\n    return pk_ext.scale(x)\n\n\ndef other(x):\n"
                 "    return pk_ext.other(x)\n",
    "tests/test_scale.py": "from pk.ops import scale\n\n\ndef test_s():\n    assert scale(1)\n",
    "tests/test_other.py": "from pk.ops import other\n\n\ndef test_o():\n    assert other(1)\n",
    "tests/test_plain.py": "import pk\n\n\ndef test_p():\n    assert pk\n",
}


def selected(git_repo, files, tree=REPO):
    return selected_reasons(git_repo, tree, files)


def test_a_changed_function_reaches_the_python_spelling_its_binding(git_repo):
    got = selected(git_repo, {"csrc/kern.cu": REPO["csrc/kern.cu"].replace("x[0] *= 2", "x[0] *= 3")})
    assert sorted(got) == ["tests/test_scale.py"]
    assert "bound for Python as scale" in got["tests/test_scale.py"]


def test_a_prototype_added_to_a_header_is_followed_like_its_function(git_repo):
    got = selected(git_repo, {"csrc/kern.h": REPO["csrc/kern.h"] + "void other_impl(float* x);\n",
                              "csrc/kern.cu": REPO["csrc/kern.cu"].replace("x[0] += 1", "x[0] += 2")})
    assert sorted(got) == ["tests/test_other.py"]


def test_a_struct_changed_in_a_header_keeps_the_package_wide_answer(git_repo):
    # every user of the extension, as without following names
    got = selected(git_repo, {"csrc/kern.h": REPO["csrc/kern.h"].replace("int n;", "long n;")})
    assert sorted(got) == ["tests/test_other.py", "tests/test_scale.py"]


def test_a_function_handed_out_as_a_value_keeps_the_package_wide_answer(git_repo):
    tree = {**REPO, "csrc/table.cpp": "#include \"kern.h\"\n\nstatic void (*kTable[])(float*) = {&scale_impl};\n"}
    got = selected(git_repo, {"csrc/kern.cu": REPO["csrc/kern.cu"].replace("x[0] *= 2", "x[0] *= 3")}, tree)
    assert sorted(got) == ["tests/test_other.py", "tests/test_scale.py"]


SUBK = {**REPO, "sub/setup.py": "from setuptools import setup\nsetup(name='subk', packages=['subk'])\n",
        "sub/subk/__init__.py": ""}  # a sub-project whose build file names one package


def test_a_sub_projects_sources_run_through_its_own_package(git_repo):
    tree = {**SUBK, "sub/subk/ffi.py": "def run(x):\n    return x\n",
            "sub/csrc/moe.cu": "void moe(float* x) {\n  x[0] = 1;\n}\n",
            "sub/test/test_moe.py": "import subk.ffi as ffi\n\n\ndef test_m():\n    assert ffi.run(1)\n"}
    got = selected(git_repo, {"sub/csrc/moe.cu": "void moe(float* x) {\n  x[0] = 2;\n}\n"}, tree)
    assert sorted(got) == ["sub/test/test_moe.py"]


def test_a_comment_in_compiled_sources_runs_nothing(git_repo):
    got = selected(git_repo, {"csrc/kern.cu": "// Copyright 2026\n" + REPO["csrc/kern.cu"],
                              "csrc/kern.h": "/* Copyright 2026 */\n" + REPO["csrc/kern.h"]})
    assert got == {}


def test_a_sub_project_brings_only_the_packages_its_build_files_name(git_repo):
    tree = {**SUBK, "sub/utils/__init__.py": "def run(x):\n    return x\n",
            "tools/utils.py": "def run(x):\n    return x\n",
            "tools/test_tool.py": "import utils\n\n\ndef test_t():\n    assert utils.run(1)\n"}
    got = selected(git_repo, {"sub/utils/__init__.py": "def run(x):\n    return x + 1\n"}, tree)
    assert got == {}  # "import utils" in tools/ is tools/utils.py, not the sub-project's utils


SUB = {**REPO, "sub/setup.py": "from setuptools import setup\nsetup(name='kk', packages=['kk'], package_dir={'kk': 'python'})\n",
       "sub/python/__init__.py": "", "sub/python/loader.py": "def load(x):\n    return x\n\n\ndef other():\n    return 0\n",
       "sub/ops/amx_moe.hpp": "inline int amx_moe(int x) {\n  return x;\n}\n",
       "sub/test/test_load.py": "from kk.loader import load\n\n\ndef test_l():\n    assert load(1) == 1\n"}


def test_a_sub_projects_package_dir_maps_its_imports(git_repo):
    got = selected(git_repo, {"sub/python/loader.py": SUB["sub/python/loader.py"].replace("return x", "return x + 0")},
                   SUB)
    assert sorted(got) == ["sub/test/test_load.py"]


def test_cpu_kernel_sources_alone_run_their_tests_without_a_gpu(git_repo):
    base = git_repo.commit_files(SUB, "base")
    head = git_repo.commit_files({"sub/ops/amx_moe.hpp": SUB["sub/ops/amx_moe.hpp"].replace("return x;", "return x + 1;")})
    plan = plan_for(git_repo.path, base, head)
    assert [(s.id, s.runner) for s in plan.suites] == [("pytest:sub/test/test_load.py", "cpu")]
