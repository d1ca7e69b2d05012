"""Metal shader libraries: kernels named for the host (``[[host_name("...")]]``) in sibling groups that keep in step."""

from __future__ import annotations

from checks.infer.families import lang_for
from tests.gitrepo import GitRepo
from tests.infer.audits import audit

TYPES = ["f32", "f16", "q4_0", "q4_1", "q8_0"]


def metal(mm: list[str], mm_id: list[str]) -> str:
    out = ["#include <metal_stdlib>\nusing namespace metal;\n\ntypedef decltype(kernel_mul_mm<half>) mul_mm_t;\n"]
    out += [f'template [[host_name("kernel_mul_mm_{t}_f32")]] kernel mul_mm_t kernel_mul_mm<block_{t}>;\n' for t in mm]
    out += [f'template [[host_name("kernel_mul_mm_id_{t}_f32")]] kernel mul_mm_id kernel_mul_mm_id<block_{t}>;\n'
            for t in mm_id]
    out.append('\n[[host_name("kernel_add")]]\nkernel void kernel_add(device const float * a [[buffer(0)]]) {\n}\n')
    return "".join(out)


def test_metal_is_read_as_cpp_by_inference():
    assert lang_for("src/ggml-metal/ggml-metal.metal") == "cpp" and lang_for("a/b.py") == "python"
    assert lang_for("README.md") is None


def test_a_kernel_instantiated_for_mul_mm_but_not_for_mul_mm_id_is_caught(tmp_path):
    r = GitRepo(tmp_path / "metal")
    base = r.commit_files({"src/ggml-metal.metal": metal(TYPES, TYPES)}, "mm and mm_id for five types")
    both = r.commit_files({"src/ggml-metal.metal": metal(TYPES + ["q1_0"], TYPES + ["q1_0"])}, "q1_0 in both")
    assert audit(r.path, base, both).findings == []
    head = r.commit_files({"src/ggml-metal.metal": metal(TYPES + ["q1_0", "q5_0"], TYPES + ["q1_0"])}, "q5_0, mm only")
    new = audit(r.path, both, head).with_status("new")
    assert len(new) == 1, [f.message for f in new]
    msg = new[0].message
    assert msg.startswith('"kernel_mul_mm_q5_0_f32" is in kernels named kernel_mul_mm_* (other than kernel_mul_mm_id_*) '
                          "(src/ggml-metal.metal:"), msg
    assert "missing from kernels named kernel_mul_mm_id_*" in msg
    assert 'there "kernel_mul_mm_f32_f32" is written "kernel_mul_mm_id_f32_f32"' in msg


def test_nested_kernel_groups_that_merely_look_alike_are_not_a_rule(tmp_path):
    # kernel_mul_mm_iq2_* and kernel_mul_mm_iq3_* share names by chance (s, xxs): a new iq3 variant is no drift.
    iq = ["iq2_s", "iq2_xs", "iq2_xxs", "iq3_s", "iq3_xxs"]
    r = GitRepo(tmp_path / "metal")
    types = TYPES + iq
    body = "".join(f'template [[host_name("kernel_mul_mm_{t}_{o}")]] kernel mul_mm_t kernel_mul_mm<block_{t}>;\n'
                   for t in types for o in ("f32", "f16"))
    base = r.commit_files({"src/ggml-metal.metal": body}, "mm kernels")
    grown = body + "".join(f'template [[host_name("kernel_mul_mm_iq3_m_{o}")]] kernel mul_mm_t kernel_mul_mm<x>;\n'
                           for o in ("f32", "f16"))
    head = r.commit_files({"src/ggml-metal.metal": grown}, "iq3_m kernels")
    assert audit(r.path, base, head).findings == []
