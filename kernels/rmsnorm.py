"""RMSNorm and fused residual-add + RMSNorm: fp32 math, activations in and out in their own dtype."""

from __future__ import annotations

import torch


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """The oracle. With ``residual``, ``h = x + residual`` is summed in fp32 and stored in ``x.dtype``;
    the norm then reads that stored ``h`` (so the fused op equals add-then-norm on what the next layer sees)
    and ``(out, h)`` is returned."""
    if residual is not None:
        h = (x.float() + residual.float()).to(x.dtype)
        return rmsnorm_ref(h, weight, eps), h
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(var + eps) * weight.float()).to(x.dtype)
