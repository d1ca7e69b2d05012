"""SiLU·mul (the SwiGLU gate of an MLP), optionally fused with block FP8 activation quantisation."""

from __future__ import annotations

import torch


def silu_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """``x = [gate | up]`` on the last dim; ``silu(gate) * up`` in fp32, returned in ``x.dtype``."""
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
