"""Cython mirrors of C++ enums (``cdef enum`` in a .pxd) keep in step with the header they declare."""

from __future__ import annotations

from checks.infer.families import lang_for
from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

OPS = ["EMBED", "MATMUL", "SOFTMAX", "ADD", "RMS_NORM", "ROPE"]


def header(ops: list[str]) -> str:
    rows = "".join(f"  OPK_{op} = {1 + i},\n" for i, op in enumerate(ops))
    return f"#pragma once\nnamespace engine {{\nenum OpKind {{\n  OPK_NONE = 0,\n{rows}}};\n}}\n"


def pxd(ops: list[str], prefix: str = "OPK_") -> str:
    rows = "".join(f"        {prefix}{op} = {1 + i},\n" for i, op in enumerate(ops))
    return ('cdef extern from "engine/ops.h" namespace "engine":\n'
            "    # keep in step with include/engine/ops.h\n"
            f"    cdef enum OpKind:\n        {prefix}NONE = 0,\n{rows}\n"
            "    ctypedef struct Shape:\n        int ndim\n")


def test_cython_files_are_read_for_their_enums():
    assert lang_for("python/engine/_ext/core.pxd") == "cython" and lang_for("core.pyx") == "cython"


def test_an_op_added_to_the_header_but_not_to_the_cython_enum_is_caught(tmp_path):
    r = GitRepo(tmp_path / "mk")
    base = r.commit_files({"include/engine/ops.h": header(OPS), "python/engine/_ext/core.pxd": pxd(OPS)},
                          "six ops, header and Cython")
    both = r.commit_files({"include/engine/ops.h": header(OPS + ["SILU"]),
                           "python/engine/_ext/core.pxd": pxd(OPS + ["SILU"])}, "silu in both")
    assert inferred(audit(r.path, base, both)) == []
    head = r.commit_files({"include/engine/ops.h": header(OPS + ["SILU", "GELU"])}, "gelu in the header only")
    new = inferred(audit(r.path, both, head))
    assert len(new) == 1, [f.message for f in new]
    msg = new[0].message
    assert msg.startswith("`OPK_GELU` is in enum OpKind (include/engine/ops.h:"), msg
    assert "missing from Cython enum OpKind (python/engine/_ext/core.pxd:" in msg, msg


def test_a_cython_enum_whose_members_share_no_prefix_is_no_rule(tmp_path):
    # Without a shared prefix the enum cannot be read apart from the rest of the file at head: no rule, no finding.
    r = GitRepo(tmp_path / "mk")
    base = r.commit_files({"include/engine/ops.h": header(OPS), "python/engine/_ext/core.pxd": pxd(OPS, "")},
                          "six ops")
    head = r.commit_files({"include/engine/ops.h": header(OPS + ["GELU"])}, "gelu in the header only")
    assert inferred(audit(r.path, base, head)) == []
