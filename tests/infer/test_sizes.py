"""Sizes a kernel's switch dispatches on, against the sizes the Python front end accepts (same subject)."""

from __future__ import annotations

from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred


def kernel(dims: list[int], subject: str = "params.head_dim") -> str:
    cases = "".join(f"    case {d}:\n      run_fwd<{d}>(params, stream);\n      break;\n" for d in dims)
    return (f"void run_mha_fwd(Params& params, cudaStream_t stream) {{\n  switch ({subject}) {{\n{cases}"
            "    default:\n      throw std::runtime_error(\"unsupported\");\n  }\n}\n")


def frontend(dims: list[int], name: str = "head_dim") -> str:
    return (f"def check(q):\n    {name} = q.shape[-1]\n    if {name} not in ({', '.join(map(str, dims))}):\n"
            f"        raise ValueError({name})\n    return {name}\n")


def test_the_front_end_accepting_a_size_the_kernel_does_not_dispatch_is_caught(tmp_path):
    r = GitRepo(tmp_path / "attn")
    base = r.commit_files({"csrc/fwd.cu": kernel([64, 128, 256]), "attn/interface.py": frontend([64, 128, 256])},
                          "three head dims")
    head = r.commit_files({"attn/interface.py": frontend([64, 128, 192, 256])}, "accept 192")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    msg = new[0].message
    assert msg.startswith("`192` is in sizes head_dim is tested against (attn/interface.py:"), msg
    assert "missing from sizes switch (params.head_dim) in run_mha_fwd dispatches (csrc/fwd.cu:" in msg, msg
    # The kernel may lead: a size it dispatches that Python does not accept yet is no drift.
    lead = r.commit_files({"csrc/fwd.cu": kernel([64, 128, 192, 256]), "attn/interface.py": frontend([64, 128, 256])},
                          "kernel: 192")
    assert inferred(audit(r.path, base, lead)) == []


def test_sizes_of_another_subject_or_small_numbers_hold_no_belief(tmp_path):
    r = GitRepo(tmp_path / "attn")
    # The same numbers, about different things (a block size; a switch over a one-letter field).
    base = r.commit_files({"csrc/fwd.cu": kernel([64, 128, 256], subject="params.d"),
                           "attn/interface.py": frontend([64, 128, 256], name="block_size"),
                           "attn/split.py": frontend([1, 2, 4, 8], name="num_splits"),
                           "csrc/split.cu": kernel([1, 2, 4, 8], subject="num_splits")}, "sizes")
    head = r.commit_files({"attn/interface.py": frontend([64, 128, 192, 256], name="block_size"),
                           "attn/split.py": frontend([1, 2, 4, 8, 16], name="num_splits")}, "more")
    assert inferred(audit(r.path, base, head)) == []
