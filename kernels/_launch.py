"""Small launch helpers shared by the kernels' wrappers."""

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


#: launch options that are not kernel arguments
OPTIONS = ("num_warps", "num_stages", "maxnreg")


def launch(fn, key, grid, pos: tuple, args: dict, cache: dict, **more) -> None:
    """``fn[grid](*pos, **args, **more)``. With a ``key``, later launches under the same key go to the
    compiled kernel directly, skipping Triton's per-call binding and specialisation, which costs more host
    time than a small kernel runs. The key must hold everything specialisation depends on: the launch plan,
    the kernel, the tensors' dtypes and 16-byte alignment, and which integer arguments are 1 or multiples of
    16. Every argument after ``pos`` must be given (defaults included): the direct call takes them all."""
    if key:
        hit = cache.get(key)
        if hit is not None:
            hit[0][(*grid, 1, 1)[:3]](*pos, *hit[1])  # the compiled kernel's runner reads all three grid sizes
            return
    kw = {n: v for n, v in args.items() if n in fn.arg_names or n in OPTIONS}  # the plan's other keys: not fn's
    kw.update(more)
    compiled = fn[grid](*pos, **kw)
    if key and compiled is not None and hasattr(compiled, "__getitem__"):
        cache[key] = (compiled, tuple(kw[n] for n in fn.arg_names[len(pos):]))

