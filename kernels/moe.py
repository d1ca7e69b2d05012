"""Routed-expert MLP of a DeepSeek MoE layer as two grouped GEMMs over tokens sorted by expert.

``out[t] = Σ_k w[t,k] · W2[e_k] (silu(W1[e_k] x_t) ⊙ W3[e_k] x_t)`` with ``e_k = ids[t,k]``.

Routing pairs ``(token, k)`` are grouped by expert and each expert's run is padded to a multiple of the
M tile, so that every M tile belongs to one expert (:func:`align_by_expert`, all on the device with no host
sync, so the step can be graph-captured). The first kernel gathers the tokens' rows, multiplies them by
the expert's gate and up projections in one pass and writes ``silu(g)·u`` in the activation dtype; the
second multiplies by the down projection, scales by the routing weight, and a sum over ``k`` finishes.

Weights are bf16 (``[E, I, D]`` gate and up, ``[E, D, I]`` down, HF orientation) or fp8 e4m3 with
128×128 ``weight_scale_inv`` blocks, dequantised tile by tile in the kernel (w8a16: the weight bytes, which
bound decode, are halved; activations stay bf16). ``act_fp8=True`` (fp8 weights, sm89+ or the interpreter)
is w8a8 as DeepSeek-V3 runs its experts: the tokens and the SiLU·mul intermediate are quantised in 1×128
blocks (``act_quant``) and both GEMMs are native fp8 dots with ``a_s ⊗ w_s`` applied per K block, which
is what prefill (compute-bound) wants.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels._tl import cast_rne
from kernels.arch import capability, interpreting
from kernels.harness import Case, Check, ParitySpec
from kernels.tiles import dot_precision, fit_stages

BLOCK = 128  # fp8 weight-scale block


def _dequant_one(w: torch.Tensor, scale: torch.Tensor | None, e: int, dtype: torch.dtype) -> torch.Tensor:
    if scale is None:
        return w[e].to(dtype)
    from kernels.fp8_quant import weight_dequant_ref

    return weight_dequant_ref(w[e], scale[e], block=BLOCK).to(dtype)


def _qdq(x: torch.Tensor) -> torch.Tensor:
    """``x`` through 1×128 fp8 quantisation and back (what a w8a8 GEMM sees of its activation)."""
    from kernels.fp8_quant import act_dequant_ref, act_quant_ref

    q, s = act_quant_ref(x)
    return act_dequant_ref(q, s, out_dtype=torch.float32)


def expert_loop(x, topk_weights, topk_ids, w1, w3, w2, w1_scale=None, w3_scale=None, w2_scale=None, dtype=None,
                act_fp8: bool = False):
    """Per-expert loop in ``dtype`` (fp32 when None): gather the expert's tokens, MLP, scatter-add. Only
    experts that received tokens have their weights converted. ``act_fp8``: the tokens and the
    intermediate pass through 1×128 fp8 quantisation first (the w8a8 kernel's inputs; the intermediate is
    rounded to ``x.dtype`` before, as the kernel stores it)."""
    dtype = dtype or torch.float32
    xf = (_qdq(x) if act_fp8 else x).to(dtype)
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w1.shape[0]):
        tok, slot = torch.where(topk_ids == e)
        if tok.numel() == 0:
            continue
        xe = xf[tok]
        g = xe @ _dequant_one(w1, w1_scale, e, dtype).t()
        u = xe @ _dequant_one(w3, w3_scale, e, dtype).t()
        h = torch.nn.functional.silu(g) * u
        if act_fp8:
            h = _qdq(h.to(x.dtype)).to(dtype)
        y = (h @ _dequant_one(w2, w2_scale, e, dtype).t()).float() * topk_weights[tok, slot, None].float()
        out.index_add_(0, tok, y)
    return out.to(x.dtype)


def moe_experts_ref(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w1: torch.Tensor,
    w3: torch.Tensor,
    w2: torch.Tensor,
    w1_scale: torch.Tensor | None = None,
    w3_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    act_fp8: bool = False,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 oracle: ``x[T, D]``, ``topk_*[T, k]``, gate ``w1[E, I, D]``, up ``w3[E, I, D]``, down
    ``w2[E, D, I]`` (fp8 weights come with ``*_scale[E, ceil(rows/128), ceil(cols/128)]``). Returns
    ``[T, D]`` in ``x.dtype``. ``act_fp8``: w8a8 (see :func:`expert_loop`). ``add[T, D]`` (the shared
    experts' output) is added to the result rounded to ``x.dtype``, as a separate add would."""
    _check(x, topk_weights, topk_ids, w1, w3, w2, w1_scale, w3_scale, w2_scale)
    y = expert_loop(x, topk_weights, topk_ids, w1, w3, w2, w1_scale, w3_scale, w2_scale, act_fp8=act_fp8)
    return y if add is None else y + add.to(y.dtype)


def _check(x, topk_weights, topk_ids, w1, w3, w2, w1_scale, w3_scale, w2_scale) -> None:
    if x.dim() != 2:
        raise ValueError(f"moe: x must be [tokens, hidden], got {tuple(x.shape)}")
    t, d = x.shape
    if w1.dim() != 3 or w1.shape != w3.shape or w1.shape[2] != d:
        raise ValueError(f"moe: w1 and w3 must both be [experts, inter, {d}], got {tuple(w1.shape)} {tuple(w3.shape)}")
    e, i, _ = w1.shape
    if tuple(w2.shape) != (e, d, i):
        raise ValueError(f"moe: w2 must be [{e}, {d}, {i}], got {tuple(w2.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != t:
        raise ValueError(
            f"moe: topk_ids and topk_weights must both be [{t}, k], got {tuple(topk_ids.shape)} {tuple(topk_weights.shape)}"
        )
    fp8 = w1.dtype == torch.float8_e4m3fn
    for name, w, s in (("w1", w1, w1_scale), ("w3", w3, w3_scale), ("w2", w2, w2_scale)):
        if (w.dtype == torch.float8_e4m3fn) != fp8:
            raise ValueError("moe: w1, w3 and w2 must all be fp8 or all be floating point")
        if fp8:
            want = (e, -(-w.shape[1] // BLOCK), -(-w.shape[2] // BLOCK))
            if s is None or tuple(s.shape) != want:
                got = None if s is None else tuple(s.shape)
                raise ValueError(f"moe: fp8 {name} needs {name}_scale of shape {want}, got {got}")


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int, method: str = "auto"):
    """Sort the ``T·k`` routing pairs by expert and pad each expert's run to a multiple of ``block_m``.

    Returns ``(sorted_ids, block_expert)``: ``sorted_ids[P]`` holds flat pair indices (``t·k + j``) in
    routing order within each expert, with ``T·k`` marking padding; ``block_expert[P/block_m]`` is each M
    tile's expert, ``-1`` past the end. ``P = T·k + E·(block_m − 1)`` rounded up is a bound known from
    shapes alone, so nothing syncs. ``method``: ``"torch"`` (a dozen small device ops), ``"triton"`` (one
    single-program kernel, for decode-sized inputs where those launches dominate), ``"auto"`` picks.
    """
    n = topk_ids.numel()
    cap = triton.cdiv(n + num_experts * (block_m - 1), block_m) * block_m
    if method == "auto":
        method = "triton" if _align_fits(n, num_experts, cap // block_m) else "torch"
    if method == "triton":
        return _align_triton(topk_ids, num_experts, block_m, cap)
    if method != "torch":
        raise ValueError(f"align method must be auto, torch or triton, got {method!r}")
    flat = topk_ids.reshape(-1).long()
    dev = flat.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    start = torch.cumsum(counts, 0) - counts
    order = torch.sort(flat, stable=True).indices
    sorted_e = flat[order]
    dest = pad_start[sorted_e] + torch.arange(n, device=dev) - start[sorted_e]
    sorted_ids = torch.full((cap,), n, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(0, cap, block_m, device=dev)
    block_expert = torch.searchsorted(pad_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_ids, block_expert


_ALIGN_MAX_CELLS = 16384  # pairs × experts one step of the aligner holds in registers
_ALIGN_MAX_PAIRS = 8192  # routing pairs up to which the one-program aligner beats torch's sort (decode)


def _align_fits(n_pairs: int, num_experts: int, n_tiles: int) -> bool:
    return n_pairs <= _ALIGN_MAX_PAIRS and triton.next_power_of_2(num_experts) <= _ALIGN_MAX_CELLS // 16


@triton.jit
def _align_kernel(
    ids_ptr, sorted_ptr, bexp_ptr, N, E, CAP, N_TILES,
    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, E_P2: tl.constexpr, TCHUNK: tl.constexpr, FILL: tl.constexpr,
):
    # one program, the pairs in chunks of CHUNK: a histogram pass, the padded prefix, then a placing pass
    # that keeps a running write position per expert (routing order within each expert is kept)
    ev = tl.arange(0, E_P2)
    counts = tl.zeros((E_P2,), dtype=tl.int32)
    for c0 in range(0, N, CHUNK):
        i = c0 + tl.arange(0, CHUNK)
        e = tl.load(ids_ptr + i, mask=i < N, other=-1).to(tl.int32)
        counts += tl.sum((e[:, None] == ev[None, :]).to(tl.int32), 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, 0)
    run = pad_end - padded  # where each expert's next pair goes
    for c0 in range(0, CAP, FILL):
        offs = c0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + offs, tl.zeros((FILL,), dtype=tl.int32) + N, mask=offs < CAP)
    tl.debug_barrier()  # padding first, then the pairs over it
    for c0 in range(0, N, CHUNK):
        i = c0 + tl.arange(0, CHUNK)
        ok = i < N
        e = tl.load(ids_ptr + i, mask=ok, other=-1).to(tl.int32)
        hit = e[:, None] == ev[None, :]
        onehot = hit.to(tl.int32)
        before = tl.cumsum(onehot, 0) - onehot  # pairs of the same expert earlier in this chunk
        dest = tl.sum(tl.where(hit, before + run[None, :], 0), 1)
        tl.store(sorted_ptr + dest, i, mask=ok)
        run += tl.sum(onehot, 0)
    for b0 in range(0, N_TILES, TCHUNK):
        b = b0 + tl.arange(0, TCHUNK)
        done = (pad_end[None, :] <= (b * BLOCK_M)[:, None]) & (ev[None, :] < E)
        be = tl.sum(done.to(tl.int32), 1)
        tl.store(bexp_ptr + b, tl.where(be < E, be, -1), mask=b < N_TILES)


def _align_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int, cap: int):
    n = topk_ids.numel()
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    n_tiles = cap // block_m
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(n_tiles, dtype=torch.int32, device=ids.device)
    e_p2 = triton.next_power_of_2(num_experts)
    chunk = max(1, min(triton.next_power_of_2(max(n, 1)), _ALIGN_MAX_CELLS // e_p2))
    tchunk = max(1, min(triton.next_power_of_2(n_tiles), _ALIGN_MAX_CELLS // e_p2))
    _align_kernel[(1,)](
        ids, sorted_ids, block_expert, n, num_experts, cap, n_tiles,
        BLOCK_M=block_m, CHUNK=chunk, E_P2=e_p2, TCHUNK=tchunk, FILL=1024, num_warps=8,
    )
    return sorted_ids, block_expert


@dataclass(frozen=True)
class MoeConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def moe_smem_per_stage(cfg: MoeConfig, weight_elem: int = 2, act_elem: int = 2) -> int:
    """Bytes one pipeline stage of the gate/up kernel buffers: an activation tile and two weight tiles."""
    return cfg.block_m * cfg.block_k * act_elem + 2 * cfg.block_k * cfg.block_n * weight_elem


def moe_config(tokens: int, top_k: int, num_experts: int, capability: tuple[int, int] | None,
               weight_elem: int = 2) -> MoeConfig:
    """Decode (few pairs per expert) takes 16-row tiles, prefill 128×128 tiles with 64-wide K steps
    (measured on H200: 3.3 ms vs 3.6 ms for 64×128×128 at 4096 tokens of the small config). Pipeline depth
    is fitted to the part's shared memory, so sm120 (~99 KB) gets shallower pipelines than sm90."""
    if capability is None:
        return MoeConfig(16, 32, 64, 4, 1)
    hopper = capability[0] in (9, 10)
    pairs_per_expert = tokens * top_k / max(num_experts, 1)
    if pairs_per_expert <= 16:
        cfg = MoeConfig(16, 64, 128, 4, 4)
    elif pairs_per_expert <= 64:
        cfg = MoeConfig(32, 64, 128, 4, 4)
    elif hopper:
        cfg = MoeConfig(128, 128, 64, 8, 3)
    else:
        cfg = MoeConfig(64, 64, 64, 4, 3)
    # fp8 weight tiles are widened to bf16 for the dot: that copy is staged once, outside the pipeline
    fixed = 2 * cfg.block_k * cfg.block_n * 2 if weight_elem == 1 else 0
    stages = fit_stages(cfg.num_stages, moe_smem_per_stage(cfg, weight_elem), capability, fixed)
    return MoeConfig(cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, stages)


@triton.jit
def _expert_tile(
    sorted_ptr, pid_m, e, NPAIRS, N, stride_we, stride_wn, stride_wk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One expert's row tile of (token, expert) pairs and output columns, and its weight-tile offsets:
    the same walk for the gate/up and the down GEMM."""
    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    p_ok = pair < NPAIRS
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    rn = tl.where(n_ok, offs_n, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    e64 = e.to(tl.int64)
    w_off = e64 * stride_we + rn[None, :] * stride_wn + offs_k[:, None] * stride_wk
    return pair, p_ok, n_ok, rn, offs_k, e64, w_off


@triton.jit
def _gate_up_kernel(
    x_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, h_ptr, sorted_ptr, bexp_ptr, xs_ptr,
    NPAIRS, TOPK, D, INTER,
    stride_xt, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_ht, stride_xst,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FP8: tl.constexpr, A8: tl.constexpr, F32_DOT: tl.constexpr, EXACT: tl.constexpr, PREC: tl.constexpr,
):
    pid_m = tl.program_id(0)
    e = tl.load(bexp_ptr + pid_m)
    if e < 0:
        return
    pair, p_ok, n_ok, rn, offs_k, e64, w_off = _expert_tile(
        sorted_ptr, pid_m, e, NPAIRS, INTER, stride_we, stride_wn, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K
    )
    tok = tl.where(p_ok, pair // TOPK, 0).to(tl.int64)
    x_ptrs = x_ptr + tok[:, None] * stride_xt + offs_k[None, :]
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        k_ok = k0 + offs_k < D
        xa = tl.load(x_ptrs, mask=p_ok[:, None] & k_ok[None, :], other=0.0)
        wg = tl.load(w1_ptr + w_off, mask=k_ok[:, None], other=0.0)
        wu = tl.load(w3_ptr + w_off, mask=k_ok[:, None], other=0.0)
        if F32_DOT:
            xa = xa.to(tl.float32)
        if A8:  # fp8 × fp8 (fp32 upcasts under the interpreter), both block scales per K block
            s_off = e64 * stride_se + (rn // 128) * stride_sn + (k0 // 128) * stride_sk
            xs = tl.load(xs_ptr + tok * stride_xst + k0 // 128)
            sg = tl.load(s1_ptr + s_off)
            su = tl.load(s3_ptr + s_off)
            acc_g += tl.dot(xa, wg.to(xa.dtype), input_precision=PREC) * (xs[:, None] * sg[None, :])
            acc_u += tl.dot(xa, wu.to(xa.dtype), input_precision=PREC) * (xs[:, None] * su[None, :])
        elif FP8:
            s_off = e64 * stride_se + (rn // 128) * stride_sn + (k0 // 128) * stride_sk
            sg = tl.load(s1_ptr + s_off)
            su = tl.load(s3_ptr + s_off)
            acc_g += tl.dot(xa, wg.to(xa.dtype), input_precision=PREC) * sg[None, :]
            acc_u += tl.dot(xa, wu.to(xa.dtype), input_precision=PREC) * su[None, :]
        else:
            acc_g = tl.dot(xa, wg.to(xa.dtype), acc_g, input_precision=PREC)
            acc_u = tl.dot(xa, wu.to(xa.dtype), acc_u, input_precision=PREC)
        x_ptrs += BLOCK_K
        w_off += BLOCK_K * stride_wk
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    h_ptrs = h_ptr + tl.where(p_ok, pair, 0).to(tl.int64)[:, None] * stride_ht + rn[None, :]
    tl.store(h_ptrs, cast_rne(h, h_ptr.dtype.element_ty, EXACT), mask=p_ok[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(
    h_ptr, w2_ptr, s2_ptr, y_ptr, wt_ptr, sorted_ptr, bexp_ptr, hs_ptr,
    NPAIRS, D, INTER,
    stride_ht, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_yt, stride_hst,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FP8: tl.constexpr, A8: tl.constexpr, F32_DOT: tl.constexpr, PREC: tl.constexpr,
):
    pid_m = tl.program_id(0)
    e = tl.load(bexp_ptr + pid_m)
    if e < 0:
        return
    pair, p_ok, n_ok, rn, offs_k, e64, w_off = _expert_tile(
        sorted_ptr, pid_m, e, NPAIRS, D, stride_we, stride_wn, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K
    )
    rp = tl.where(p_ok, pair, 0).to(tl.int64)
    h_ptrs = h_ptr + rp[:, None] * stride_ht + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        k_ok = k0 + offs_k < INTER
        ha = tl.load(h_ptrs, mask=p_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w2_ptr + w_off, mask=k_ok[:, None], other=0.0)
        if F32_DOT:
            ha = ha.to(tl.float32)
        if A8:
            s = tl.load(s2_ptr + e64 * stride_se + (rn // 128) * stride_sn + (k0 // 128) * stride_sk)
            hs = tl.load(hs_ptr + rp * stride_hst + k0 // 128)
            acc += tl.dot(ha, w.to(ha.dtype), input_precision=PREC) * (hs[:, None] * s[None, :])
        elif FP8:
            s = tl.load(s2_ptr + e64 * stride_se + (rn // 128) * stride_sn + (k0 // 128) * stride_sk)
            acc += tl.dot(ha, w.to(ha.dtype), input_precision=PREC) * s[None, :]
        else:
            acc = tl.dot(ha, w.to(ha.dtype), acc, input_precision=PREC)
        h_ptrs += BLOCK_K
        w_off += BLOCK_K * stride_wk
    wt = tl.load(wt_ptr + rp, mask=p_ok, other=0.0)
    acc = acc * wt[:, None]
    tl.store(y_ptr + rp[:, None] * stride_yt + rn[None, :], acc, mask=p_ok[:, None] & n_ok[None, :])


def moe_experts(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w1: torch.Tensor,
    w3: torch.Tensor,
    w2: torch.Tensor,
    w1_scale: torch.Tensor | None = None,
    w3_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    config: MoeConfig | None = None,
    align: str = "auto",
    act_fp8: bool = False,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton twin of :func:`moe_experts_ref` (into ``out`` when given); ``align`` as in
    :func:`align_by_expert`; ``act_fp8``: w8a8 (fp8 weights only); ``add`` as in the reference, fused
    into the kernel that sums each token's ``k`` expert rows."""
    _check(x, topk_weights, topk_ids, w1, w3, w2, w1_scale, w3_scale, w2_scale)
    t, d = x.shape
    e, i, _ = w1.shape
    k = topk_ids.shape[1]
    cap = capability(x.device)
    fp8 = w1.dtype == torch.float8_e4m3fn
    config = config or moe_config(t, k, e, cap, 1 if fp8 else 2)
    if fp8 and BLOCK % config.block_k:
        raise ValueError(f"moe: block_k={config.block_k} must divide the fp8 scale block {BLOCK}")
    if w1.stride(2) != 1 or w2.stride(2) != 1:
        raise ValueError("moe: expert weights must be contiguous in their last dim")
    if w1.stride() != w3.stride() or (fp8 and w1_scale.stride() != w3_scale.stride()):
        raise ValueError("moe: w1 and w3 (and their scales) must share a layout")
    if act_fp8 and not fp8:
        raise ValueError("moe: act_fp8 (w8a8) needs fp8 expert weights")
    if act_fp8 and cap is not None and cap < (8, 9):
        raise ValueError(f"moe: act_fp8 needs fp8 tensor cores (sm89+); this device is sm{cap[0]}{cap[1]}")
    if act_fp8 and (d % BLOCK or i % BLOCK):
        raise ValueError(f"moe: act_fp8 needs hidden ({d}) and intermediate ({i}) sizes that are multiples of {BLOCK}")
    x = x.contiguous()
    sorted_ids, block_expert = align_by_expert(topk_ids, e, config.block_m, align)
    n_pairs = t * k
    h = torch.empty(n_pairs, i, dtype=x.dtype, device=x.device)
    if act_fp8:
        from kernels.fp8_quant import act_quant

        xin, xs = act_quant(x)
    else:
        xin, xs = x, x
    y = torch.empty(n_pairs, d, dtype=torch.float32, device=x.device)
    s1, s3, s2 = (w1_scale, w3_scale, w2_scale) if fp8 else (w1, w3, w2)
    n_tiles = block_expert.numel()
    f32 = cap is None
    _gate_up_kernel[(n_tiles, triton.cdiv(i, config.block_n))](
        xin, w1, w3, s1, s3, h, sorted_ids, block_expert, xs,
        n_pairs, k, d, i,
        xin.stride(0), w1.stride(0), w1.stride(1), w1.stride(2),
        s1.stride(0), s1.stride(1), s1.stride(2), h.stride(0), xs.stride(0),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, FP8=fp8, A8=act_fp8, F32_DOT=f32,
        EXACT=interpreting(), PREC=dot_precision(x.dtype), num_warps=config.num_warps, num_stages=config.num_stages,
    )
    wts = topk_weights.reshape(-1).float().contiguous()
    if act_fp8:
        hin, hs = act_quant(h)
    else:
        hin, hs = h, h
    _down_kernel[(n_tiles, triton.cdiv(d, config.block_n))](
        hin, w2, s2, y, wts, sorted_ids, block_expert, hs,
        n_pairs, d, i,
        hin.stride(0), w2.stride(0), w2.stride(1), w2.stride(2),
        s2.stride(0), s2.stride(1), s2.stride(2), y.stride(0), hs.stride(0),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, FP8=fp8, A8=act_fp8, F32_DOT=f32,
        PREC=dot_precision(x.dtype), num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if out is None:
        out = torch.empty(t, d, dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != (t, d) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"moe: out must be [{t}, {d}] {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    if add is not None and (tuple(add.shape) != (t, d) or add.stride(-1) != 1):
        raise ValueError(f"moe: add must be [{t}, {d}] with unit last-dim stride, got {tuple(add.shape)}")
    block_d = min(triton.next_power_of_2(d), 1024 if cap is not None else 4096)
    _sum_kernel[(t, triton.cdiv(d, block_d))](
        y, add if add is not None else y, out, k, d, y.stride(0), add.stride(0) if add is not None else 0,
        out.stride(0), HAS_ADD=add is not None, K_P2=triton.next_power_of_2(k), BLOCK_D=block_d,
        EXACT=interpreting(), num_warps=4 if cap is not None else 1,
    )
    return out


@triton.jit
def _sum_kernel(y_ptr, add_ptr, out_ptr, K, D, stride_y, stride_a, stride_o,
                HAS_ADD: tl.constexpr, K_P2: tl.constexpr, BLOCK_D: tl.constexpr, EXACT: tl.constexpr):
    """``out[t] = Σ_j y[t·K + j]`` rounded to the output dtype, then ``+ add[t]`` rounded again (what
    ``sum``, ``.to`` and a separate add give)."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.arange(0, K_P2)
    ok = (j[:, None] < K) & (cols[None, :] < D)
    rows = tl.load(y_ptr + (t * K + j[:, None]) * stride_y + cols[None, :], mask=ok, other=0.0)
    s = cast_rne(tl.sum(rows, 0), out_ptr.dtype.element_ty, EXACT)
    if HAS_ADD:
        a = tl.load(add_ptr + t * stride_a + cols, mask=cols < D, other=0.0)
        s = cast_rne(s.to(tl.float32) + a.to(tl.float32), out_ptr.dtype.element_ty, EXACT)
    tl.store(out_ptr + t * stride_o + cols, s, mask=cols < D)


def bytes_moved(topk_ids: torch.Tensor, d: int, i: int, weight_elem: int, act_elem: int = 2) -> int:
    """Fewest bytes a call must move: each touched expert's three matrices once, tokens in and out."""
    experts = int(torch.unique(topk_ids).numel())
    t = topk_ids.shape[0]
    return experts * 3 * d * i * weight_elem + 2 * t * d * act_elem


# --- parity ------------------------------------------------------------------------------------------

def route_random(t: int, e: int, k: int, device, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` distinct experts per token, uniformly, with positive weights summing to 1 (a stand-in for a
    router: the expert kernel's correctness does not depend on how the ids were chosen)."""
    ids = torch.rand(t, e, generator=gen, device=device).argsort(dim=1)[:, :k]
    w = torch.rand(t, k, generator=gen, device=device) + 0.1
    return w / w.sum(1, keepdim=True), ids


def moe_inputs(t, d, i, e, k, device, gen, fp8=False, dtype=torch.bfloat16, skew=False) -> dict:
    """Random tokens, routing and expert weights (``fp8``: quantised in 128×128 blocks)."""
    from kernels.fp8_gemm import quant_weight_blocks

    x = torch.randn(t, d, generator=gen, device=device).to(dtype)
    topk_weights, topk_ids = route_random(t, e, k, device, gen)
    if skew:  # every token on the first k experts: one long expert run, many empty experts
        topk_ids = torch.arange(k, device=device).expand(t, k).contiguous()
    ws = {}
    for name, shape in (("w1", (e, i, d)), ("w3", (e, i, d)), ("w2", (e, d, i))):
        w = torch.randn(*shape, generator=gen, device=device) / shape[2] ** 0.5
        if fp8:
            ws[name], ws[name + "_scale"] = quant_weight_blocks(w)
        else:
            ws[name] = w.to(dtype)
    return {"x": x, "topk_weights": topk_weights, "topk_ids": topk_ids, **ws}


def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    p = case.params
    inp = moe_inputs(*p["tdiek"], device, gen, fp8=p.get("fp8", False), dtype=case.dtype, skew=p.get("skew", False))
    if p.get("a8"):
        inp["act_fp8"] = True
    return inp


_GPU = ("cuda",)
_SMALL = (2048, 1408, 64, 6)  # hidden, moe_intermediate, routed experts, top-k of the small config

SPEC = ParitySpec(
    op="moe_experts",
    make_inputs=_inputs,
    reference=moe_experts_ref,
    kernel=lambda out, **inp: moe_experts(**inp, out=out[0]),
    cases=[
        Case("t7 d160 i96 e8 k3", {"tdiek": (7, 160, 96, 8, 3)}),
        Case("t7 d160 i96 e8 k3 fp8", {"tdiek": (7, 160, 96, 8, 3), "fp8": True}),
        Case("t9 d256 i128 e4 k2 w8a8", {"tdiek": (9, 256, 128, 4, 2), "fp8": True, "a8": True}),
        Case("t20 d64 i32 e16 k2 skew", {"tdiek": (20, 64, 32, 16, 2), "skew": True}),
        Case("t5 d64 i32 e4 k2 fp32", {"tdiek": (5, 64, 32, 4, 2)}, dtype=torch.float32),
        Case("t1 small", {"tdiek": (1, *_SMALL)}, devices=_GPU),
        Case("t64 small fp8", {"tdiek": (64, *_SMALL), "fp8": True}, devices=_GPU),
        Case("t64 small", {"tdiek": (64, *_SMALL)}, devices=_GPU),
        Case("t4096 small", {"tdiek": (4096, *_SMALL)}, devices=_GPU),
        Case("t4096 small fp8", {"tdiek": (4096, *_SMALL), "fp8": True}, devices=_GPU),
        Case("t4096 small w8a8", {"tdiek": (4096, *_SMALL), "fp8": True, "a8": True}, devices=_GPU),
    ],
    checks=[Check("gemm_diff", 1e-5, "two fp32-accumulated GEMMs with a bf16 intermediate; bf16 GEMM bound",
                  dtypes=(torch.bfloat16,)),
            Check("gemm_diff", 1e-10, "fp32 operands multiply in full fp32 (not tf32): only summation order",
                  dtypes=(torch.float32,))],
    description="routed experts: gate/up, SiLU·mul, down, weighted sum; bf16 or fp8-block weights",
)
