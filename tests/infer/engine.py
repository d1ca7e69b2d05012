"""A small engine repo whose op registry is written down in three files (C++ enum, C++ name table, Python dict)."""

from __future__ import annotations

OPS = ["add", "mul", "rms_norm", "silu", "softmax"]


def enum_h(ops: list[str]) -> str:
    body = "".join(f"    OP_{o.upper()},\n" for o in ops)
    return f"#pragma once\nenum OpKind {{\n{body}    OP_COUNT,\n}};\n"


def names_cpp(ops: list[str]) -> str:
    rows = "".join(f'    "{o}",\n' for o in ops)
    return f'#include "ops.h"\nstatic const char * OP_NAMES[] = {{\n{rows}}};\n'


def registry_py(ops: list[str]) -> str:
    rows = "".join(f'    "{o}": kernels.{o},\n' for o in ops)
    return f"from engine import kernels\n\nKERNELS = {{\n{rows}}}\n"


def files(ops: list[str] | None = None, registry: list[str] | None = None, names: list[str] | None = None) -> dict:
    ops = ops or OPS
    return {
        "csrc/ops.h": enum_h(ops),
        "csrc/ops.cpp": names_cpp(names if names is not None else ops),
        "engine/registry.py": registry_py(registry if registry is not None else ops),
        "engine/kernels.py": "".join(f"def {o}(x):\n    return x\n\n\n" for o in OPS + ["rope"]),
        "engine/__init__.py": "",
        "tests/test_registry.py": "from engine.registry import KERNELS\n\n\ndef test_all():\n    assert KERNELS\n",
        "README.md": "engine\n",
    }
