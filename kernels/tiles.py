"""Shared-memory budgets per compute capability, so tile choices for one arch never fail on another.

Triton raises ``OutOfResources`` at launch when a kernel's pipelined tiles exceed the SM's shared memory;
the tile heuristics of the heavy kernels size their pipeline depth against these budgets instead.
"""

from __future__ import annotations

# Max dynamic shared memory per block (opt-in), bytes: sm80 A100, sm86/sm89 Ada, sm90 Hopper,
# sm100 Blackwell datacenter, sm120 Blackwell consumer/workstation.
_SMEM = {(8, 0): 166912, (8, 6): 101376, (8, 7): 166912, (8, 9): 101376, (9, 0): 232448, (10, 0): 232448,
         (12, 0): 101376}


def smem_limit(capability: tuple[int, int] | None) -> int:
    """Bytes of shared memory one program may use; unknown parts get the smallest modern budget."""
    if capability is None:
        return 1 << 30  # the interpreter has no limit
    return _SMEM.get(tuple(capability), 101376)


def fit_stages(stages: int, per_stage: int, capability: tuple[int, int] | None, fixed: int = 0,
               reserve: int = 8192) -> int:
    """The deepest pipeline (≤ ``stages``, ≥ 1) whose ``per_stage`` buffers plus ``fixed`` bytes fit."""
    limit = smem_limit(capability) - reserve - fixed
    while stages > 1 and stages * per_stage > limit:
        stages -= 1
    return stages


def dot_precision(dtype) -> str:
    """``tl.dot``'s ``input_precision`` for operands of ``dtype``: fp32 operands multiply in full fp32
    ("ieee"), so an fp32 model stays an fp32 model (Triton's default would round them to tf32's 10-bit
    mantissa); 16-bit operands are unaffected by the setting."""
    import torch

    return "ieee" if dtype == torch.float32 else "tf32"
