"""MLA weight absorption: attention computed in the kv_lora latent space instead of per-head K and V.

``kv_b_proj`` maps the normalised latent ``c[kv_lora]`` to per-head ``k_nope`` and ``v``. Its rows are, per
head, ``qk_nope_head_dim`` rows of W_UK followed by ``v_head_dim`` rows of W_UV. Then
``q_nope · k_nope = (W_UK^T q_nope) · c`` (absorbed q) and ``Σ p v = W_UV (Σ p c)`` (absorbed o), so the
cache holds only ``c`` and the rope key: kv_lora_rank + qk_rope_head_dim numbers per token, shared by
all heads — the layout FlashMLA and vLLM's decode use.
"""

from __future__ import annotations

import torch


def split_kv_b(kv_b_weight: torch.Tensor, n_heads: int, qk_nope_head_dim: int, v_head_dim: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``kv_b_proj.weight[H*(nope+v), C]`` → ``(W_UK[H, nope, C], W_UV[H, v, C])`` (views, no copy)."""
    rows, c = kv_b_weight.shape
    per_head = qk_nope_head_dim + v_head_dim
    if rows != n_heads * per_head:
        raise ValueError(
            f"kv_b_proj.weight has {rows} rows; expected n_heads*(qk_nope_head_dim+v_head_dim) = "
            f"{n_heads}*({qk_nope_head_dim}+{v_head_dim}) = {n_heads * per_head}"
        )
    w = kv_b_weight.view(n_heads, per_head, c)
    return w[:, :qk_nope_head_dim], w[:, qk_nope_head_dim:]


def absorb_q(q_nope: torch.Tensor, w_uk: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``q_nope[..., H, nope]`` → latent query ``[..., H, C]`` (``W_UK^T q`` per head): one batched GEMM over
    heads, written into ``out`` when given (it may be a strided slice, e.g. the latent part of the query
    the decode kernel reads)."""
    h, d = q_nope.shape[-2:]
    c = w_uk.shape[-1]
    if out is None:
        out = torch.empty(*q_nope.shape[:-1], c, dtype=q_nope.dtype, device=q_nope.device)
    torch.bmm(q_nope.reshape(-1, h, d).transpose(0, 1), w_uk, out=out.view(-1, h, c).transpose(0, 1))
    return out


def absorb_o(o_latent: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """Attention output in latent space ``[..., H, C]`` → per-head values ``[..., H, v]`` (contiguous, so the
    heads flatten into o_proj's input without a copy)."""
    h, c = o_latent.shape[-2:]
    v = w_uv.shape[1]
    out = torch.empty(*o_latent.shape[:-1], v, dtype=o_latent.dtype, device=o_latent.device)
    torch.bmm(o_latent.reshape(-1, h, c).transpose(0, 1), w_uv.transpose(1, 2), out=out.view(-1, h, v).transpose(0, 1))
    return out
