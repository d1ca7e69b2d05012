"""Small launch helpers shared by the row-wise kernels."""

from __future__ import annotations

import torch


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 2-D ``[rows, last]`` view with unit last-dim stride (copying only when no view exists)."""
    if x.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 2:
        return x
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        return x.reshape(-1, x.shape[-1])


def out_rows(out: torch.Tensor | None, shape: torch.Size, dtype: torch.dtype, device: torch.device, name: str = "out"):
    """Validate or allocate an output; returns ``(tensor, 2-D view)``. The view must alias ``out``."""
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=device)
    elif tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise ValueError(
            f"{name} must be {tuple(shape)} {dtype} on {device}, got {tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if out.stride(-1) != 1:
        raise ValueError(f"{name} needs a unit last-dim stride, got strides {out.stride()}")
    view = out if out.dim() == 2 else out.view(-1, shape[-1]) if len(shape) else out
    return out, view
