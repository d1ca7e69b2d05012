"""Absorbed-MLA decode attention over a paged latent KV cache (one query token per sequence).

Layout, as in FlashMLA and vLLM: every cached token is one 576-wide row, the 512-wide compressed latent
``c_kv`` followed by the 64-wide rotated ``k_pe``; the latent doubles as V. The cache is
``[num_pages, page_size, 576]`` and ``block_table[b, i]`` names the page holding tokens
``i*page_size … (i+1)*page_size-1`` of sequence ``b``. Queries arrive already absorbed
(``q_nope · W_UK`` ‖ ``q_pe``), ``[B, H, 576]``; the output is ``[B, H, 512]`` in the latent space, plus the
natural-log LSE of the scaled scores ``[B, H]`` (fp32). That is :func:`paged_mla_decode`.

:func:`mla_decode` is the engine's op (``engine.ops``) over its contiguous per-sequence cache
(``kv[B, T, C]``, ``pe[B, T, R]``, any latent/rope width): the same kernel, with each sequence's row as
one page.

The kernel reads KV once for all heads of a head block, splits each sequence's context into chunks that run
as separate programs (split-KV, so that batch 1 still fills the GPU), and merges the chunks by their LSE in
a second kernel. Slots past ``seq_lens[b]`` are never loaded: tests fill them with NaN.

On CPU (``TRITON_INTERPRET=1``) the dots run on fp32 upcasts of the bf16 operands: the interpreter's bf16
``tl.dot`` returns garbage (triton 3.9), and the upcast products are exact, as on tensor cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels._tl import cast_rne
from kernels.arch import capability, interpreting
from kernels.fp8_gemm import l2_prefetch, pdl_ok, pdl_prologue
from kernels.harness import Case, Check, ParitySpec
from kernels.tiles import dot_precision, fit_stages

LATENT = 512
ROPE = 64
PAGE = 64
_LOG2E = 1.4426950408889634


def paged_mla_decode_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    kv_lora_rank: int = LATENT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 oracle over the paged cache: gathers each sequence's rows through the block table.

    Returns ``(out[B, H, kv_lora_rank] in q.dtype, lse[B, H] fp32)``. Every ``seq_lens[b]`` must be ≥ 1.
    """
    _check_paged(q, kv_cache, block_table, seq_lens)
    page = kv_cache.shape[1]
    c = kv_lora_rank
    b_sz, h, _ = q.shape
    out = torch.empty(b_sz, h, c, dtype=torch.float32, device=q.device)
    lse = torch.empty(b_sz, h, dtype=torch.float32, device=q.device)
    for b in range(b_sz):
        n = int(seq_lens[b])
        if n < 1:
            raise ValueError(f"mla_decode: seq_lens[{b}] = {n}; every sequence needs at least one cached token")
        pos = torch.arange(n, device=q.device)
        rows = kv_cache[block_table[b, pos // page].long(), pos % page].float()  # [n, C + R]
        s = (q[b].float() @ rows.t()) * softmax_scale  # [H, n]
        lse[b] = torch.logsumexp(s, dim=-1)
        out[b] = torch.softmax(s, dim=-1) @ rows[:, :c]
    return out.to(q.dtype), lse


def mla_decode_ref(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv: torch.Tensor,
    pe: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's op over a contiguous per-sequence latent cache (its torch backend's layout).

    ``q_latent[B,H,C]``, ``q_pe[B,H,R]``, ``kv[B,T,C]``, ``pe[B,T,R]``; sequence ``b`` attends to cache rows
    ``0..lengths[b]-1``. Returns ``(o_latent[B,H,C] in q's dtype, lse[B,H] fp32)``, fp32 math.
    """
    scores = (torch.einsum("bhc,btc->bht", q_latent.float(), kv.float())
              + torch.einsum("bhr,btr->bht", q_pe.float(), pe.float())) * scale
    t = torch.arange(kv.shape[1], device=kv.device)
    scores = scores.masked_fill((t[None, :] >= lengths[:, None]).unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.einsum("bht,btc->bhc", torch.exp(scores - lse.unsqueeze(-1)), kv.float())
    return o.to(q_latent.dtype), lse


def _check_paged(q, kv_cache, block_table, seq_lens) -> None:
    if q.dim() != 3:
        raise ValueError(f"mla_decode: q must be [batch, heads, latent + rope], got {tuple(q.shape)}")
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"mla_decode: kv_cache must be [pages, page_size, {q.shape[-1]}] (q's width), got {tuple(kv_cache.shape)}"
        )
    if block_table.dim() != 2 or block_table.shape[0] != q.shape[0]:
        raise ValueError(
            f"mla_decode: block_table must be [batch={q.shape[0]}, max_pages], got {tuple(block_table.shape)}"
        )
    if tuple(seq_lens.shape) != (q.shape[0],):
        raise ValueError(f"mla_decode: seq_lens must be [batch={q.shape[0]}], got {tuple(seq_lens.shape)}")
    if q.dtype != kv_cache.dtype:
        raise ValueError(f"mla_decode: q is {q.dtype} but kv_cache is {kv_cache.dtype}")


@dataclass(frozen=True)
class DecodeConfig:
    block_h: int
    block_n: int
    num_splits: int
    num_warps: int
    num_stages: int
    fused_merge: bool = False  # the last split of a (sequence, head block) merges, from L2 (slower: decode_config)
    pdl: bool = False  # sm90+: programmatic dependent launch of the split and merge kernels
    prefetch: bool = False  # with pdl: each split's first tile is pulled into L2 before the wait
    persistent: int = 0  # > 0: that many programs per head block walk all sequences' tiles in one balanced wave
    transposed: bool = False  # tokens on the MMA's M side, heads on N (Sᵀ = K·Qᵀ): wgmma-shaped at 16 heads


def decode_config(
    batch: int, heads: int, max_context: int, capability: tuple[int, int] | None, num_sms: int = 132
) -> DecodeConfig:
    """Tiles and split count. ``max_context`` is the cache's capacity (a shape, never a device read, so
    the choice is fixed under CUDA-graph capture).

    Up to 16 heads, measured on H200 (benchmarks/tune_heavy.py, parity-checked in the same run): one page
    (64 tokens, 74 KB) a stage, two stages, 8 warps, and as many splits as make about two waves of programs,
    down to one 64-token tile per split: b=128 ctx 4k 2 splits 170 µs (84 % of copy; 32-token tiles with 3
    splits 242 µs), b=32 4k 8 splits 53 µs (67 %), b=32 32k 8 splits 326 µs (87 %), b=1 4k 64 splits
    10.3 µs. Parts whose shared memory cannot hold two 64-token stages (sm120, ~99 KB) and head blocks of
    32 keep 32-token tiles (two of them fit everywhere) and the earlier split rule. ``fused_merge`` (the
    last split of each sequence and head block merges the partials from L2, no second launch) measured
    slower on H200 (b=32 4k: 60.5 µs against 53.1; b=32 32k: 350 against 331): one program then reads all
    splits' fp32 partials of its head block alone (256 KB), a serial tail longer than the launch it saves.
    """
    block_h = 16 if heads <= 16 else 32
    if capability is None:
        return DecodeConfig(16, 32, max(1, min(4, triton.cdiv(max_context, 32))), 4, 1)
    q_bytes = block_h * (LATENT + ROPE) * 2
    programs = batch * triton.cdiv(heads, block_h)
    if block_h == 16 and fit_stages(2, 64 * (LATENT + ROPE) * 2, capability, fixed=q_bytes) == 2:
        splits = max(1, min(2 * num_sms // programs, triton.cdiv(max_context, 64), 64))
        return DecodeConfig(16, 64, splits, 8, 2)
    block_n = 32
    # two waves of programs, and no split longer than 2048 tokens
    want = max(triton.cdiv(2 * num_sms, programs), triton.cdiv(max_context, 2048))
    splits = max(1, min(want, triton.cdiv(max_context, 4 * block_n), 64))
    stages = fit_stages(2, block_n * (LATENT + ROPE) * 2, capability, fixed=q_bytes)
    return DecodeConfig(block_h, block_n, splits, 4 if block_h == 16 else 8, stages)


@triton.jit
def _mla_split_kernel(
    ql_ptr, qr_ptr, kv_ptr, pe_ptr, bt_ptr, len_ptr, o_ptr, lse_ptr,
    scale_log2, H, PAGE_SIZE, NUM_SPLITS, C, R,
    stride_qlb, stride_qlh, stride_qrb, stride_qrh,
    stride_kvp, stride_kvt, stride_pep, stride_pet, stride_btb,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    fo_ptr, flse_ptr, cnt_ptr, stride_fob, stride_foh, stride_flb, stride_flh, NUM_HB, NUM_PAGES, MAX_T,
    D_LAT: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    F32_DOT: tl.constexpr, IN_PAGE: tl.constexpr, PREC: tl.constexpr, FUSED: tl.constexpr, EXACT: tl.constexpr,
    PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False, LINE: tl.constexpr = 64, TRANS: tl.constexpr = False,
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    hb = tl.program_id(2)
    if PREFETCH:
        # before the wait the block table and lengths may still be changing: they only pick which lines to
        # pull into L2 (clamped to real pages); everything below re-reads them after the wait
        n0 = tl.load(len_ptr + b).to(tl.int32)
        c0 = tl.cdiv(tl.cdiv(n0, NUM_SPLITS), BLOCK_N) * BLOCK_N
        tp = tl.minimum(split * c0 + tl.arange(0, BLOCK_N), tl.maximum(n0 - 1, 0))
        tp = tl.minimum(tl.maximum(tp, 0), MAX_T - 1)  # inside the block table whatever the lengths say
        pg = tl.load(bt_ptr + b * stride_btb + tp // PAGE_SIZE)
        pg = tl.minimum(tl.maximum(pg, 0), NUM_PAGES - 1).to(tl.int64)
        sl = tp % PAGE_SIZE
        lines = tl.minimum(tl.arange(0, D_LAT // LINE) * LINE, C - 1)
        l2_prefetch(kv_ptr + (pg * stride_kvp + sl * stride_kvt)[:, None] + lines[None, :])
        l2_prefetch(pe_ptr + pg * stride_pep + sl * stride_pet)
    pdl_prologue(PDL)
    seq_len = tl.load(len_ptr + b).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    d_lat = tl.arange(0, D_LAT)
    d_rope = tl.arange(0, D_ROPE)
    c_ok = d_lat < C
    r_ok = d_rope < R
    q_lat = tl.load(ql_ptr + b * stride_qlb + heads[:, None] * stride_qlh + d_lat[None, :],
                    mask=h_ok[:, None] & c_ok[None, :], other=0.0)
    q_pe = tl.load(qr_ptr + b * stride_qrb + heads[:, None] * stride_qrh + d_rope[None, :],
                   mask=h_ok[:, None] & r_ok[None, :], other=0.0)
    if F32_DOT:
        q_lat = q_lat.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    if TRANS:
        acc = tl.zeros((D_LAT, BLOCK_H), dtype=tl.float32)
        q_lat_t = tl.trans(q_lat)
        q_pe_t = tl.trans(q_pe)
    else:
        acc = tl.zeros((BLOCK_H, D_LAT), dtype=tl.float32)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        t_ok = t < end
        if IN_PAGE:  # the tile lies in one page: one block-table read, rows at a constant stride
            page = tl.load(bt_ptr + b * stride_btb + t0 // PAGE_SIZE).to(tl.int64)
            slot = t0 % PAGE_SIZE + tl.arange(0, BLOCK_N)
        else:
            page = tl.load(bt_ptr + b * stride_btb + t // PAGE_SIZE, mask=t_ok, other=0).to(tl.int64)
            slot = t % PAGE_SIZE
        kv = tl.load(kv_ptr + (page * stride_kvp + slot * stride_kvt)[:, None] + d_lat[None, :],
                     mask=t_ok[:, None] & c_ok[None, :], other=0.0)
        k_pe = tl.load(pe_ptr + (page * stride_pep + slot * stride_pet)[:, None] + d_rope[None, :],
                       mask=t_ok[:, None] & r_ok[None, :], other=0.0)
        if F32_DOT:
            kv = kv.to(tl.float32)
            k_pe = k_pe.to(tl.float32)
        if TRANS:
            # tokens as the MMA's M side and heads as its N: Sᵀ = K·Qᵀ, Oᵀ = Vᵀ·Pᵀ, so a 64-token tile feeds
            # wgmma (M ≥ 64) even with 16 heads, both operands from shared memory
            st = tl.dot(kv, q_lat_t, input_precision=PREC)
            st = tl.dot(k_pe, q_pe_t, st, input_precision=PREC)
            st = tl.where(t_ok[:, None], st * scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(st, 0))
            alpha = tl.exp2(m_i - m_new)
            pt = tl.exp2(st - m_new[None, :])
            l_i = l_i * alpha + tl.sum(pt, 0)
            if F32_DOT:
                pt_dot = pt.to(ql_ptr.dtype.element_ty).to(tl.float32)
            else:
                pt_dot = pt.to(kv.dtype)
            acc = acc * alpha[None, :] + tl.dot(tl.trans(kv), pt_dot, input_precision=PREC)
        else:
            s = tl.dot(q_lat, tl.trans(kv), input_precision=PREC)
            s = tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PREC)
            s = tl.where(t_ok[None, :], s * scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if F32_DOT:  # the same products, with p rounded as the tensor-core path rounds it
                p_dot = p.to(ql_ptr.dtype.element_ty).to(tl.float32)
            else:
                p_dot = p.to(kv.dtype)
            acc = acc * alpha[:, None] + tl.dot(p_dot, kv, input_precision=PREC)
        m_i = m_new

    empty = l_i == 0.0
    if TRANS:
        out = tl.trans(acc) / tl.where(empty, 1.0, l_i)[:, None]
    else:
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    o_ptrs = o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d_lat[None, :]
    tl.store(o_ptrs, out, mask=h_ok[:, None] & c_ok[None, :])
    tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse2, mask=h_ok)
    if FUSED:
        # every thread's partial is stored before one thread counts this split in (release); the split that
        # counts last (acquire) merges all of them while they are still in L2, and resets the counter
        tl.debug_barrier()
        cnt = cnt_ptr + b * NUM_HB + hb
        done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if done == NUM_SPLITS - 1:
            lse_row = lse_ptr + b * stride_lb + heads * stride_lh
            m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
            for s in range(NUM_SPLITS):
                m = tl.maximum(m, tl.load(lse_row + s, mask=h_ok, other=float("-inf"), cache_modifier=".cg"))
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            total = tl.zeros((BLOCK_H,), dtype=tl.float32)
            merged = tl.zeros((BLOCK_H, D_LAT), dtype=tl.float32)
            for s in range(NUM_SPLITS):
                ls = tl.load(lse_row + s, mask=h_ok, other=float("-inf"), cache_modifier=".cg")
                w = tl.where(ls == float("-inf"), 0.0, tl.exp2(ls - m_safe))
                part = tl.load(o_ptr + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + d_lat[None, :],
                               mask=h_ok[:, None] & c_ok[None, :], other=0.0, cache_modifier=".cg")
                total += w
                merged += part * w[:, None]
            res = merged / tl.where(total == 0.0, 1.0, total)[:, None]
            tl.store(fo_ptr + b * stride_fob + heads[:, None] * stride_foh + d_lat[None, :],
                     cast_rne(res, fo_ptr.dtype.element_ty, EXACT), mask=h_ok[:, None] & c_ok[None, :])
            total = tl.where(total == 0.0, 1.0, total)  # head slots past H: nothing merged, nothing stored
            tl.store(flse_ptr + b * stride_flb + heads * stride_flh, (m_safe + tl.log2(total)) / 1.4426950408889634,
                     mask=h_ok)
            tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


@triton.jit
def _mla_merge_kernel(
    po_ptr, plse_ptr, o_ptr, lse_ptr, NUM_SPLITS, C,
    stride_pb, stride_ph, stride_ps, stride_lpb, stride_lph,
    stride_ob, stride_oh, stride_lb, stride_lh,
    SPLITS_P2: tl.constexpr, D_LAT: tl.constexpr, EXACT: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl_prologue(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_P2)
    s_ok = s < NUM_SPLITS
    lse = tl.load(plse_ptr + b * stride_lpb + h * stride_lph + s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - m))
    total = tl.sum(w, 0)
    d = tl.arange(0, D_LAT)
    d_ok = d < C
    part = tl.load(
        po_ptr + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + d[None, :],
        mask=s_ok[:, None] & d_ok[None, :], other=0.0,
    )
    out = tl.sum(part * w[:, None], 0) / total
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, cast_rne(out, o_ptr.dtype.element_ty, EXACT), mask=d_ok)
    tl.store(lse_ptr + b * stride_lb + h * stride_lh, (m + tl.log2(total)) / 1.4426950408889634)


@triton.jit
def _schedule(len_ptr, B, BI: tl.constexpr, BLOCK_N: tl.constexpr):
    """All sequences' tiles in one list, sequence after sequence: (tiles per sequence, their inclusive
    prefix sum, the total), from ``seq_lens`` on the device (so nothing waits on the host)."""
    bi = tl.arange(0, BI)
    lens = tl.load(len_ptr + bi, mask=bi < B, other=0).to(tl.int32)
    tiles = (lens + BLOCK_N - 1) // BLOCK_N
    ends = tl.cumsum(tiles, 0)
    return bi, lens, tiles, ends, tl.sum(tiles, 0)


@triton.jit
def _mla_persistent_kernel(
    ql_ptr, qr_ptr, kv_ptr, pe_ptr, bt_ptr, len_ptr, po_ptr, plse_ptr,
    scale_log2, B, H, PAGE_SIZE, C, R, NUM_PAGES, MAX_T,
    stride_qlb, stride_qlh, stride_qrb, stride_qrh,
    stride_kvp, stride_kvt, stride_pep, stride_pet, stride_btb,
    stride_pos, stride_poh, stride_pls,
    NUM_PROGS: tl.constexpr, BI: tl.constexpr,
    D_LAT: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    F32_DOT: tl.constexpr, IN_PAGE: tl.constexpr, PREC: tl.constexpr,
    PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False, LINE: tl.constexpr = 64,
):
    """One balanced wave: the tiles of all sequences form one list and program ``p`` takes the ``p``-th
    ``1/NUM_PROGS`` of it, whatever sequences that spans. Where its range enters or leaves a sequence it
    writes a partial (output, LSE) for that (sequence, program) pair as segment ``b + p`` (unique: a
    program and a sequence both advance along the list), so each program pays its prologue and pipeline
    fill once and partials exist only where a sequence is cut."""
    p = tl.program_id(0)
    hb = tl.program_id(1)
    d_lat = tl.arange(0, D_LAT)
    d_rope = tl.arange(0, D_ROPE)
    c_ok = d_lat < C
    r_ok = d_rope < R
    if PREFETCH:  # the schedule from lengths that may still change: it only picks lines to pull into L2
        bi0, lens0, tiles0, ends0, total0 = _schedule(len_ptr, B, BI, BLOCK_N)
        gp = (p * total0) // NUM_PROGS
        bp = tl.minimum(tl.sum((ends0 <= gp).to(tl.int32), 0), B - 1)
        jp = gp - tl.sum(tl.where(bi0 == bp, ends0 - tiles0, 0), 0)
        tp = tl.minimum(tl.maximum(jp * BLOCK_N + tl.arange(0, BLOCK_N), 0), MAX_T - 1)
        pg = tl.load(bt_ptr + bp * stride_btb + tp // PAGE_SIZE)
        pg = tl.minimum(tl.maximum(pg, 0), NUM_PAGES - 1).to(tl.int64)
        sl = tp % PAGE_SIZE
        lines = tl.minimum(tl.arange(0, D_LAT // LINE) * LINE, C - 1)
        l2_prefetch(kv_ptr + (pg * stride_kvp + sl * stride_kvt)[:, None] + lines[None, :])
        l2_prefetch(pe_ptr + pg * stride_pep + sl * stride_pet)
    pdl_prologue(PDL)
    bi, lens, tiles, ends, total = _schedule(len_ptr, B, BI, BLOCK_N)
    g0 = (p * total) // NUM_PROGS
    g1 = ((p + 1) * total) // NUM_PROGS
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, D_LAT), dtype=tl.float32)
    for g in range(g0, g1):
        b = tl.sum((ends <= g).to(tl.int32), 0)
        first_tile = tl.sum(tl.where(bi == b, ends - tiles, 0), 0)
        seq_len = tl.sum(tl.where(bi == b, lens, 0), 0)
        j = g - first_tile
        t0 = j * BLOCK_N
        t = t0 + tl.arange(0, BLOCK_N)
        t_ok = t < seq_len
        if IN_PAGE:
            page = tl.load(bt_ptr + b * stride_btb + t0 // PAGE_SIZE).to(tl.int64)
            slot = t0 % PAGE_SIZE + tl.arange(0, BLOCK_N)
        else:
            page = tl.load(bt_ptr + b * stride_btb + t // PAGE_SIZE, mask=t_ok, other=0).to(tl.int64)
            slot = t % PAGE_SIZE
        kv = tl.load(kv_ptr + (page * stride_kvp + slot * stride_kvt)[:, None] + d_lat[None, :],
                     mask=t_ok[:, None] & c_ok[None, :], other=0.0)
        k_pe = tl.load(pe_ptr + (page * stride_pep + slot * stride_pet)[:, None] + d_rope[None, :],
                       mask=t_ok[:, None] & r_ok[None, :], other=0.0)
        start = (g == g0) | (j == 0)  # a new segment: fresh running max / sum / output
        # the query is re-read each tile (L1/L2-resident, 18 KB against the tile's 74 KB): carried across
        # iterations it would hold another 16×576 values in registers, and the kernel spills
        q_lat = tl.load(ql_ptr + b * stride_qlb + heads[:, None] * stride_qlh + d_lat[None, :],
                        mask=h_ok[:, None] & c_ok[None, :], other=0.0)
        q_pe = tl.load(qr_ptr + b * stride_qrb + heads[:, None] * stride_qrh + d_rope[None, :],
                       mask=h_ok[:, None] & r_ok[None, :], other=0.0)
        if F32_DOT:
            q_lat = q_lat.to(tl.float32)
            q_pe = q_pe.to(tl.float32)
        m_i = tl.where(start, float("-inf"), m_i)
        l_i = tl.where(start, 0.0, l_i)
        acc = tl.where(start, 0.0, acc)
        if F32_DOT:
            kv = kv.to(tl.float32)
            k_pe = k_pe.to(tl.float32)
        s = tl.dot(q_lat, tl.trans(kv), input_precision=PREC)
        s = tl.dot(q_pe, tl.trans(k_pe), s, input_precision=PREC)
        s = tl.where(t_ok[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        pr = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, 1)
        if F32_DOT:
            p_dot = pr.to(ql_ptr.dtype.element_ty).to(tl.float32)
        else:
            p_dot = pr.to(kv.dtype)
        acc = acc * alpha[:, None] + tl.dot(p_dot, kv, input_precision=PREC)
        m_i = m_new
        if (g == g1 - 1) | (j == tl.sum(tl.where(bi == b, tiles, 0), 0) - 1):  # the segment ends here
            seg = b + p
            tl.store(po_ptr + seg * stride_pos + heads[:, None] * stride_poh + d_lat[None, :], acc / l_i[:, None],
                     mask=h_ok[:, None] & c_ok[None, :])
            tl.store(plse_ptr + seg * stride_pls + heads, m_i + tl.log2(l_i), mask=h_ok)


@triton.jit
def _mla_persistent_merge_kernel(
    po_ptr, plse_ptr, len_ptr, o_ptr, lse_ptr, B, C,
    stride_pos, stride_poh, stride_pls, stride_ob, stride_oh, stride_lb, stride_lh,
    NUM_PROGS: tl.constexpr, BI: tl.constexpr, BLOCK_N: tl.constexpr, D_LAT: tl.constexpr,
    EXACT: tl.constexpr, PDL: tl.constexpr = False,
):
    """Sequence ``b``'s segments are those of the programs whose ranges meet its tiles: ``p`` holds tile
    ``x`` when ``p = ((x + 1)·P − 1) // total``; merged by their LSEs (online, in log2)."""
    pdl_prologue(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    bi, lens, tiles, ends, total = _schedule(len_ptr, B, BI, BLOCK_N)
    e = tl.sum(tl.where(bi == b, ends, 0), 0)
    s0 = e - tl.sum(tl.where(bi == b, tiles, 0), 0)
    p_first = ((s0 + 1) * NUM_PROGS - 1) // total
    p_last = (e * NUM_PROGS - 1) // total
    d = tl.arange(0, D_LAT)
    d_ok = d < C
    m = float("-inf")
    w = 0.0
    acc = tl.zeros((D_LAT,), dtype=tl.float32)
    for p in range(p_first, p_last + 1):
        if (p * total) // NUM_PROGS < ((p + 1) * total) // NUM_PROGS:  # programs with empty ranges wrote nothing
            seg = b + p
            ls = tl.load(plse_ptr + seg * stride_pls + h)
            part = tl.load(po_ptr + seg * stride_pos + h * stride_poh + d, mask=d_ok, other=0.0)
            m_new = tl.maximum(m, ls)
            a = tl.exp2(m - m_new)
            x = tl.exp2(ls - m_new)
            acc = acc * a + part * x
            w = w * a + x
            m = m_new
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, cast_rne(acc / w, o_ptr.dtype.element_ty, EXACT), mask=d_ok)
    tl.store(lse_ptr + b * stride_lb + h * stride_lh, (m + tl.log2(w)) / 1.4426950408889634)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _merge_counters(device: torch.device, n: int) -> torch.Tensor:
    """Per (sequence, head block) arrival counters for the fused merge, zero between calls (the merging
    program resets its own); grown on first use of a size, outside graph capture once warmed up."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < n:
        have = _COUNTERS[device] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return have


def _decode(q_lat, q_pe, kv, pe, block_table, seq_lens, page_size, capacity, scale, out, config):
    """Launch split + merge. ``kv``/``pe`` are ``[pages, page_size, C|R]`` views (any page stride)."""
    b_sz, h, c = q_lat.shape
    r = q_pe.shape[-1]
    for name, t in (("q_latent", q_lat), ("q_pe", q_pe), ("kv", kv), ("pe", pe)):
        if t.stride(-1) != 1:
            raise ValueError(f"mla_decode: {name} must be contiguous in its last dim")
    cap = capability(q_lat.device)
    if config is None:
        sms = torch.cuda.get_device_properties(q_lat.device).multi_processor_count if cap else 132
        config = decode_config(b_sz, h, capacity, cap, sms)
    splits = config.num_splits
    if out is None:
        o = torch.empty(b_sz, h, c, dtype=q_lat.dtype, device=q_lat.device)
        lse = torch.empty(b_sz, h, dtype=torch.float32, device=q_lat.device)
    else:
        o, lse = out
        if tuple(o.shape) != (b_sz, h, c) or o.dtype != q_lat.dtype or o.stride(2) != 1:
            raise ValueError(f"mla_decode: out must be [{b_sz}, {h}, {c}] {q_lat.dtype}, got {tuple(o.shape)} {o.dtype}")
        if tuple(lse.shape) != (b_sz, h) or lse.dtype != torch.float32:
            raise ValueError(f"mla_decode: lse must be [{b_sz}, {h}] float32, got {tuple(lse.shape)} {lse.dtype}")
    if b_sz == 0:
        return o, lse
    if config.persistent > 0:
        _decode_persistent(q_lat, q_pe, kv, pe, block_table, seq_lens, page_size, scale, o, lse, config, cap)
        return o, lse
    part_o = torch.empty(b_sz, h, splits, c, dtype=torch.float32, device=q_lat.device)
    part_lse = torch.empty(b_sz, h, splits, dtype=torch.float32, device=q_lat.device)
    d_lat = max(16, triton.next_power_of_2(c))
    d_rope = max(16, triton.next_power_of_2(r))
    n_hb = triton.cdiv(h, config.block_h)
    fused = config.fused_merge and splits > 1
    pdl = config.pdl and pdl_ok(cap)
    launch = {"launch_pdl": True} if pdl else {}
    counters = _merge_counters(q_lat.device, b_sz * n_hb) if fused else part_lse
    _mla_split_kernel[(b_sz, splits, n_hb)](
        q_lat, q_pe, kv, pe, block_table, seq_lens, part_o, part_lse,
        scale * _LOG2E, h, page_size, splits, c, r,
        q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1),
        kv.stride(0), kv.stride(1), pe.stride(0), pe.stride(1), block_table.stride(0),
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        o, lse, counters, o.stride(0), o.stride(1), lse.stride(0), lse.stride(1), n_hb, kv.shape[0],
        block_table.shape[1] * page_size,
        D_LAT=d_lat, D_ROPE=d_rope, BLOCK_H=config.block_h, BLOCK_N=config.block_n, F32_DOT=cap is None,
        IN_PAGE=page_size % config.block_n == 0, PREC=dot_precision(q_lat.dtype), FUSED=fused,
        EXACT=interpreting(), PDL=pdl, PREFETCH=pdl and config.prefetch, LINE=128 // kv.element_size(),
        TRANS=config.transposed, num_warps=config.num_warps, num_stages=config.num_stages, **launch,
    )
    if fused:
        return o, lse
    _mla_merge_kernel[(b_sz, h)](
        part_o, part_lse, o, lse, splits, c,
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        o.stride(0), o.stride(1), lse.stride(0), lse.stride(1),
        SPLITS_P2=triton.next_power_of_2(splits), D_LAT=d_lat, EXACT=interpreting(), PDL=pdl,
        num_warps=4, **launch,
    )
    return o, lse


def _decode_persistent(q_lat, q_pe, kv, pe, block_table, seq_lens, page_size, scale, o, lse, config, cap) -> None:
    """The balanced-wave kernel and its merge: ``config.persistent`` programs per head block; at most
    ``batch + programs`` segments of partials."""
    b_sz, h, c = q_lat.shape
    r = q_pe.shape[-1]
    progs = config.persistent
    n_hb = triton.cdiv(h, config.block_h)
    part_o = torch.empty(b_sz + progs, h, c, dtype=torch.float32, device=q_lat.device)
    part_lse = torch.empty(b_sz + progs, h, dtype=torch.float32, device=q_lat.device)
    d_lat = max(16, triton.next_power_of_2(c))
    d_rope = max(16, triton.next_power_of_2(r))
    bi = max(16, triton.next_power_of_2(b_sz))
    pdl = config.pdl and pdl_ok(cap)
    launch = {"launch_pdl": True} if pdl else {}
    _mla_persistent_kernel[(progs, n_hb)](
        q_lat, q_pe, kv, pe, block_table, seq_lens, part_o, part_lse,
        scale * _LOG2E, b_sz, h, page_size, c, r, kv.shape[0], block_table.shape[1] * page_size,
        q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1),
        kv.stride(0), kv.stride(1), pe.stride(0), pe.stride(1), block_table.stride(0),
        part_o.stride(0), part_o.stride(1), part_lse.stride(0),
        NUM_PROGS=progs, BI=bi, D_LAT=d_lat, D_ROPE=d_rope, BLOCK_H=config.block_h, BLOCK_N=config.block_n,
        F32_DOT=cap is None, IN_PAGE=page_size % config.block_n == 0, PREC=dot_precision(q_lat.dtype),
        PDL=pdl, PREFETCH=pdl and config.prefetch, LINE=128 // kv.element_size(),
        num_warps=config.num_warps, num_stages=config.num_stages, **launch,
    )
    _mla_persistent_merge_kernel[(b_sz, h)](
        part_o, part_lse, seq_lens, o, lse, b_sz, c,
        part_o.stride(0), part_o.stride(1), part_lse.stride(0), o.stride(0), o.stride(1), lse.stride(0), lse.stride(1),
        NUM_PROGS=progs, BI=bi, BLOCK_N=config.block_n, D_LAT=d_lat, EXACT=interpreting(), PDL=pdl,
        num_warps=4, **launch,
    )


def paged_mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    kv_lora_rank: int = LATENT,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: DecodeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of :func:`paged_mla_decode_ref`, writing into ``out=(o, lse)`` when given. No host
    synchronisation, so it can be graph-captured."""
    _check_paged(q, kv_cache, block_table, seq_lens)
    c = kv_lora_rank
    page = kv_cache.shape[1]
    return _decode(q[..., :c], q[..., c:], kv_cache[..., :c], kv_cache[..., c:], block_table, seq_lens,
                   page, block_table.shape[1] * page, softmax_scale, out, config)


def mla_decode(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv: torch.Tensor,
    pe: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: DecodeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of :func:`mla_decode_ref` (the engine op over a contiguous cache): the same kernel,
    with each sequence's cache row as one page."""
    b_sz, t = kv.shape[0], kv.shape[1]
    if pe.shape[:2] != kv.shape[:2] or q_latent.shape[0] != b_sz or tuple(lengths.shape) != (b_sz,):
        raise ValueError(
            f"mla_decode: kv {tuple(kv.shape)}, pe {tuple(pe.shape)}, q_latent {tuple(q_latent.shape)} and "
            f"lengths {tuple(lengths.shape)} must agree on batch and cache length"
        )
    table = torch.arange(b_sz, dtype=torch.int32, device=kv.device).unsqueeze(1)
    return _decode(q_latent, q_pe, kv, pe, table, lengths, max(t, 1), t, scale, out, config)


def bytes_moved(seq_lens: torch.Tensor, heads: int, width: int = LATENT + ROPE, latent: int = LATENT,
                elem: int = 2) -> int:
    """The fewest bytes one call must move: each cached row once, q in, out and LSE back."""
    rows = int(seq_lens.sum())
    b = seq_lens.numel()
    return rows * width * elem + b * heads * (width * elem + latent * elem + 4)


def default_scale(qk_head_dim: int = 192, mscale: float = 1.0) -> float:
    """``mscale² / sqrt(qk_nope + qk_rope)``: the softmax scale DeepSeek-V3 uses with absorbed MLA."""
    return mscale * mscale / math.sqrt(qk_head_dim)


# --- parity ------------------------------------------------------------------------------------------

def paged_inputs(lens, heads, device, gen, dtype=torch.bfloat16, page=PAGE, spare_pages=2):
    """A paged cache holding ``lens[b]`` tokens per sequence on shuffled pages, every other slot NaN
    (so a kernel that reads one fails), and absorbed queries. Returns ``mla_decode``'s keyword inputs."""
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    max_pages = max(-(-n // page) for n in lens)
    n_pages = len(lens) * max_pages + spare_pages
    perm = torch.randperm(n_pages, generator=gen, device=device).to(torch.int32)
    block_table = perm[: len(lens) * max_pages].view(len(lens), max_pages).contiguous()
    cache = torch.full((n_pages, page, LATENT + ROPE), float("nan"), dtype=dtype, device=device)
    for b, n in enumerate(lens):
        pos = torch.arange(n, device=device)
        rows = torch.randn(n, LATENT + ROPE, generator=gen, device=device)
        cache[block_table[b, pos // page].long(), pos % page] = rows.to(dtype)
    q = torch.randn(len(lens), heads, LATENT + ROPE, generator=gen, device=device).to(dtype)
    return {"q": q, "kv_cache": cache, "block_table": block_table, "seq_lens": lens_t,
            "softmax_scale": default_scale()}


def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    p = case.params
    return paged_inputs(p["lens"], p["heads"], device, gen, case.dtype)


_GPU = ("cuda",)

SPEC = ParitySpec(
    op="paged_mla_decode",
    make_inputs=_inputs,
    reference=paged_mla_decode_ref,
    kernel=lambda out, **inp: paged_mla_decode(**inp, out=out),
    cases=[
        Case("b3 h5 ragged", {"lens": [1, 70, 150], "heads": 5}),
        Case("b2 h16 page-edge", {"lens": [64, 128], "heads": 16}),
        Case("b1 h20 two head blocks", {"lens": [97], "heads": 20}),
        Case("b4 h16 4k ragged", {"lens": [4096, 1, 3000, 65], "heads": 16}, devices=_GPU),
        Case("b32 h16 4k", {"lens": [4096] * 32, "heads": 16}, devices=_GPU),
        Case("b2 h128 32k ragged", {"lens": [32768, 20001], "heads": 128}, devices=_GPU),
        Case("b64 h128 mixed", {"lens": [(i * 977) % 6000 + 1 for i in range(64)], "heads": 128}, devices=_GPU),
    ],
    checks=[
        Check("gemm_diff", 1e-5, "bf16 probabilities into an fp32-accumulated PV; FlashMLA's cos_diff bound",
              name="out"),
        Check("lse_abs", 1e-5, "fp32 scores over 576-wide dots in another order, exp2/log2 approximations: "
              "~10 fp32 ulps at |lse| in 8..16 (H200: ≤ 3.8e-6 on the paged sweep)", output=1, name="lse"),
    ],
    description="absorbed MLA decode over a paged 512+64 latent cache, split-KV with an LSE merge",
)


def _dense_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    """The engine's contiguous layout: rows past ``lengths[b]`` hold NaN, as a stale cache might."""
    p = case.params
    lens, h, c, r, t = p["lens"], p["heads"], p["c"], p["r"], p["t"]
    kv = torch.randn(len(lens), t, c, generator=gen, device=device)
    pe = torch.randn(len(lens), t, r, generator=gen, device=device)
    for b, n in enumerate(lens):
        kv[b, n:] = float("nan")
        pe[b, n:] = float("nan")
    return {"q_latent": torch.randn(len(lens), h, c, generator=gen, device=device).to(case.dtype),
            "q_pe": torch.randn(len(lens), h, r, generator=gen, device=device).to(case.dtype),
            "kv": kv.to(case.dtype), "pe": pe.to(case.dtype),
            "lengths": torch.tensor(lens, device=device), "scale": default_scale()}


def _dense_ref(**inp):
    """The reference masks by ``-inf`` but still multiplies NaN rows by zero; read only the valid rows."""
    n = int(inp["lengths"].max())
    return mla_decode_ref(**{**inp, "kv": inp["kv"][:, :n].nan_to_num(0.0), "pe": inp["pe"][:, :n].nan_to_num(0.0)})


SPEC_DENSE = ParitySpec(
    op="mla_decode",
    make_inputs=_dense_inputs,
    reference=_dense_ref,
    kernel=lambda out, **inp: mla_decode(**inp, out=out),
    cases=[
        Case("tiny b3 h4 c32 r8", {"lens": [1, 9, 40], "heads": 4, "c": 32, "r": 8, "t": 48}),
        Case("small b2 h16 c512 r64", {"lens": [5, 77], "heads": 16, "c": 512, "r": 64, "t": 80}),
        Case("tiny b2 h4 fp32", {"lens": [3, 30], "heads": 4, "c": 32, "r": 8, "t": 32}, dtype=torch.float32),
        Case("b32 h16 c512 r64 2k", {"lens": [2048 - 37 * i for i in range(32)], "heads": 16, "c": 512, "r": 64,
                                     "t": 2048}, devices=_GPU),
    ],
    checks=[Check(c.metric, c.tol, c.why, c.output, c.name, dtypes=(torch.bfloat16,)) for c in SPEC.checks] + [
        Check("gemm_diff", 1e-10, "fp32 operands multiply in full fp32 (not tf32)", name="out",
              dtypes=(torch.float32,)),
        Check("lse_abs", 1e-5, "as for bf16", output=1, name="lse", dtypes=(torch.float32,)),
    ],
    description="absorbed MLA decode over the engine's contiguous latent cache (same kernel, one page per row)",
)
