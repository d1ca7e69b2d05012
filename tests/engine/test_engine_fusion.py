"""The decode step's fused pieces: shared projection weights, residual adds inside the norms, the decode
projection kernel, the paged-cache write, the latent query written in place; each equals the unfused form."""

from __future__ import annotations

import pytest
import torch

from engine.absorb import absorb_o, absorb_q
from engine.generate import generate
from engine.kv_cache import joined
from engine.loader import load_model
from engine.model import MLP, fused_live
from kernels.harness import format_table, run_spec
from kernels.registry import load_spec


@pytest.mark.parametrize("op", ["linear", "silu_mul_linear", "paged_kv_write", "rmsnorm_rope"])
def test_new_kernel_specs_pass(op, kernel_device):
    rows = run_spec(load_spec(op), kernel_device)
    assert rows and all(r.passed for r in rows), format_table(rows)


def test_loading_fuses_projections_of_one_input_into_views_of_one_weight(tiny_dir):
    model = load_model(tiny_dir, dtype=torch.float32)
    attn = model.decoder_layers[0].self_attn
    assert fused_live(attn.qkv_a, attn.q_a_proj)
    n = attn.q_a_proj.out_features
    assert torch.equal(attn.qkv_a[:n], attn.q_a_proj.weight) and torch.equal(attn.qkv_a[n:], attn.kv_a_proj_with_mqa.weight)
    mlps = [m for m in model.modules() if isinstance(m, MLP)]
    assert mlps and all(fused_live(m.gate_up, m.gate_proj) for m in mlps)
    # the state dict still holds each projection under its own name
    sd = model.state_dict()
    assert sd["model.layers.0.mlp.gate_proj.weight"].shape == mlps[0].gate_proj.weight.shape
    assert "model.layers.0.mlp.gate_up" not in sd


def test_fused_and_unfused_forms_decode_alike(tiny_dir):
    fused = load_model(tiny_dir, dtype=torch.float32)
    plain = load_model(tiny_dir, dtype=torch.float32)
    for m in plain.modules():  # replacing a weight un-fuses: the forward falls back to separate GEMMs
        if isinstance(m, MLP):
            m.gate_proj.weight = torch.nn.Parameter(m.gate_proj.weight.clone(), requires_grad=False)
            assert not fused_live(m.gate_up, m.gate_proj)
    for layer in plain.model.layers:
        layer.self_attn.qkv_a = None
    prompts = [[5, 6, 7, 8], [9, 10]]
    for mla in ("naive", "absorbed"):
        a, b = generate(fused, prompts, 4, mla=mla), generate(plain, prompts, 4, mla=mla)
        assert [g.tokens for g in a] == [g.tokens for g in b]
        assert max(abs(x - y) for ga, gb in zip(a, b) for x, y in zip(ga.margins, gb.margins)) < 1e-4


def test_hidden_states_equal_the_sum_of_the_residual_pair(tiny_dir):
    model = load_model(tiny_dir, dtype=torch.float32)
    tokens = torch.tensor([[3, 4, 5]])
    pos = torch.arange(3).unsqueeze(0)
    model.setup_cache(1, 8)
    h = model.hidden(tokens, pos)
    model.setup_cache(1, 8)
    x = model.model.embed_tokens(tokens)
    cos, sin = model.rope_cos[pos], model.rope_sin[pos]
    for layer in model.decoder_layers:  # the unfused block: x + attn(norm(x)), then + mlp(norm(.))
        x = layer(x, pos, cos, sin)
    assert torch.allclose(h, x, atol=1e-6, rtol=1e-6)


def test_absorbed_query_writes_into_a_strided_slice_and_joins_without_a_copy():
    g = torch.Generator().manual_seed(0)
    q_nope = torch.randn(2, 3, 4, 16, generator=g)
    w_uk = torch.randn(4, 16, 32, generator=g)
    buf = torch.empty(2, 3, 4, 40)
    absorb_q(q_nope, w_uk, out=buf[..., :32])
    want = torch.einsum("...hd,hdc->...hc", q_nope, w_uk)
    assert torch.allclose(buf[..., :32], want, atol=1e-5)
    buf[..., 32:] = 1.0
    j = joined(buf[:, 0, :, :32], buf[:, 0, :, 32:])
    assert j.data_ptr() == buf.data_ptr() and torch.equal(j, buf[:, 0])
    apart = joined(want[:, 0], torch.ones(2, 4, 8))  # separate tensors: concatenated
    assert torch.equal(apart, torch.cat([want[:, 0], torch.ones(2, 4, 8)], -1))
    o_lat = torch.randn(2, 3, 4, 32, generator=g)
    w_uv = torch.randn(4, 16, 32, generator=g)
    o = absorb_o(o_lat, w_uv)
    assert o.is_contiguous() and torch.allclose(o, torch.einsum("...hc,hdc->...hd", o_lat, w_uv), atol=1e-5)
