"""Lists that name other things of the tree: build lists naming source files, a package's imports and __all__."""

from __future__ import annotations

from checks.infer.families import lang_for, members
from tests.gitrepo import GitRepo
from tests.infer.audits import audit

OPS = ["norm", "rope", "act", "sampling", "cascade"]


def jit(ops: list[str]) -> str:
    rows = "".join(f'        CSRC / "{op}.cu",\n' for op in ops)
    return f'from pathlib import Path\nCSRC = Path("csrc")\n\ndef gen_ops_module():\n    return build(\n        "ops",\n        [\n{rows}        ],\n    )\n'


def kernels(ops: list[str]) -> dict[str, str | None]:
    return {f"csrc/{op}.cu": f"// {op}\nvoid {op}() {{}}\n" for op in ops}


def test_cmake_files_are_read_for_their_source_lists():
    assert lang_for("CMakeLists.txt") == "cmake" and lang_for("cmake/kernels.cmake") == "cmake"
    got = members("cmake", b'add_library(k SHARED csrc/norm.cu ${DIR}/rope.cu "act.cpp" ${NAME}.cu)\n')
    assert [m[2] for m in got] == ["csrc/norm.cu", "${DIR}/rope.cu", '"act.cpp"'.strip('"')]


def test_a_renamed_kernel_file_still_named_by_the_jit_list_is_caught(tmp_path):
    r = GitRepo(tmp_path / "jit")
    base = r.commit_files({"flashlib/jit/ops.py": jit(OPS), **kernels(OPS)}, "five ops, each a .cu file")
    # Renamed in both places: no finding.
    both = r.commit_files({"csrc/act.cu": None, **kernels(["activation"]),
                           "flashlib/jit/ops.py": jit(["norm", "rope", "activation", "sampling", "cascade"])},
                          "act.cu is activation.cu, and the JIT list says so")
    assert audit(r.path, base, both).findings == []
    # Renamed on disk only: the list names a file that is gone.
    head = r.commit_files({"csrc/rope.cu": None, **kernels(["rotary"])}, "rope.cu is rotary.cu")
    new = [f for f in audit(r.path, both, head).with_status("new") if f.source == "inferred"]
    assert len(new) == 1, [f.message for f in new]
    msg = new[0].message
    assert msg.startswith('"rope.cu" is in the source files flashlib/jit/ops.py names (flashlib/jit/ops.py:'), msg
    assert "but no file of the tree is named so (among the tree's *.cu files)" in msg, msg


def test_cmake_list_naming_a_deleted_file_is_caught(tmp_path):
    r = GitRepo(tmp_path / "cmake")
    cmake = "add_library(kernels SHARED\n" + "".join(f"  csrc/{op}.cu\n" for op in OPS) + ")\n"
    base = r.commit_files({"CMakeLists.txt": cmake, **kernels(OPS)}, "five kernels")
    head = r.commit_files({"csrc/cascade.cu": None}, "drop cascade.cu")
    new = [f for f in audit(r.path, base, head).with_status("new") if f.source == "inferred"]
    assert [f.locations[0].path for f in new] == ["CMakeLists.txt"], [f.message for f in new]
    assert "cascade" in new[0].message


def test_file_names_that_are_not_files_of_the_tree_are_no_rule(tmp_path):
    # A code generator's output names look like a source list, but none of them is in the tree: nothing to keep.
    r = GitRepo(tmp_path / "gen")
    outputs = "OUTPUTS = [" + ", ".join(f'"gen/{op}_kernel.cu"' for op in OPS) + "]\n"
    base = r.commit_files({"tools/generate.py": outputs, "csrc/main.cpp": "int main() {}\n"}, "generator")
    head = r.commit_files({"tools/generate.py": outputs.replace("]", ', "gen/extra_kernel.cu"]'),
                           "csrc/main.cpp": None}, "one more output; main.cpp gone")
    assert [f for f in audit(r.path, base, head).findings if f.source == "inferred"] == []


def init_py(imports: list[str], exported: list[str], extra: str = "") -> str:
    head = "".join(f"from .{n.lower()} import {n}\n" for n in imports)
    return head + extra + "\n__all__ = [\n" + "".join(f'    "{n}",\n' for n in exported) + "]\n"


MODELS = ["GLAModel", "HGRNModel", "RetNetModel", "DeltaNetModel"]


def test_a_name_exported_but_not_imported_by_the_package_is_caught(tmp_path):
    r = GitRepo(tmp_path / "pkg")
    files = {f"fla/models/{m.lower()}.py": f"class {m}:\n    pass\n" for m in MODELS + ["MambaModel"]}
    base = r.commit_files({"fla/models/__init__.py": init_py(MODELS, MODELS), **files}, "four models")
    grown = MODELS + ["MambaModel"]
    head = r.commit_files({"fla/models/__init__.py": init_py(MODELS, grown)}, "export MambaModel")
    new = [f for f in audit(r.path, base, head).with_status("new") if f.source == "inferred"]
    assert len(new) == 1, [f.message for f in new]
    assert new[0].message.startswith('"MambaModel" is in __all__ of fla/models/__init__.py'), new[0].message
    assert "missing from the names fla/models/__init__.py imports from its package" in new[0].message


def test_imports_from_other_packages_and_private_names_are_not_exports(tmp_path):
    # The __init__ imports torch helpers and a private one: those are no exports; __all__ matched the rest at base,
    # so a new third-party import is no drift.
    r = GitRepo(tmp_path / "pkg")
    extra = "from typing import Optional\nfrom ._utils import _helper\n"
    files = {f"fla/models/{m.lower()}.py": f"class {m}:\n    pass\n" for m in MODELS}
    base = r.commit_files({"fla/models/__init__.py": init_py(MODELS, MODELS, extra), **files}, "four models")
    head = r.commit_files({"fla/models/__init__.py": init_py(MODELS, MODELS, extra + "from torch import nn\n")},
                          "torch import")
    assert [f for f in audit(r.path, base, head).findings if f.source == "inferred"] == []


def test_a_two_file_jit_spec_is_a_rule_and_a_half_missing_one_is_not(tmp_path):
    spec = 'def gen_norm():\n    return spec("norm", [CSRC / "norm.cu", CSRC / "norm_binding.cu"])\n'
    odd = 'def gen_act():\n    return spec("act", [CSRC / "act.cu", CSRC / "act_generated.cu"])\n'  # one built at JIT time
    r = GitRepo(tmp_path / "small")
    base = r.commit_files({"lib/jit/norm.py": spec, "lib/jit/act.py": odd, **kernels(["norm", "norm_binding", "act"])},
                          "two specs")
    head = r.commit_files({"csrc/norm_binding.cu": None, "csrc/act.cu": None, **kernels(["binding_norm", "activation"])},
                          "rename two kernels")
    new = [f for f in audit(r.path, base, head).with_status("new") if f.source == "inferred"]
    assert [f.locations[0].path for f in new] == ["lib/jit/norm.py"], [f.message for f in new]
    assert new[0].message.startswith('"norm_binding.cu" is in the source files lib/jit/norm.py names'), new[0].message


def test_init_proposes_source_list_rules_that_parse_back(tmp_path):
    # A CMake list is a regex fact, a JIT list a tree-sitter one, the tree's files a path fact: init writes all three.
    from checks.config import parse_config
    from checks.infer_cli import propose
    from checks.workspace import Tree

    r = GitRepo(tmp_path / "cmake")
    cmake = "add_library(kernels SHARED\n" + "".join(f"  csrc/{op}.cu\n" for op in OPS) + ")\n"
    base = r.commit_files({"CMakeLists.txt": cmake, "lib/jit/ops.py": jit(OPS), **kernels(OPS)}, "five kernels")
    text, _ = propose(Tree(str(r.path), base))
    config = parse_config(text, "proposed")
    assert any(f.lang == "path" for f in config.facts)
    assert any(f.lang == "regex" and f.files == ["CMakeLists.txt"] for f in config.facts), text
    head = r.commit_files({"csrc/cascade.cu": None}, "drop cascade.cu")
    new = [f for f in audit(r.path, base, head).with_status("new") if f.source == "inferred"]
    assert sorted(f.locations[0].path for f in new) == ["CMakeLists.txt", "lib/jit/ops.py"], [f.message for f in new]
