"""Op dispatch: torch resolves to the kernels/ references; triton by naming convention, with clear errors."""

from __future__ import annotations

import pytest
import torch

from engine import ops
from engine.ops import OPS, OpSet, OpUnavailable


def test_torch_backend_uses_the_kernels_references():
    import kernels.rmsnorm
    import kernels.routing

    s = OpSet("torch")
    assert s.rmsnorm is kernels.rmsnorm.rmsnorm_ref
    assert s.moe_route is kernels.routing.noaux_tc_ref
    assert set(s.resolve_all().values()) == {"torch"}  # every op has a torch reference


def test_triton_backend_follows_the_naming_convention(monkeypatch):
    import kernels.rmsnorm

    s = OpSet({"rmsnorm": "triton"})
    assert s.rmsnorm is kernels.rmsnorm.rmsnorm
    assert s.backend_of("rope") == "torch" and s.backend_of("rmsnorm") == "triton"


def test_missing_triton_op_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(OPS, "frobnicate", ("kernels.rmsnorm", "frobnicate_ref"))
    with pytest.raises(OpUnavailable, match=r"op 'frobnicate' has no triton implementation yet: "
                                            r"kernels/rmsnorm.py defines no 'frobnicate'"):
        _ = OpSet("triton").frobnicate
    monkeypatch.setitem(OPS, "ghost", ("kernels.no_such_module", "ghost_ref"))
    with pytest.raises(OpUnavailable, match="kernels/no_such_module.py defines no 'ghost_ref'"):
        _ = OpSet("torch").ghost


def test_bad_backend_names_are_rejected():
    with pytest.raises(OpUnavailable, match="backend for op 'rope' is 'cuda'"):
        _ = OpSet("cuda").rope
    with pytest.raises(OpUnavailable, match="unknown op.*rmsnrom"):
        OpSet({"rmsnrom": "triton"})


def test_model_routes_its_hot_ops_through_the_table(tiny_dir, monkeypatch):
    """A model built with an op map calls whatever the table resolved, for every op it uses."""
    from engine.generate import generate
    from engine.loader import load_model

    called: dict[str, int] = {}
    real = ops._lookup

    def counting(op, backend):
        fn = real(op, backend)

        def wrapped(*a, **k):
            called[op] = called.get(op, 0) + 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(ops, "_lookup", counting)
    model = load_model(tiny_dir, dtype=torch.float32)
    generate(model, [[3, 4, 5]], 3, mla="absorbed")
    assert {"rmsnorm", "rope", "linear", "silu_mul_linear", "moe_route", "moe_experts", "mla_decode"} <= set(called)


def test_engine_and_kernels_import_only_what_the_gpu_image_has():
    """A GPU runner has torch/triton/safetensors but not cattrs, GitPython, tree-sitter or PyGithub."""
    import subprocess
    import sys

    code = ("import sys, engine.model, engine.loader, engine.generate, engine.golden, engine.tiny, engine.sharding;"
            "from engine.ops import OpSet; OpSet('torch').resolve_all();"
            "bad = [m for m in ('cattrs', 'git', 'tree_sitter', 'github', 'checks', 'bot', 'runner') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
