"""MLA absorption algebra: the latent-space attention equals per-head attention with expanded K and V."""

from __future__ import annotations

import pytest
import torch

from engine.absorb import absorb_o, absorb_q, split_kv_b


def test_absorbed_attention_equals_expanded_attention():
    g = torch.Generator().manual_seed(0)
    h, nope, v, c, t = 3, 8, 6, 10, 7
    kv_b = torch.randn(h * (nope + v), c, generator=g, dtype=torch.float64)
    latent = torch.randn(t, c, generator=g, dtype=torch.float64)
    q_nope = torch.randn(h, nope, generator=g, dtype=torch.float64)
    # expanded: K and V per head from the latent
    kv = (latent @ kv_b.t()).view(t, h, nope + v)
    k, val = kv[..., :nope], kv[..., nope:]
    p = torch.einsum("hd,thd->ht", q_nope, k).softmax(-1)
    expanded = torch.einsum("ht,thd->hd", p, val)
    # absorbed: scores and output in the latent space
    w_uk, w_uv = split_kv_b(kv_b, h, nope, v)
    q_lat = absorb_q(q_nope, w_uk)
    p2 = torch.einsum("hc,tc->ht", q_lat, latent).softmax(-1)
    absorbed = absorb_o(torch.einsum("ht,tc->hc", p2, latent), w_uv)
    torch.testing.assert_close(absorbed, expanded, rtol=1e-12, atol=1e-12)


def test_split_is_per_head_k_then_v():
    h, nope, v, c = 2, 3, 4, 5
    kv_b = torch.arange(h * (nope + v) * c, dtype=torch.float32).view(h * (nope + v), c)
    w_uk, w_uv = split_kv_b(kv_b, h, nope, v)
    assert w_uk.shape == (h, nope, c) and w_uv.shape == (h, v, c)
    assert torch.equal(w_uk[1, 0], kv_b[nope + v])  # head 1 starts after head 0's nope+v rows
    assert torch.equal(w_uv[0, 0], kv_b[nope])


def test_split_rejects_a_mismatched_kv_b():
    with pytest.raises(ValueError, match="kv_b_proj.weight has 30 rows"):
        split_kv_b(torch.zeros(30, 4), 4, 4, 4)
