"""Rotary position embedding on INTERLEAVED pairs, with YaRN frequencies (DeepSeek-V3 layout).

Layout: the rope part of q/k is rotated as pairs ``(x[..., 2i], x[..., 2i+1])`` by angle ``pos * freq[i]`` —
DeepSeek's ``inference/model.py`` (``view_as_complex`` on adjacent pairs). HF's ``modeling_deepseek_v3``
first de-interleaves the rope dims (``[0, 2, 4, …, 1, 3, 5, …]``) and then rotates halves
(``rotate_half``); the two agree exactly up to that permutation of the rope dims, which HF checkpoints
already bake into ``q_b_proj``/``kv_a_proj``'s rope rows. ``rope_ref`` implements the DeepSeek
(interleaved) form.
"""

from __future__ import annotations

import math

import torch


def yarn_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN attention-magnitude factor ``0.1·mscale·ln(scale) + 1`` (1 when not extending)."""
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    return dim * math.log(max_pos / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_freqs(
    dim: int,
    max_pos: int,
    theta: float,
    factor: float = 1.0,
    original_max_position_embeddings: int = 4096,
    beta_fast: float = 32,
    beta_slow: float = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` tables ``[max_pos, dim/2]`` fp32 for positions ``0..max_pos-1``.

    Frequencies above ``beta_fast`` rotations over the original context are kept, those below ``beta_slow``
    are divided by ``factor``, and a linear ramp blends between (DeepSeek's ``precompute_freqs_cis`` and
    HF's yarn). The blend applies whenever ``factor != 1``, as HF does from ``rope_scaling``; DeepSeek's
    script applies it only when ``max_seq_len > original_seq_len`` — pass ``factor=1`` to get that.
    Attention magnitude (``yarn_mscale``) is applied to the softmax scale by the caller, not folded in here.
    """
    if dim % 2:
        raise ValueError(f"rope dim must be even, got {dim}")
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if factor != 1.0:
        low = max(math.floor(_correction_dim(beta_fast, dim, theta, original_max_position_embeddings)), 0)
        high = min(math.ceil(_correction_dim(beta_slow, dim, theta, original_max_position_embeddings)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float32), freqs)
    return torch.cos(angles), torch.sin(angles)


def _broadcast_table(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A ``[seq, dim/2]`` table against ``x`` of ``[..., seq, heads, dim]`` (or ``[seq, dim]``)."""
    if t.dim() == 2 and x.dim() >= 3:
        return t.view(t.shape[0], 1, t.shape[1])
    return t


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x``'s last dim; fp32 math, output in ``x.dtype``.

    ``x`` is ``[..., seq, heads, dim]`` (DeepSeek's q_pe ``[b, s, h, 64]``; k_pe with ``heads=1``) or
    ``[seq, dim]``; ``cos``/``sin`` are ``[seq, dim/2]`` rows for those positions (slice the table by
    position first), or any shape already broadcastable to ``x[..., :dim/2]``.
    """
    c = _broadcast_table(cos.float(), x)
    s = _broadcast_table(sin.float(), x)
    xf = x.float()
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    return out.to(x.dtype)
