"""Parity metrics. Each compares an output with its reference and names the worst element, so a failure
says where and by how much, not just that it failed. Only torch is imported (runs on the GPU image)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Measure:
    value: float
    worst_index: tuple[int, ...] | None = None
    worst_value: float | None = None
    ref_value: float | None = None
    note: str = ""


def _index(flat_idx: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat_idx % dim)
        flat_idx //= dim
    return tuple(reversed(idx))


def _pair(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: output {tuple(out.shape)} vs reference {tuple(ref.shape)}")
    return out.detach().to(torch.float64), ref.detach().to(torch.float64)


def _worst(err: torch.Tensor, o: torch.Tensor, r: torch.Tensor, shape: torch.Size) -> Measure:
    if err.numel() == 0:
        return Measure(0.0)
    flat = int(torch.argmax(err.reshape(-1)))
    return Measure(float(err.reshape(-1)[flat]), _index(flat, shape), float(o.reshape(-1)[flat]), float(r.reshape(-1)[flat]))


def max_abs(out: torch.Tensor, ref: torch.Tensor) -> Measure:
    """``max |out − ref|``; equal infinities count as zero error."""
    o, r = _pair(out, ref)
    err = (o - r).abs()
    err = torch.where(o == r, torch.zeros_like(err), err)
    return _worst(err, o, r, out.shape)


def max_rel(out: torch.Tensor, ref: torch.Tensor, floor: float = 1e-6) -> Measure:
    """``max |out − ref| / max(|ref|, floor)``; the floor keeps near-zero references from dominating."""
    o, r = _pair(out, ref)
    err = (o - r).abs() / r.abs().clamp_min(floor)
    err = torch.where(o == r, torch.zeros_like(err), err)
    return _worst(err, o, r, out.shape)


def allclose(out: torch.Tensor, ref: torch.Tensor, atol: float = 0.0, rtol: float = 0.0) -> Measure:
    """``max |out − ref| / (atol + rtol·|ref|)``: passes at ≤ 1, like ``torch.allclose`` with a margin."""
    o, r = _pair(out, ref)
    err = (o - r).abs() / (atol + rtol * r.abs()).clamp_min(1e-300)
    err = torch.where(o == r, torch.zeros_like(err), err)
    return _worst(err, o, r, out.shape)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if t.dtype.is_floating_point:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.view(width).to(torch.int64)
    return t.to(torch.int64)


def bit_exact(out: torch.Tensor, ref: torch.Tensor) -> Measure:
    """Number of elements whose bits differ (+0 and −0 differ; pass needs 0)."""
    if out.shape != ref.shape or out.dtype != ref.dtype:
        raise ValueError(
            f"bit-exact needs equal shape and dtype: output {tuple(out.shape)} {out.dtype} vs "
            f"reference {tuple(ref.shape)} {ref.dtype}"
        )
    diff = _bits(out) != _bits(ref)
    n = int(diff.sum())
    if n == 0:
        return Measure(0.0)
    flat = int(torch.nonzero(diff.reshape(-1))[0])
    o, r = out.detach().reshape(-1)[flat], ref.detach().reshape(-1)[flat]
    return Measure(float(n), _index(flat, out.shape), float(o.float()), float(r.float()), note=f"{n} of {out.numel()} differ; first shown")


def gemm_diff(out: torch.Tensor, ref: torch.Tensor) -> Measure:
    """DeepGEMM's ``1 − 2Σxy / Σ(x² + y²)`` in fp64 (FlashMLA's tests call the same quantity cos_diff):
    0 when equal, scale-aware, sensitive to both angle and magnitude."""
    o, r = _pair(out, ref)
    denom = float((o * o + r * r).sum())
    value = 1.0 - 2.0 * float((o * r).sum()) / max(denom, 1e-300) if denom > 0 else 0.0
    m = _worst((o - r).abs(), o, r, out.shape)
    return Measure(value, m.worst_index, m.worst_value, m.ref_value, note="worst element by |out − ref|")


def cos_diff(out: torch.Tensor, ref: torch.Tensor) -> Measure:
    """``1 − cos∠(out, ref)`` over the flattened tensors in fp64 (angle only, magnitude-blind)."""
    o, r = _pair(out, ref)
    no, nr = float(o.norm()), float(r.norm())
    value = 0.0 if no == nr == 0 else 1.0 - float((o * r).sum()) / max(no * nr, 1e-300)
    m = _worst((o - r).abs(), o, r, out.shape)
    return Measure(value, m.worst_index, m.worst_value, m.ref_value, note="worst element by |out − ref|")


def lse_abs(out: torch.Tensor, ref: torch.Tensor) -> Measure:
    """Max abs error of log-sum-exp values; rows that are −inf in both (empty) count as exact."""
    return max_abs(out, ref)


METRICS: dict[str, Callable[..., Measure]] = {
    "max_abs": max_abs,
    "max_rel": max_rel,
    "allclose": allclose,
    "bit_exact": bit_exact,
    "gemm_diff": gemm_diff,
    "cos_diff": cos_diff,
    "lse_abs": lse_abs,
}


def first_nan(t: torch.Tensor) -> tuple[int, ...] | None:
    """Index of the first NaN in ``t`` (fp8 included), or None."""
    if not t.dtype.is_floating_point or t.numel() == 0:
        return None
    mask = torch.isnan(t.detach().float())
    if not bool(mask.any()):
        return None
    return _index(int(torch.nonzero(mask.reshape(-1))[0]), t.shape)
