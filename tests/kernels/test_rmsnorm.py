"""RMSNorm kernels against their reference, on CPU (interpreter) and, where present, CUDA."""

from __future__ import annotations

import pytest
import torch

from kernels.harness import format_table, run_spec
from kernels.rmsnorm import SPEC, SPEC_RESIDUAL, rmsnorm, rmsnorm_ref
from tests.kernels.interpreter import DEVICES, assert_same


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", [SPEC, SPEC_RESIDUAL], ids=lambda s: s.op)
def test_parity(spec, device):
    rows = run_spec(spec, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


def test_reference_matches_hf_rmsnorm_in_fp32():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

    x = torch.randn(3, 64)
    norm = DeepseekV3RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64) + 0.5)
        torch.testing.assert_close(rmsnorm_ref(x, norm.weight, 1e-6), norm(x), rtol=1e-6, atol=1e-6)


def test_residual_stream_updated_in_place(device):
    x = torch.randn(4, 96, device=device).bfloat16()
    res = torch.randn(4, 96, device=device).bfloat16()
    w = torch.rand(96, device=device).bfloat16()
    want_out, want_h = rmsnorm_ref(x, w, 1e-6, res)
    out, h = rmsnorm(x, w, 1e-6, res, h_out=res)
    assert h is res and torch.equal(res, want_h)
    assert_same(out, want_out, device)


def test_bad_shapes_are_explained():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight must be"):
        rmsnorm(x, torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="out must be"):
        rmsnorm(x, torch.ones(8), 1e-6, out=torch.empty(2, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="residual must match"):
        rmsnorm(x, torch.ones(8), 1e-6, torch.randn(2, 4))
