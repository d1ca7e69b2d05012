"""SiLU·mul and its fused FP8 quantisation."""

from __future__ import annotations

import pytest
import torch

from kernels.fp8_quant import act_quant
from kernels.harness import format_table, run_spec
from kernels.silu_mul import SPEC, SPEC_QUANT, silu_mul, silu_mul_quant, silu_mul_ref
from tests.kernels.interpreter import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", [SPEC, SPEC_QUANT], ids=lambda s: s.op)
def test_parity(spec, device):
    rows = run_spec(spec, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


@pytest.mark.parametrize("ue8m0", [False, True])
def test_fused_quant_equals_the_unfused_kernels_bit_for_bit(ue8m0, device):
    x = (torch.randn(3, 2 * 400, device=device) * 3).bfloat16()
    q, s = silu_mul_quant(x, ue8m0=ue8m0)
    q2, s2 = act_quant(silu_mul(x), ue8m0=ue8m0)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)


def test_reference_matches_hf_mlp_gate():
    from transformers.activations import ACT2FN

    x = torch.randn(4, 2 * 48)
    gate, up = x.chunk(2, -1)
    torch.testing.assert_close(silu_mul_ref(x), ACT2FN["silu"](gate) * up)


def test_odd_width_is_rejected():
    with pytest.raises(ValueError, match="gate \\| up"):
        silu_mul(torch.randn(2, 7))
