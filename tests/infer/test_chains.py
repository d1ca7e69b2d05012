"""Comparison chains as families: an ``if``/``||`` chain of ``x == CONST`` is what a function dispatches on,
like its ``case`` labels, so a type a switch and the enum handle but a chain lacks is drift."""

from __future__ import annotations

from checks.infer.families import members
from tests.gitrepo import GitRepo
from tests.infer.audits import audit

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "I32"]


def header(types: list[str]) -> str:
    body = "".join(f"    TYPE_{t},\n" for t in types)
    return f"#pragma once\nenum dtype {{\n{body}    TYPE_COUNT,\n}};\n"


def switch(types: list[str]) -> str:
    cases = "".join(f"        case TYPE_{t}: return {i + 1};\n" for i, t in enumerate(types))
    return f'#include "types.h"\nint type_size(enum dtype t) {{\n    switch (t) {{\n{cases}        default: return 0;\n    }}\n}}\n'


def chain(types: list[str]) -> str:
    """A copy dispatcher: one branch per (source, destination) pair, each type paired with F32."""
    arms = []
    for t in types:
        arms.append(f"if (src->type == TYPE_{t} && dst->type == TYPE_F32) {{\n        return copy_to_f32;\n    }}")
    return ('#include "types.h"\ntypedef void * fn_t;\n'
            "fn_t copy_fn(const struct tensor * src, const struct tensor * dst) {\n    "
            + " else ".join(arms) + "\n    return 0;\n}\n")


def files(enum: list[str], cases: list[str], chained: list[str]) -> dict[str, str]:
    return {"src/types.h": header(enum), "src/size.c": switch(cases), "src/copy.c": chain(chained), "README.md": "x\n"}


def test_a_type_missing_from_a_comparison_chain_is_caught(tmp_path):
    r = GitRepo(tmp_path / "engine")
    base = r.commit_files(files(TYPES, TYPES, TYPES), "Six types")
    head = r.commit_files(files(TYPES + ["Q5_1"], TYPES + ["Q5_1"], TYPES), "Add Q5_1")
    new = audit(r.path, base, head).with_status("new")
    assert len(new) == 1, [f.message for f in new]
    assert new[0].source == "inferred" and "`TYPE_Q5_1` is in enum dtype (src/types.h:9)" in new[0].message and "src/copy.c" in new[0].message


def test_the_type_added_to_the_chain_too_is_quiet(tmp_path):
    r = GitRepo(tmp_path / "engine")
    base = r.commit_files(files(TYPES, TYPES, TYPES), "Six types")
    head = r.commit_files(files(TYPES + ["Q5_1"], TYPES + ["Q5_1"], TYPES + ["Q5_1"]), "Add Q5_1 everywhere")
    found = audit(r.path, base, head)
    assert [f.message for f in found.findings] == []
    assert any("copy_fn" in line for line in found.inferred)  # the chain's invariant was checked, and held


def test_a_few_comparisons_are_a_plain_test_not_a_family():
    few = b"int f(int n, int m) {\n    if (n == LIMIT_A || m == LIMIT_B) return 1;\n    return n == LIMIT_C;\n}\n"
    assert members("c", few) == []
    many = b"int g(int t) {\n    return t == KIND_A || t == KIND_B || t == KIND_C || t == KIND_D || t == 3;\n}\n"
    assert [(k, ctx, key) for k, ctx, key, _, _ in members("c", many)] == [
        ("case", "g", "KIND_A"), ("case", "g", "KIND_B"), ("case", "g", "KIND_C"), ("case", "g", "KIND_D")]


def test_a_switch_that_gains_other_comparisons_keeps_its_labels(tmp_path):
    """Labels are read by the enum prefix they all had at base: new ``arch == ARCH_X`` tests are not types."""
    r = GitRepo(tmp_path / "engine")
    base = r.commit_files(files(TYPES, TYPES, TYPES), "Six types")
    tuned = files(TYPES, TYPES, TYPES)
    tests = " || ".join(f"arch == ARCH_{a}" for a in ("AMPERE", "ADA", "HOPPER", "BLACKWELL"))
    tuned["src/size.c"] = tuned["src/size.c"].replace(
        "int type_size(enum dtype t) {\n", f"int type_size(enum dtype t, int arch) {{\n    if ({tests}) return 8;\n")
    head = r.commit_files(tuned, "Tune per arch")
    found = audit(r.path, base, head)
    assert [f.message for f in found.findings] == []
    assert any("type_size" in line for line in found.inferred)
