"""DeepSeek's reference Triton FP8 block GEMM design, the anchor the GEMM benchmarks measure against.

One output tile per program, K in 128-wide steps with both block scales applied per step, autotuned over
the configs below; no split-K, no grouping. Written from the design's description.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=st, num_warps=8)
             for bm in (16, 64) for bn in (64, 128) for st in (3, 4)],
    key=["M", "N", "K"],
)
@triton.jit
def _ds_fp8_gemm_kernel(a_ptr, b_ptr, c_ptr, a_s_ptr, b_s_ptr, M, N: tl.constexpr, K: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """DeepSeek's reference design: one tile per program, per-K-step scales, no split-K, no grouping."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    k_blocks = tl.cdiv(K, BLOCK_K)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[None, :] * K + offs_k[:, None]
    a_s_ptrs = a_s_ptr + offs_m * k_blocks
    b_s_ptrs = b_s_ptr + (offs_n // BLOCK_K) * k_blocks
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(k_blocks):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - i * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - i * BLOCK_K, other=0.0)
        a_s = tl.load(a_s_ptrs)
        b_s = tl.load(b_s_ptrs)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
        a_s_ptrs += 1
        b_s_ptrs += 1
    c = acc.to(c_ptr.dtype.element_ty)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], c, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def ds_fp8_gemm(a, a_s, b, b_s, *, interpret: bool = False):
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty(m, n, dtype=torch.bfloat16, device=a.device)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))  # noqa: E731
    if interpret:  # the autotuner needs a GPU driver; the interpreter runs one config of the same program
        _ds_fp8_gemm_kernel.fn[grid](a, b, c, a_s, b_s, m, n, k, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128)
    else:
        _ds_fp8_gemm_kernel[grid](a, b, c, a_s, b_s, m, n, k, BLOCK_K=128)
    return c


def best_config() -> str:
    """The autotuner's pick from the last launch (for the benchmark tables)."""
    return str(getattr(_ds_fp8_gemm_kernel, "best_config", "?"))


# the autotuner's picks on H200 (benchmarks/results/tune_heavy_h200_2026-11-29.txt, 2026-12-01.txt): a
# re-measure pins them instead of autotuning again (8 compiles per shape)
H200_PICKS = {1: (16, 64, 8, 4), 16: (64, 64, 8, 4), 64: (64, 64, 8, 4), 4096: (64, 128, 8, 4)}


def ds_fp8_gemm_pinned(a, a_s, b, b_s, pick: tuple[int, int, int, int]):
    """The same design at one fixed config ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``."""
    m, k = a.shape
    n = b.shape[0]
    bm, bn, warps, stages = pick
    c = torch.empty(m, n, dtype=torch.bfloat16, device=a.device)
    _ds_fp8_gemm_kernel.fn[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        a, b, c, a_s, b_s, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, num_warps=warps, num_stages=stages)
    return c


@triton.jit
def _ds_act_quant_kernel(x_ptr, y_ptr, s_ptr, BLOCK: tl.constexpr):
    """DeepSeek's reference act_quant design: one program per 128-element block."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x)), 1e-4) / 448.0
    tl.store(y_ptr + offs, (x / s).to(y_ptr.dtype.element_ty))
    tl.store(s_ptr + pid, s)


def ds_act_quant(x, y, s):
    """``x`` contiguous with a multiple of 128 elements; ``y`` e4m3 like ``x``, ``s`` one fp32 per block."""
    _ds_act_quant_kernel[(x.numel() // 128,)](x, y, s, BLOCK=128)
