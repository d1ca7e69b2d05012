"""A dispatch switch inside a list that has only a name or two more keeps the names it shares with it."""

from __future__ import annotations

from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

TYPES = ["F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K"]


def switch(fn: str, types: list[str]) -> str:
    cases = "".join(f"        case TYPE_{t}:\n" for t in types)
    return (f"void {fn}(int type, const void * x, float * y) {{\n    switch (type) {{\n{cases}"
            f"            {fn}_impl(type, x, y);\n            break;\n        default:\n            abort();\n    }}\n}}\n")


def repo(tmp_path, small: list[str], big: list[str]):
    r = GitRepo(tmp_path / "backends")
    base = r.commit_files({"src/riscv/ime.cpp": switch("ime_mul_mat", small),
                           "src/cuda/convert.cu": switch("cuda_to_fp16", big)}, "two backends")
    return r, base


def test_a_switch_dropping_a_type_its_closest_sibling_keeps_is_caught(tmp_path):
    r, base = repo(tmp_path, TYPES, TYPES + ["BF16"])
    head = r.commit_files({"src/riscv/ime.cpp": switch("ime_mul_mat", [t for t in TYPES if t != "Q5_0"])},
                          "drop Q5_0 from the riscv dispatch")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    msg = new[0].message
    assert msg.startswith("`TYPE_Q5_0` is in case labels in cuda_to_fp16 (src/cuda/convert.cu:"), msg
    assert "missing from case labels in ime_mul_mat (src/riscv/ime.cpp:" in msg
    assert "which had only TYPE_BF16 besides" in msg, msg


def test_the_sibling_growing_or_both_dropping_a_type_is_no_drift(tmp_path):
    r, base = repo(tmp_path, TYPES, TYPES + ["BF16"])
    grown = r.commit_files({"src/cuda/convert.cu": switch("cuda_to_fp16", TYPES + ["BF16", "IQ4_NL"])}, "cuda: IQ4_NL")
    assert inferred(audit(r.path, base, grown)) == []
    fewer = [t for t in TYPES if t != "Q5_1"]
    both = r.commit_files({"src/riscv/ime.cpp": switch("ime_mul_mat", fewer),
                           "src/cuda/convert.cu": switch("cuda_to_fp16", fewer + ["BF16"])}, "Q5_1 gone everywhere")
    assert inferred(audit(r.path, base, both)) == []


def test_a_switch_inside_a_much_bigger_list_may_shrink(tmp_path):
    # Four names more than the switch: the switch is a subset by chance, not the list less a recorded extra or two.
    r, base = repo(tmp_path, TYPES, TYPES + ["BF16", "IQ4_NL", "IQ4_XS", "MXFP4"])
    head = r.commit_files({"src/riscv/ime.cpp": switch("ime_mul_mat", [t for t in TYPES if t != "Q5_0"])},
                          "drop Q5_0 from the riscv dispatch")
    assert inferred(audit(r.path, base, head)) == []


def test_a_feature_predicate_may_drop_a_type(tmp_path):
    # Every case returns true: a list of supported features, which a backend may narrow (a reorder path disabled).
    def predicate(fn: str, types: list[str]) -> str:
        cases = "".join(f"        case TYPE_{t}:\n" for t in types)
        return f"bool {fn}(int type) {{\n    switch (type) {{\n{cases}            return true;\n        default:\n            return false;\n    }}\n}}\n"

    r = GitRepo(tmp_path / "predicates")
    base = r.commit_files({"src/riscv/ime.cpp": predicate("ime_supports", TYPES),
                           "src/cuda/convert.cu": predicate("cuda_supports", TYPES + ["BF16"])}, "two predicates")
    head = r.commit_files({"src/riscv/ime.cpp": predicate("ime_supports", [t for t in TYPES if t != "Q5_0"])},
                          "riscv: no Q5_0 reorder")
    assert inferred(audit(r.path, base, head)) == []


def test_sibling_tables_of_one_file_may_drop_an_entry(tmp_path):
    # Two per-arch tuning switches in one file: one dropping a type (falling back to the default) is a tuning choice.
    r = GitRepo(tmp_path / "tuning")
    both = switch("max_batch_rdna4", TYPES) + switch("max_batch_pascal", TYPES + ["BF16"])
    base = r.commit_files({"src/cuda/mmvq.cu": both}, "two tuning tables")
    fewer = switch("max_batch_rdna4", [t for t in TYPES if t != "Q5_0"]) + switch("max_batch_pascal", TYPES + ["BF16"])
    head = r.commit_files({"src/cuda/mmvq.cu": fewer}, "rdna4: Q5_0 falls back to the default")
    assert inferred(audit(r.path, base, head)) == []
