"""Block FP8 (e4m3) activation quantisation, its inverse, and 128×128 block weight dequantisation."""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
AMAX_FLOOR = 1e-4  # keeps an all-zero block from producing a zero scale


def _blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """View the last dim as ``[n_blocks, block]``, zero-padding a partial last block."""
    k = x.shape[-1]
    nb = -(-k // block)
    pad = nb * block - k
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], nb, block), k


def act_quant_ref(x: torch.Tensor, block: int = 128, ue8m0: bool = False):
    """Per-(1×block) e4m3 quantisation of the last dim: ``scale = max(amax, 1e-4) / 448`` (rounded up to a
    power of two with ``ue8m0``), ``q = x / scale``. Returns ``(q, scale)`` with ``scale`` fp32
    ``[..., ceil(K/block)]``; a partial last block takes its amax over its own elements only."""
    xb, k = _blocks(x.float(), block)
    amax = xb.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    scale = amax / FP8_MAX
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (xb / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    q = q.reshape(*x.shape[:-1], -1)[..., :k].to(torch.float8_e4m3fn)
    return q, scale


def act_dequant_ref(q: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`act_quant_ref`: the block size is inferred from ``scale``'s last dim."""
    k = q.shape[-1]
    block = -(-k // scale.shape[-1])
    s = scale.float().repeat_interleave(block, dim=-1)[..., :k]
    return (q.float() * s).to(out_dtype)


def weight_dequant_ref(
    w: torch.Tensor, scale_inv: torch.Tensor, block: int = 128, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``w[N, K]`` (fp8) times its ``weight_scale_inv[ceil(N/block), ceil(K/block)]``, block by block.
    Edge blocks may be partial (shapes need not be multiples of ``block``)."""
    n, k = w.shape
    s = scale_inv.float().repeat_interleave(block, dim=0)[:n].repeat_interleave(block, dim=1)[:, :k]
    return (w.float() * s).to(out_dtype)
