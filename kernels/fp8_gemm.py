"""Block-scaled FP8 GEMM (w8a8): ``C[M, N] = A[M, K] · B[N, K]ᵀ`` in bf16.

A carries one fp32 scale per 1×128 block of a row (``act_quant``), B one per 128×128 block
(``weight_scale_inv``). Each 128-wide K step is a native fp8 dot whose fp32 partial is multiplied by
``a_s ⊗ b_s`` before it joins the fp32 accumulator, so scales never have to be folded into fp8 values.

Two shapes matter and want different tiles:
- decode (M ≤ 64) is a weight stream: small M tiles, and split-K so that enough programs are in flight
  to pull the whole of B through HBM at full rate; fp32 partials are summed by a second tiny kernel.
- prefill is compute-bound: large M×N tiles, grouped ordering for L2 reuse, deep software pipelining.

Two kernels share the math. The static-shape one (``GemmConfig.plain``, every default) compiles N, K and
the K trip count in and indexes row-major operands with 32-bit offsets; it is the fast one. The general
one takes any strides and 64-bit offsets, for views and operands past 2³¹ elements.

Tiles are keyed on compute capability (:func:`gemm_config`). On sm90 Triton lowers ``tl.dot`` to wgmma,
elsewhere to mma, so the sm120 path differs only in tile sizes and pipeline depth (it has ~100 KB of shared
memory, not 228 KB). A third kernel (``GemmConfig.tma``) is persistent and takes its A and B tiles through
TMA tensor descriptors, optionally warp-specialised: the Hopper features Triton 3.x exposes, swept against
the static-shape kernel in benchmarks/tune_heavy.py.
Devices without fp8 tensor cores (cc < 8.9) upcast the operands to bf16 inside the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels._tl import cast_rne
from kernels.arch import capability, interpreting
from kernels.harness import Case, Check, ParitySpec
from kernels.tiles import fit_stages

BLOCK = 128  # quantisation block, both for activations (1×128) and weights (128×128)


def fp8_gemm_ref(
    a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Dequantise both operands to fp32, multiply in fp32, return ``[M, N]`` in ``out_dtype``.

    ``a[M, K]`` fp8 with ``a_s[M, ceil(K/128)]``; ``b[N, K]`` fp8 with ``b_s[ceil(N/128), ceil(K/128)]``.
    """
    from kernels.fp8_quant import weight_dequant_ref

    _check(a, a_s, b, b_s)
    k = a.shape[1]
    af = a.float() * a_s.float().repeat_interleave(BLOCK, dim=1)[:, :k]
    bf = weight_dequant_ref(b, b_s, block=BLOCK)
    return (af @ bf.t()).to(out_dtype)


def quant_weight_blocks(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``w[..., N, K]`` → (e4m3 weight, fp32 ``scale_inv[..., ceil(N/block), ceil(K/block)]``), one scale per
    block: ``amax/448``, the layout of DeepSeek-V3's FP8 checkpoints. Edge blocks may be partial."""
    *lead, n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    wp = torch.nn.functional.pad(w.float(), (0, kb * block - k, 0, nb * block - n))
    wp = wp.reshape(*lead, nb, block, kb, block)
    s = wp.abs().amax(dim=(-3, -1)).clamp_min(1e-4) / 448.0
    q = (wp / s[..., :, None, :, None]).clamp(-448.0, 448.0).reshape(*lead, nb * block, kb * block)
    return q[..., :n, :k].to(torch.float8_e4m3fn).contiguous(), s


def _check(a, a_s, b, b_s) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"fp8_gemm wants 2-D operands, got a{tuple(a.shape)} b{tuple(b.shape)}")
    m, k = a.shape
    n, kb = b.shape
    if k != kb:
        raise ValueError(f"fp8_gemm: K differs, a is [{m}, {k}] and b is [{n}, {kb}]")
    kblk, nblk = -(-k // BLOCK), -(-n // BLOCK)
    if tuple(a_s.shape) != (m, kblk):
        raise ValueError(f"fp8_gemm: a_s must be [{m}, {kblk}] (one scale per 1x128 block), got {tuple(a_s.shape)}")
    if tuple(b_s.shape) != (nblk, kblk):
        raise ValueError(
            f"fp8_gemm: b_s must be [{nblk}, {kblk}] (one scale per 128x128 block), got {tuple(b_s.shape)}"
        )


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    split_k: int
    group_m: int  # row-tiles per group in program order; 0: M fastest (static-shape kernel; the general one reads 1)
    num_warps: int
    num_stages: int
    k_pair: bool = False  # issue two K steps' dots before promoting either (two MMAs in flight)
    fused_reduce: bool = False  # split-K: the last program of a tile sums the partials (one launch, not two)
    plain: bool = False  # the static-shape kernel (N, K and the K trip count compiled in; contiguous operands)
    tma: bool = False  # the persistent kernel fed by TMA tensor descriptors (sm90+; contiguous operands)
    warp_spec: bool = False  # tma only: warp-specialised persistent loop (producer/consumer warps), no split-K
    pdl: bool = False  # sm90+: programmatic dependent launch (the prologue overlaps the previous kernel's tail)
    prefetch: int = 0  # with pdl: weight K-blocks per program pulled into L2 before waiting on the previous kernel
    n_sub: int = 1  # tma only: the tile's dot as n_sub column slices, so one slice's promotion overlaps the next's MMA
    tma_store: bool = False  # tma only, no split-K: the bf16 tile leaves through a TMA store (async, no masks)
    k_unroll: int = 1  # plain only: K-blocks per loop trip (each row's weight read KU·128 bytes at a time)


def gemm_config(m: int, n: int, k: int, capability: tuple[int, int] | None, num_sms: int = 132) -> GemmConfig:
    """Tiles for an ``M×N×K`` problem on a device of ``capability`` (``None``: the CPU interpreter).

    Measured on H200 (benchmarks/tune_heavy.py, every candidate parity-checked in the same run), all on the
    static-shape kernel, which alone ran 64×128 tiles at 758 TFLOPS where the general one ran 337:
    - prefill: 128×128 tiles, 8 warps, 4 stages, grouped by 8 rows: 852 TFLOPS at 4096×7168×7168 (DeepSeek's
      design 682). Fewer tiles than SMs (short prompts, narrow N) take 64×128 with 4 warps (775 TFLOPS);
    - M ≤ 16: 16×128 tiles, split-K to about two waves, partials summed by a second kernel: 18.0 µs at M=1,
      19.0 µs at M=16 (N=K=7168; DeepSeek's design 24.2 / 25.1 µs);
    - 16 < M ≤ 64: 64×64 tiles so every row shares one read of the weight, split-K to two waves: 22.8 µs at
      M=64 (DeepSeek's design 25.4 µs).
    Pipeline depth is fitted to the part's shared memory (sm90 228 KB, sm120 ~99 KB).
    """
    if capability is None:  # interpreter: smallest legal tiles keep CPU runs quick
        return GemmConfig(16, 32, 2 if m <= 64 and k >= 2 * BLOCK else 1, 1, 4, 1, plain=True)
    kblocks = triton.cdiv(k, BLOCK)
    if m <= 16:
        bm, bn, group, warps, stages = 16, 128, 0, 4, 4
    elif m <= 64:
        bm, bn, group, warps, stages = 64, 64, 0, 4, 4
    elif triton.cdiv(m, 128) * triton.cdiv(n, 128) >= num_sms:
        bm, bn, group, warps, stages = 128, 128, 8, 8, 4
    else:
        bm, bn, group, warps, stages = 64, 128, 0, 4, 3
    split = 1
    if m <= 64:
        tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
        while tiles * split * 2 <= 2 * num_sms and split * 2 <= kblocks // 4:
            split *= 2
    stages = fit_stages(stages, (bm + bn) * BLOCK, capability)
    # sm90, full waves of 128x128 tiles: the persistent TMA kernel, warp-specialised, its bf16 tiles leaving
    # through TMA stores (H200, 4096x7168x7168: 959 TFLOPS against 930 with plain stores in the same run,
    # 855 for the static-shape kernel and 1254 for cuBLAS per-tensor _scaled_mm)
    tma = capability[0] == 9 and (bm, bn) == (128, 128)
    # decode shapes on sm90+: programmatic dependent launch, so each launch's prologue overlaps the tail of
    # the kernel before it (H200, CUDA graph of 20 calls: M=1 17.8 -> 16.8 us, M=16 18.8 -> 18.4 us); pulling
    # the first weight K-blocks into L2 before the wait measured slower (17.4 us with 4 blocks, 20.9 with all)
    pdl = m <= 64 and capability >= (9, 0)
    # 16 < M <= 64 on sm90: two K-blocks per loop trip, 3 stages (H200: 20.8 us against 22.7, same run)
    ku = 2 if 16 < m <= 64 and capability[0] == 9 else 1
    if ku == 2:
        stages = fit_stages(3, 2 * (bm + bn) * BLOCK, capability)
    return GemmConfig(bm, bn, split, group, warps, stages, plain=True, tma=tma, warp_spec=tma, tma_store=tma,
                      pdl=pdl, k_unroll=ku)


@triton.jit
def l2_prefetch(ptrs):
    """Pull the 128-byte lines at ``ptrs`` into L2 (a hint: no register result, never faults on a valid
    address). Used before ``gdc_wait`` for operands no earlier kernel writes (weights)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs.to(tl.int64)],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """Under programmatic dependent launch: wait until the previous kernel's writes are visible, then let the
    next kernel's programs launch (they wait in turn before touching memory this one writes)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, a_s_ptr, b_ptr, b_s_ptr, c_ptr, ws_ptr, cnt_ptr,
    M, N, K, KB_PER_SPLIT,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
    EXACT: tl.constexpr, PAIR: tl.constexpr, FUSED_REDUCE: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: GROUP_M row-tiles share each column-tile of B while it is hot in L2
    in_group = GROUP_M * num_n
    group = pid // in_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    rm = tl.where(m_ok, offs_m, 0).to(tl.int64)
    rn = tl.where(n_ok, offs_n, 0).to(tl.int64)

    n_kb = tl.cdiv(K, BLOCK_K)
    kb0 = pid_k * KB_PER_SPLIT
    kb1 = tl.minimum(kb0 + KB_PER_SPLIT, n_kb)

    a_ptrs = a_ptr + rm[:, None] * stride_am + (kb0 * BLOCK_K + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + rn[None, :] * stride_bn + (kb0 * BLOCK_K + offs_k)[:, None] * stride_bk
    as_ptrs = a_s_ptr + rm * stride_asm + kb0 * stride_ask
    bs_ptrs = b_s_ptr + (rn // BLOCK_K) * stride_bsn + kb0 * stride_bsk

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PAIR:  # EVEN_K only: two K steps per trip, both dots issued before the scale promotion waits
        for _ in range(0, (kb1 - kb0) // 2):
            a0 = tl.load(a_ptrs)
            b0 = tl.load(b_ptrs)
            a1 = tl.load(a_ptrs + BLOCK_K * stride_ak)
            b1 = tl.load(b_ptrs + BLOCK_K * stride_bk)
            s0 = tl.load(as_ptrs)[:, None] * tl.load(bs_ptrs)[None, :]
            s1 = tl.load(as_ptrs + stride_ask)[:, None] * tl.load(bs_ptrs + stride_bsk)[None, :]
            if UPCAST:
                p0 = tl.dot(a0.to(tl.bfloat16), b0.to(tl.bfloat16))
                p1 = tl.dot(a1.to(tl.bfloat16), b1.to(tl.bfloat16))
            else:
                p0 = tl.dot(a0, b0)
                p1 = tl.dot(a1, b1)
            acc += p0 * s0 + p1 * s1
            a_ptrs += 2 * BLOCK_K * stride_ak
            b_ptrs += 2 * BLOCK_K * stride_bk
            as_ptrs += 2 * stride_ask
            bs_ptrs += 2 * stride_bsk
        kb0 = kb1 - (kb1 - kb0) % 2  # an odd last step runs below
    for kb in range(kb0, kb1):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = kb * BLOCK_K + offs_k < K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        a_s = tl.load(as_ptrs)
        b_s = tl.load(bs_ptrs)
        if UPCAST:
            part = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        else:
            part = tl.dot(a, b)
        acc += part * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        as_ptrs += stride_ask
        bs_ptrs += stride_bsk

    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
        tl.store(c_ptrs, cast_rne(acc, c_ptr.dtype.element_ty, EXACT), mask=mask)
    else:
        ws_ptrs = ws_ptr + (pid_k * M + rm[:, None]) * N + rn[None, :]
        tl.store(ws_ptrs, acc, mask=mask)
        if FUSED_REDUCE:
            # every thread's partial is stored before one thread counts this split in (release); the
            # program that counts last (acquire) sums all partials from L2 and resets the counter
            tl.debug_barrier()
            done = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if done == SPLIT_K - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(SPLIT_K):
                    total += tl.load(ws_ptr + (s * M + rm[:, None]) * N + rn[None, :], mask=mask, other=0.0,
                                     cache_modifier=".cg")
                c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
                tl.store(c_ptrs, cast_rne(total, c_ptr.dtype.element_ty, EXACT), mask=mask)
                tl.atomic_xchg(cnt_ptr + pid, 0, sem="relaxed", scope="gpu")


@triton.jit
def _fp8_gemm_plain_kernel(
    a_ptr, a_s_ptr, b_ptr, b_s_ptr, c_ptr, ws_ptr, cnt_ptr, M,
    N: tl.constexpr, K: tl.constexpr, KB_PER_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, UPCAST: tl.constexpr, EXACT: tl.constexpr,
    FUSED_REDUCE: tl.constexpr, PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0, KU: tl.constexpr = 1,
):
    """Contiguous operands with N and K compiled in: 32-bit offsets, a static K trip count and unmasked
    loads, and rows/columns past the edge wrapped (``% M``) rather than masked, so every load is plain.
    With ``BLOCK_N`` ≤ 128 a tile lies inside one weight-scale block, so the weight scale is one scalar
    per K step and the promotion is one FMA per element (``acc += part · (a_s · b_s)``)."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    if GROUP_M == 0:  # M fastest: consecutive programs share one column tile of B
        pid_m = pid % num_m
        pid_n = pid // num_m
    else:  # grouped: GROUP_M row-tiles walk the column tiles together
        in_group = GROUP_M * num_n
        first_m = (pid // in_group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % size_m
        pid_n = (pid % in_group) // size_m
    k_blocks = (K + BLOCK_K - 1) // BLOCK_K
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    kb0 = pid_k * KB_PER_SPLIT
    a_ptrs = a_ptr + offs_m[:, None] * K + (kb0 * BLOCK_K + offs_k)[None, :]
    b_ptrs = b_ptr + offs_n[None, :] * K + (kb0 * BLOCK_K + offs_k)[:, None]
    as_ptrs = a_s_ptr + offs_m * k_blocks + kb0
    if BLOCK_N <= BLOCK_K:
        bs_ptr = b_s_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * k_blocks + kb0
    else:
        bs_ptrs = b_s_ptr + (offs_n // BLOCK_K) * k_blocks + kb0
    if k_blocks % KB_PER_SPLIT == 0:
        steps = KB_PER_SPLIT
    else:
        steps = tl.minimum(KB_PER_SPLIT, k_blocks - kb0)
    if PDL:
        # the weight is read-only: its first K-blocks stream into L2 while the previous kernel finishes
        for j in tl.static_range(PREFETCH):
            l2_prefetch(b_ptr + offs_n * K + tl.minimum(kb0 + j, k_blocks - 1) * BLOCK_K)
    pdl_prologue(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if KU > 1:  # K % BLOCK_K == 0 and KU divides every split's steps (the launcher checks)
        for _ in range(steps // KU):
            for u in tl.static_range(KU):
                a = tl.load(a_ptrs + u * BLOCK_K)
                b = tl.load(b_ptrs + u * BLOCK_K)
                if UPCAST:
                    part = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
                else:
                    part = tl.dot(a, b)
                if BLOCK_N <= BLOCK_K:
                    acc += part * (tl.load(as_ptrs + u) * tl.load(bs_ptr + u))[:, None]
                else:
                    acc += part * tl.load(as_ptrs + u)[:, None] * tl.load(bs_ptrs + u)[None, :]
            a_ptrs += KU * BLOCK_K
            b_ptrs += KU * BLOCK_K
            as_ptrs += KU
            if BLOCK_N <= BLOCK_K:
                bs_ptr += KU
            else:
                bs_ptrs += KU
        steps = 0
    for i in range(steps):
        if K % BLOCK_K == 0:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = (kb0 + i) * BLOCK_K + offs_k < K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if UPCAST:
            part = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        else:
            part = tl.dot(a, b)
        if BLOCK_N <= BLOCK_K:
            acc += part * (tl.load(as_ptrs) * tl.load(bs_ptr))[:, None]
            bs_ptr += 1
        else:
            acc += part * tl.load(as_ptrs)[:, None] * tl.load(bs_ptrs)[None, :]
            bs_ptrs += 1
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
        as_ptrs += 1

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    if SPLIT_K == 1:
        tl.store(c_ptr + rows[:, None] * N + cols[None, :], cast_rne(acc, c_ptr.dtype.element_ty, EXACT), mask=mask)
    else:
        tl.store(ws_ptr + (pid_k * M + rows[:, None]) * N + cols[None, :], acc, mask=mask)
        if FUSED_REDUCE:  # as in the general kernel: the last arrival sums the partials and resets the counter
            tl.debug_barrier()
            done = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if done == SPLIT_K - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(SPLIT_K):
                    total += tl.load(ws_ptr + (s * M + rows[:, None]) * N + cols[None, :], mask=mask, other=0.0,
                                     cache_modifier=".cg")
                tl.store(c_ptr + rows[:, None] * N + cols[None, :], cast_rne(total, c_ptr.dtype.element_ty, EXACT),
                         mask=mask)
                tl.atomic_xchg(cnt_ptr + pid, 0, sem="relaxed", scope="gpu")


@triton.jit
def _fp8_gemm_tma_kernel(
    a_desc, b_desc, a_s_ptr, b_s_ptr, c_ptr, ws_ptr, cnt_ptr, M,
    N: tl.constexpr, K: tl.constexpr, KB_PER_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGS: tl.constexpr, WARP_SPEC: tl.constexpr,
    UPCAST: tl.constexpr, EXACT: tl.constexpr, FUSED_REDUCE: tl.constexpr,
    PDL: tl.constexpr = False, N_SUB: tl.constexpr = 1, c_desc=None, TMA_STORE: tl.constexpr = False,
):
    """Persistent: ``NUM_PROGS`` programs walk the (tile, K-split) work items. A and B tiles arrive through
    TMA descriptors (the copy engine; rows past M and K come back as zeros), so no address arithmetic or
    masks sit in the K loop. With ``WARP_SPEC`` the loop over tiles is warp-specialised: producer warps
    issue the TMA loads while consumer warps run the dots. With ``N_SUB = 2`` the tile is two column
    slices (``b_desc`` holds ``BLOCK_N / 2`` rows), each with its own accumulator: the second slice's MMA
    is issued before the first slice's partial is promoted."""
    pdl_prologue(PDL)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    k_blocks = (K + BLOCK_K - 1) // BLOCK_K
    work = num_m * num_n * SPLIT_K
    SUB: tl.constexpr = BLOCK_N // N_SUB
    for w in tl.range(tl.program_id(0), work, NUM_PROGS, warp_specialize=WARP_SPEC):
        pid_k = w % SPLIT_K
        t = w // SPLIT_K
        if GROUP_M == 0:
            pid_m = t % num_m
            pid_n = t // num_m
        else:
            in_group = GROUP_M * num_n
            first_m = (t // in_group) * GROUP_M
            size_m = tl.minimum(num_m - first_m, GROUP_M)
            pid_m = first_m + (t % in_group) % size_m
            pid_n = (t % in_group) // size_m
        kb0 = pid_k * KB_PER_SPLIT
        if k_blocks % KB_PER_SPLIT == 0:
            steps = KB_PER_SPLIT
        else:
            steps = tl.minimum(KB_PER_SPLIT, k_blocks - kb0)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        as_ptrs = a_s_ptr + (rows % M) * k_blocks + kb0
        if N_SUB == 2:
            cols0 = pid_n * BLOCK_N + tl.arange(0, SUB)
            cols1 = cols0 + SUB
            bs0 = b_s_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * k_blocks + kb0
            bs1 = b_s_ptr + tl.minimum((pid_n * BLOCK_N + SUB) // BLOCK_K, (N - 1) // BLOCK_K) * k_blocks + kb0
            acc0 = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)
            acc1 = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)
            for i in range(steps):
                k0 = (kb0 + i) * BLOCK_K
                a = a_desc.load([pid_m * BLOCK_M, k0])
                b0 = b_desc.load([pid_n * BLOCK_N, k0])
                b1 = b_desc.load([pid_n * BLOCK_N + SUB, k0])
                a_s = tl.load(as_ptrs + i)
                if UPCAST:
                    p0 = tl.dot(a.to(tl.bfloat16), b0.to(tl.bfloat16).T)
                    p1 = tl.dot(a.to(tl.bfloat16), b1.to(tl.bfloat16).T)
                else:
                    p0 = tl.dot(a, b0.T)
                    p1 = tl.dot(a, b1.T)
                acc0 += p0 * (a_s * tl.load(bs0 + i))[:, None]
                acc1 += p1 * (a_s * tl.load(bs1 + i))[:, None]
            mrow = (rows < M)[:, None]
            m0 = mrow & (cols0 < N)[None, :]
            m1 = mrow & (cols1 < N)[None, :]
            if SPLIT_K == 1:
                tl.store(c_ptr + rows[:, None] * N + cols0[None, :], cast_rne(acc0, c_ptr.dtype.element_ty, EXACT),
                         mask=m0)
                tl.store(c_ptr + rows[:, None] * N + cols1[None, :], cast_rne(acc1, c_ptr.dtype.element_ty, EXACT),
                         mask=m1)
            else:
                tl.store(ws_ptr + (pid_k * M + rows[:, None]) * N + cols0[None, :], acc0, mask=m0)
                tl.store(ws_ptr + (pid_k * M + rows[:, None]) * N + cols1[None, :], acc1, mask=m1)
        else:
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            if BLOCK_N <= BLOCK_K:
                bs_ptr = b_s_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * k_blocks + kb0
            else:
                bs_ptrs = b_s_ptr + ((cols % N) // BLOCK_K) * k_blocks + kb0
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for i in range(steps):
                k0 = (kb0 + i) * BLOCK_K
                a = a_desc.load([pid_m * BLOCK_M, k0])
                b = b_desc.load([pid_n * BLOCK_N, k0])
                if UPCAST:
                    part = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16).T)
                else:
                    part = tl.dot(a, b.T)
                if BLOCK_N <= BLOCK_K:
                    acc += part * (tl.load(as_ptrs + i) * tl.load(bs_ptr + i))[:, None]
                else:
                    acc += part * tl.load(as_ptrs + i)[:, None] * tl.load(bs_ptrs + i)[None, :]
            mask = (rows < M)[:, None] & (cols < N)[None, :]
            if TMA_STORE:  # SPLIT_K == 1; rows and columns past the edge are clipped by the copy engine
                c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], cast_rne(acc, c_ptr.dtype.element_ty, EXACT))
            elif SPLIT_K == 1:
                tl.store(c_ptr + rows[:, None] * N + cols[None, :], cast_rne(acc, c_ptr.dtype.element_ty, EXACT),
                         mask=mask)
            else:
                tl.store(ws_ptr + (pid_k * M + rows[:, None]) * N + cols[None, :], acc, mask=mask)
                if FUSED_REDUCE:  # the last split of a tile to arrive sums the partials and resets the counter
                    tl.debug_barrier()
                    done = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
                    if done == SPLIT_K - 1:
                        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                        for s in range(SPLIT_K):
                            total += tl.load(ws_ptr + (s * M + rows[:, None]) * N + cols[None, :], mask=mask,
                                             other=0.0, cache_modifier=".cg")
                        tl.store(c_ptr + rows[:, None] * N + cols[None, :],
                                 cast_rne(total, c_ptr.dtype.element_ty, EXACT), mask=mask)
                        tl.atomic_xchg(cnt_ptr + t, 0, sem="relaxed", scope="gpu")


@triton.jit
def _split_k_reduce_kernel(
    ws_ptr, c_ptr, MN, N, stride_cm, stride_cn, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, EXACT: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_prologue(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * MN + offs, mask=ok, other=0.0)
    row = offs // N
    col = offs % N
    tl.store(c_ptr + row * stride_cm + col * stride_cn, cast_rne(acc, c_ptr.dtype.element_ty, EXACT), mask=ok)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _tile_counters(device: torch.device, n: int) -> torch.Tensor:
    """Per-tile split-K arrival counters, zero between calls (the last arrival resets its own). Grown
    outside graph capture on first use of a size; kept per device."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < n:
        have = _COUNTERS[device] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return have


def fp8_gemm(
    a: torch.Tensor,
    a_s: torch.Tensor,
    b: torch.Tensor,
    b_s: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    out: torch.Tensor | None = None,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """Triton twin of :func:`fp8_gemm_ref` (same operands, ``[M, N]`` in ``out_dtype``, written into ``out``
    when given). ``config`` overrides :func:`gemm_config` (benchmarks sweep it). Callers flatten tokens to 2-D.
    """
    _check(a, a_s, b, b_s)
    m, k = a.shape
    n = b.shape[0]
    cap = capability(a.device)
    if config is None:
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count if cap else 132
        config = gemm_config(m, n, k, cap, sms)
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    elif tuple(out.shape) != (m, n) or out.dtype != out_dtype:
        raise ValueError(f"fp8_gemm: out must be [{m}, {n}] {out_dtype}, got {tuple(out.shape)} {out.dtype}")
    c = out
    if m == 0 or n == 0:
        return c
    n_kb = triton.cdiv(k, BLOCK)
    split = max(1, min(config.split_k, n_kb))
    kb_per_split = triton.cdiv(n_kb, split)
    split = triton.cdiv(n_kb, kb_per_split)
    ws = torch.empty((split, m, n), dtype=torch.float32, device=a.device) if split > 1 else c
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    fused = config.fused_reduce and split > 1
    counters = _tile_counters(a.device, tiles) if fused else ws
    grid = (tiles, split)
    pdl = config.pdl and pdl_ok(cap)
    launch = {"launch_pdl": True} if pdl else {}
    if config.tma and _plain_ok(a, a_s, b, b_s, c, split) and k % 16 == 0:
        _launch_tma(a, a_s, b, b_s, c, ws, counters, kb_per_split, tiles, split, fused, cap, config, pdl)
    elif config.plain and _plain_ok(a, a_s, b, b_s, c, split):
        _fp8_gemm_plain_kernel[grid](
            a, a_s, b, b_s, c, ws, counters, m,
            N=n, K=k, KB_PER_SPLIT=kb_per_split,
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=BLOCK,
            SPLIT_K=split, GROUP_M=config.group_m, UPCAST=cap is not None and cap < (8, 9), EXACT=interpreting(),
            FUSED_REDUCE=fused, PDL=pdl, PREFETCH=min(config.prefetch, kb_per_split) if pdl else 0,
            KU=config.k_unroll if k % BLOCK == 0 and n_kb % kb_per_split == 0 and kb_per_split % config.k_unroll == 0
            else 1,
            num_warps=config.num_warps, num_stages=config.num_stages, **launch,
        )
    else:
        _launch_general(a, a_s, b, b_s, c, ws, counters, kb_per_split, grid, split, fused, cap, config)
    if split > 1 and not fused:
        rb = 1024
        _split_k_reduce_kernel[(triton.cdiv(m * n, rb),)](
            ws, c, m * n, n, c.stride(0), c.stride(1), SPLIT_K=split, BLOCK=rb, EXACT=interpreting(), PDL=pdl,
            **launch,
        )
    return c


def pdl_ok(cap: tuple[int, int] | None) -> bool:
    """Programmatic dependent launch needs sm90+ (and a compiled kernel: the interpreter has no grids)."""
    return cap is not None and cap >= (9, 0)


def _plain_ok(a, a_s, b, b_s, c, split) -> bool:
    """The static-shape kernel indexes row-major operands with 32-bit offsets; anything else (strided views,
    operands or split-K partials past 2³¹ elements) takes the general kernel."""
    m, k = a.shape
    n = b.shape[0]
    return (a.stride() == (k, 1) and b.stride() == (k, 1) and c.stride() == (n, 1) and a_s.is_contiguous()
            and b_s.is_contiguous() and max(m * k, n * k, split * m * n) < 2**31)


def _launch_tma(a, a_s, b, b_s, c, ws, counters, kb_per_split, tiles, split, fused, cap, config,
                pdl=False) -> None:
    """The persistent TMA kernel: one program per SM (or per work item, when there are fewer)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    n = b.shape[0]
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count if cap else 4
    progs = max(1, min(sms, tiles * split))
    n_sub = 2 if config.n_sub == 2 and not fused and config.block_n // 2 in (32, 64, 128) else 1
    a_desc = TensorDescriptor.from_tensor(a, [config.block_m, BLOCK])
    b_desc = TensorDescriptor.from_tensor(b, [config.block_n // n_sub, BLOCK])
    tma_store = config.tma_store and split == 1 and n_sub == 1 and (n * c.element_size()) % 16 == 0
    c_desc = TensorDescriptor.from_tensor(c, [config.block_m, config.block_n]) if tma_store else None
    _fp8_gemm_tma_kernel[(progs,)](
        a_desc, b_desc, a_s, b_s, c, ws, counters, m, c_desc=c_desc, TMA_STORE=tma_store,
        N=n, K=k, KB_PER_SPLIT=kb_per_split,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=BLOCK,
        SPLIT_K=split, GROUP_M=config.group_m, NUM_PROGS=progs, WARP_SPEC=config.warp_spec and split == 1,
        UPCAST=cap is not None and cap < (8, 9), EXACT=interpreting(), FUSED_REDUCE=fused, PDL=pdl, N_SUB=n_sub,
        num_warps=config.num_warps, num_stages=config.num_stages, **({"launch_pdl": True} if pdl else {}),
    )


def _launch_general(a, a_s, b, b_s, c, ws, counters, kb_per_split, grid, split, fused, cap, config) -> None:
    m, k = a.shape
    n = b.shape[0]
    _fp8_gemm_kernel[grid](
        a, a_s, b, b_s, c, ws, counters,
        m, n, k, kb_per_split,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=BLOCK,
        SPLIT_K=split, GROUP_M=max(1, config.group_m), EVEN_K=k % BLOCK == 0,
        UPCAST=cap is not None and cap < (8, 9), EXACT=interpreting(), PAIR=config.k_pair and k % BLOCK == 0,
        FUSED_REDUCE=fused,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


# --- parity ------------------------------------------------------------------------------------------

def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    from kernels.fp8_quant import act_quant_ref

    m, n, k = case.params["mnk"]
    x = torch.randn(m, k, generator=gen, device=device)
    w = torch.randn(n, k, generator=gen, device=device) * 0.05
    a, a_s = act_quant_ref(x)
    b, b_s = quant_weight_blocks(w)
    return {"a": a, "a_s": a_s, "b": b, "b_s": b_s, "out_dtype": case.params.get("out_dtype", torch.bfloat16)}


_GPU = ("cuda",)

SPEC = ParitySpec(
    op="fp8_gemm",
    make_inputs=_inputs,
    reference=fp8_gemm_ref,
    kernel=lambda out, **inp: fp8_gemm(**inp, out=out[0]),
    cases=[
        Case("1x64x256 splitK", {"mnk": (1, 64, 256)}),
        Case("5x96x200 partial-K", {"mnk": (5, 96, 200)}),  # K and N not multiples of 128
        Case("33x130x384", {"mnk": (33, 130, 384)}),
        Case("70x64x128 prefill", {"mnk": (70, 64, 128)}),
        Case("3x64x64 fp32 out", {"mnk": (3, 64, 64), "out_dtype": torch.float32}, dtype=torch.float32),
        Case("1x7168x7168", {"mnk": (1, 7168, 7168)}, devices=_GPU),
        Case("16x7168x7168", {"mnk": (16, 7168, 7168)}, devices=_GPU),
        Case("64x7168x7168", {"mnk": (64, 7168, 7168)}, devices=_GPU),
        Case("64x2112x7168 q_a|kv_a", {"mnk": (64, 2112, 7168)}, devices=_GPU),
        Case("4096x7168x7168", {"mnk": (4096, 7168, 7168)}, devices=_GPU),
        Case("4095x1536x7000 ragged", {"mnk": (4095, 1536, 7000)}, devices=_GPU),
    ],
    checks=[Check("gemm_diff", 1e-3, "fp32 accumulation of exact fp8 products, bf16 out; DeepGEMM's bound")],
    description="w8a8 block-scaled GEMM (1x128 activation, 128x128 weight scales), bf16 out",
)
