"""Fewer kernels per decode step, same results: the projections of one block input run as one GEMM over
views of one weight buffer, and what every layer computes alike from positions is made once per forward."""

from __future__ import annotations

import torch
from torch import nn

from engine.v4.compressor import Step
from engine.v4.generate import V4Decoder
from engine.v4.layers import Linear, linears_on


def _linears(*outs: int, dtype=torch.float32) -> list[Linear]:
    g = torch.Generator().manual_seed(0)
    mods = []
    for n in outs:
        m = Linear(16, n, dtype)
        with torch.no_grad():
            m.weight.copy_(torch.randn(n, 16, generator=g))
        mods.append(m)
    return mods


def test_linears_on_is_each_linear_and_keeps_one_weight_copy():
    mods = _linears(5, 3, 8)
    x = torch.randn(2, 4, 16)
    want = [m(x) for m in mods]
    got = linears_on(x, mods)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    buf = mods[0].__dict__["_fused_with"][0]
    assert buf.shape == (16, 16)
    ptrs = [m.weight.data_ptr() for m in mods]  # row blocks of the one buffer, in order
    assert ptrs == [buf.data_ptr(), buf[5:].data_ptr(), buf[8:].data_ptr()]
    assert all(isinstance(m.weight, nn.Parameter) and m.weight.shape == (n, 16) for m, n in zip(mods, (5, 3, 8)))


def test_linears_on_sees_a_replaced_or_reloaded_weight():
    mods = _linears(4, 4)
    x = torch.randn(3, 16)
    linears_on(x, mods)
    with torch.no_grad():
        mods[1].weight.mul_(2)  # loading into the parameter writes the buffer
    torch.testing.assert_close(linears_on(x, mods)[1], mods[1](x))
    mods[0].weight = nn.Parameter(torch.zeros(4, 16), requires_grad=False)  # a new tensor: rebuilt
    assert torch.equal(linears_on(x, mods)[0], torch.zeros(3, 4))


def test_linears_on_leaves_fp8_weights_on_their_own_path():
    mods = _linears(4, 4, 4)
    from engine.tiny import quantize_fp8

    q, s = quantize_fp8(mods[1].weight.detach())
    mods[1].weight = nn.Parameter(q, requires_grad=False)
    mods[1].weight_scale_inv = s
    x = torch.randn(2, 16)
    for g, w in zip(linears_on(x, mods), [m(x) for m in mods], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    assert "_fused_with" in mods[0].__dict__ and len(mods[0].__dict__["_fused_with"][1]) == 2


def test_position_work_is_made_once_per_forward_and_shared_by_the_layers(v4_model, v4_prompts, monkeypatch):
    made: list[tuple] = []
    asked: list[tuple] = []
    real = Step.once

    def spy(self, key, make):
        asked.append(key)

        def counted():
            made.append(key)
            return make()
        return real(self, key, counted)

    monkeypatch.setattr(Step, "once", spy)
    dec = V4Decoder(v4_model, len(v4_prompts), max(map(len, v4_prompts)) + 2, graphs=False)
    dec.generate(v4_prompts, 1)  # the prefill
    assert len(made) == len(set(made))  # each key made once in the forward
    n = v4_model.cfg.num_hidden_layers
    assert asked.count(("window_mask", v4_model.cfg.sliding_window)) == n
    made.clear()
    asked.clear()
    dec.step()  # a decode step: the ring indices of each rate too
    assert len(made) == len(set(made))
    csa = v4_model.cfg.compress_rates["compressed_sparse_attention"]
    ring = [k for k in made if k[:2] == ("ring", csa) and len(k) == 3]
    # the CSA layers' compressors and indexers (four caches here) share one set of ring indices
    assert len(ring) == 1 and asked.count(ring[0]) == 2 * v4_model.cfg.layer_types.count("compressed_sparse_attention")
    assert asked.count(("window", v4_model.cfg.sliding_window)) == n
