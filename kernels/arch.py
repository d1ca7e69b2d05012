"""Where a kernel runs decides a few code paths; they are keyed on compute capability, never on a GPU name,
so an untested part (sm120) takes the path its capability supports."""

from __future__ import annotations

import functools
import os

import torch


def interpreting() -> bool:
    """True under the Triton CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def capability(device: torch.device | str | None = None) -> tuple[int, int] | None:
    """Compute capability of a CUDA device, or None on CPU / under the interpreter (cached: it is asked on
    every launch, and decode launches are a few microseconds)."""
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type != "cuda" or interpreting():
        return None
    return _cuda_capability(dev.index if dev.index is not None else -1)


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(None if index < 0 else index)


def fp8_hw_cast(cap: tuple[int, int] | None) -> bool:
    """Whether to cast to e4m3 with the hardware convert (sm89+: Ada, Hopper, Blackwell incl. sm120).

    Older parts have no e4m3 convert, and the interpreter's cast misrounds ties and binade edges (124.9
    becomes 64), so both encode the byte in integer arithmetic instead (``kernels._tl.e4m3_bits``)."""
    return cap is not None and cap >= (8, 9)

