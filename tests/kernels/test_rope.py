"""RoPE: YaRN tables against HF, the interleaved layout against DeepSeek's and HF's forms, kernel parity."""

from __future__ import annotations

import pytest
import torch

from kernels.harness import format_table, run_spec
from kernels.rope import SPEC, rope, rope_ref, yarn_freqs, yarn_mscale
from tests.kernels.interpreter import DEVICES, assert_same


@pytest.mark.parametrize("device", DEVICES)
def test_parity(device):
    rows = run_spec(SPEC, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


def _hf_inv_freq(factor: float):
    from transformers import PretrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = PretrainedConfig()
    cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim = 7168, 128, 64
    cfg.max_position_embeddings = 163840
    cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": factor,
                           "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                           "mscale": 1.0, "mscale_all_dim": 1.0}
    return ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")[0]


def test_yarn_frequencies_match_hf():
    cos, sin = yarn_freqs(64, 3, 10000.0, 40.0, 4096, 32, 1)
    torch.testing.assert_close(torch.atan2(sin[1], cos[1]), _hf_inv_freq(40.0), rtol=1e-6, atol=1e-9)
    assert cos.shape == (3, 32) and cos.dtype == torch.float32
    assert yarn_mscale(40.0, 1.0) == pytest.approx(0.1 * torch.log(torch.tensor(40.0)).item() + 1)
    assert yarn_mscale(1.0, 1.0) == 1.0


def test_reference_is_deepseeks_complex_rotation():
    x = torch.randn(2, 5, 3, 64)
    cos, sin = yarn_freqs(64, 5, 10000.0, 40.0)
    fc = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos)).view(1, 5, 1, 32)
    want = torch.view_as_real(torch.view_as_complex(x.view(2, 5, 3, 32, 2)) * fc).flatten(3)
    torch.testing.assert_close(rope_ref(x, cos, sin), want, rtol=1e-5, atol=1e-5)


def test_hf_form_is_the_same_up_to_the_rope_dim_permutation():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    q, k = torch.randn(1, 4, 6, 64), torch.randn(1, 1, 6, 64)  # HF: [b, heads, seq, dim]
    cos, sin = yarn_freqs(64, 6, 10000.0, 40.0)
    hq, hk = apply_rotary_pos_emb_interleave(q, k, torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])
    ours_q = rope_ref(q.transpose(1, 2), cos, sin).transpose(1, 2)
    ours_k = rope_ref(k.transpose(1, 2), cos, sin).transpose(1, 2)
    perm = torch.cat([torch.arange(0, 64, 2), torch.arange(1, 64, 2)])
    torch.testing.assert_close(ours_q[..., perm], hq)
    torch.testing.assert_close(ours_q @ ours_k.transpose(-1, -2), hq @ hk.transpose(-1, -2))


def test_in_place_on_a_q_pe_slice_leaves_the_nope_part_alone(device):
    q = torch.randn(2, 3, 4, 192, device=device).bfloat16()
    nope = q[..., :128].clone()
    cos, sin = (t.to(device) for t in yarn_freqs(64, 3, 10000.0, 40.0))
    want = rope_ref(q[..., 128:], cos, sin)
    rope(q[..., 128:], cos, sin, inplace=True)
    assert torch.equal(q[..., :128], nope)
    assert_same(q[..., 128:], want, device)


def test_bad_inputs_are_explained():
    cos, sin = yarn_freqs(64, 4, 10000.0)
    with pytest.raises(ValueError, match="cos/sin must be"):
        rope(torch.randn(4, 1, 32), cos, sin)
    with pytest.raises(ValueError, match="slice the table or pass positions"):
        rope(torch.randn(1, 9, 1, 64), cos, sin)
    with pytest.raises(ValueError, match="positions must be"):
        rope(torch.randn(2, 1, 1, 64), cos, sin, positions=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="unit last-dim stride"):
        rope(torch.randn(4, 1, 128)[..., ::2], cos, sin, inplace=True)


def test_takes_tables_broadcast_the_way_the_reference_does(device):
    """The engine's op table calls ``rope`` with the reference's arguments: ``cos[pos].unsqueeze(2)``."""
    x = torch.randn(2, 3, 4, 64, device=device).bfloat16()
    cos, sin = (t.to(device) for t in yarn_freqs(64, 50, 10000.0, 40.0))
    pos = torch.tensor([[7, 8, 9], [0, 31, 49]], device=device)
    c4, s4 = cos[pos].unsqueeze(2), sin[pos].unsqueeze(2)
    assert_same(rope(x, c4, s4), rope_ref(x, c4, s4), device)
    assert_same(rope(x, cos, sin, positions=pos), rope_ref(x, c4, s4), device)
    with pytest.raises(ValueError, match="must be"):
        rope(x, cos[pos].unsqueeze(2).expand(2, 3, 4, 32), sin[pos].unsqueeze(2).expand(2, 3, 4, 32))
