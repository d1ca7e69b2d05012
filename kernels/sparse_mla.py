"""Attention with a learnable sink over V4's shared key/value head, dense-masked (the engine's oracle) and
sparse over the 584-byte paged FP8 pool (decode).

The sink is one logit per head that joins the softmax's denominator and contributes no value, so a head
can attend to "nothing". Keys are also values (MQA with one 512-wide head).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels._launch import launch
from kernels._tl import cast_rne, e4m3_to_f32
from kernels.arch import capability, fp8_hw_cast, interpreting
from kernels.harness import Case, Check, ParitySpec


def sink_attention_ref(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """``q[B, S, H, D]`` against ``kv[B, T, D]`` where ``mask[B, S, T]``; fp32 softmax with ``sinks[H]``;
    returns ``[B, S, H, D]`` in ``q.dtype``."""
    s = torch.einsum("bshd,btd->bsht", q.float(), kv.float()) * scale
    s = s.masked_fill(~mask.unsqueeze(2), float("-inf"))
    sink = sinks.float().view(1, 1, -1, 1).expand(*s.shape[:3], 1)
    logits = torch.cat([s, sink], dim=-1)
    p = (logits - logits.amax(dim=-1, keepdim=True)).softmax(dim=-1)[..., :-1]
    return torch.einsum("bsht,btd->bshd", p, kv.float()).to(q.dtype)


def sparse_mla_decode_ref(q: torch.Tensor, pool: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """Decode over the 584-byte pool: ``q[B, H, 512]`` attends to the slots ``indices[B, K]`` (``-1``: none;
    the window's tokens and the indexer's picks), keys dequantised exactly; returns ``[B, H, 512]``."""
    from kernels.kv584 import kv584_load_ref

    b, k = indices.shape
    kv = kv584_load_ref(pool, indices.reshape(-1)).view(b, k, -1)
    return sink_attention_ref(q.unsqueeze(1), kv, (indices >= 0).unsqueeze(1), sinks, scale)[:, 0]


# --- Triton ------------------------------------------------------------------------------------------
#
# One program per (row, chunk of its slots, block of heads). Every head of a row attends to the same slots
# (one shared key/value head), so a program gathers and dequantises each tile of BLOCK_T slots once and
# feeds it to all BLOCK_H heads' tensor-core dots (64 heads: the wgmma M; the 64 × 512 fp32 accumulator
# takes 8 warps). A row's 512 channels are kept as four power-of-two parts that match the 584-byte row:
# nope tiles 0-3 (256 fp8 bytes), 4-5 (128), 6 (64) and the rope (64 bf16), so every load is a full-width
# vector with no column mask, and the scale of each 64-channel tile comes from one 8-byte word per row.
#
# With 8 warps the compiler gives a score dot that feeds a value dot to all warps along M, i.e. each of the
# two warpgroups computes the whole 64 × BLOCK_T score tile (twice the score MMAs and softmax work). With
# ``xchg`` the probabilities reach the value dots through a small per-program scratch in memory instead, so
# the score tile is split over both warpgroups; the barrier this takes stops the compiler's load
# pipelining, which is why the other paths (``num_stages`` > 1, or ``prefetch`` into registers) remain.
# The variants are timed side by side by benchmarks/sparse_mla_sweep.py.

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class SparseConfig:
    """One launch's tiles: ``block_h`` heads share each gathered tile of ``block_t`` slots; a row's slots are
    cut into ``n_split`` chunks, merged with the sink by :func:`_combine_kernel` (partials in fp32, or bf16
    with ``part_bf16``)."""

    block_h: int
    block_t: int
    n_split: int
    num_warps: int
    num_stages: int = 1
    prefetch: bool = True
    part_bf16: bool = False
    lazy: bool = True
    xchg: bool = False
    idx_prefetch: bool = False
    fused_combine: bool = False
    l2_prefetch: int = 0  # tiles ahead (0: none)
    fast_launch: bool = True
    gluon: bool = False  # the Gluon kernel (sm90, 64 heads a block, 64-slot tiles, num_stages ring stages)
    early_parts: int = 4  # Gluon: parts of a tile dequantised while the last tile's value MMAs run (1-4)
    wg_sums: bool = False  # Gluon: each warpgroup keeps its own running sums (no cross-warpgroup sum a tile)
    idx_ahead: bool = False  # Gluon: every slot number loaded a trip before the gather/mask that uses it
    q_async: bool = False  # Gluon: a bf16 q reaches shared memory by cp.async, with the first tile's gathers
    warp_spec: bool = False  # Gluon: the warp-specialised kernel (32-slot tiles, num_stages ring stages)
    score_split: bool = False  # warp-specialised: each consumer computes the scores over half the channels
    producers: int = 1  # warp-specialised: producer warpgroups (1 or 2; two take alternate tiles)
    row_warps: bool = False  # Gluon: nope tiles 0-3 (4-5) copied and dequantised a whole row (two rows) a warp,
    # so that no two of a warp's shared-memory accesses share a bank


def sparse_config(batch: int, heads: int, k: int, cap: tuple[int, int] | None, low: bool = True,
                  num_sms: int = 132) -> SparseConfig:
    """Tiles and split count for ``batch`` rows of ``heads`` heads over ``k`` slots each.

    On a GPU with a 16-bit q: all heads of a row in one program (up to 64, 8 warps: the fp32 accumulator
    of 64 × 512 takes two warpgroups), and as many chunks per row as keep one wave of programs (``num_sms``
    of them; a program holds about 200 KB of registers and shared memory, so one fits an SM). fp32 q (the
    engine's oracle runs) keeps small tiles with fp32 dots. The interpreter splits small cases to test it.
    """
    bh = min(64, max(16, triton.next_power_of_2(max(1, heads))))
    if cap is None:
        return SparseConfig(bh, 16, 2 if k > 32 else 1, 1)
    if not low:
        hb = triton.cdiv(heads, 16)
        return SparseConfig(16, 16, max(1, min(triton.cdiv(k, 64), triton.cdiv(4 * num_sms, max(1, batch * hb)))),
                            4, 1, False)
    bt = 64
    progs = max(1, batch * triton.cdiv(heads, bh))
    n_split = max(1, min(num_sms // progs, triton.cdiv(k, 2 * bt)))
    if bh < 64:  # one warpgroup holds the accumulator; its score tile is not split, so nothing to exchange
        return SparseConfig(bh, bt, n_split, 4, 2, False, lazy=False)
    if GLUON_DEFAULT is not None and HAVE_GLUON and cap[0] == 9:  # sm90: the Gluon kernel
        return dataclasses.replace(SparseConfig(bh, bt, n_split, 8, 2, gluon=True), **GLUON_DEFAULT)
    # H200, round of 2026-12-01 (copy ceiling 4227 GB/s; benchmarks/sparse_mla_sweep.py "x64e-l2"): b32 39.1 us,
    # b64 52.2 us, b128 81.9 us device time (9.8 / 14.7 / 18.8 % of copy); the kernel before: 105 / 175 / 335 us
    return SparseConfig(bh, bt, n_split, 8, 1, False, lazy=False, xchg=True, l2_prefetch=1)


# the Gluon kernel's knobs when it is sm90's default (None: the tl kernel stays the default): the L2 prefetch a
# tile ahead, every slot number loaded a trip before its use, the fused combine (the row's last chunk merges)
# and a bf16 q by cp.async. H200, rounds of 2026-12-01 17:27 / 17:58 / 18:28 (benchmarks/sparse_mla_sweep.py
# "g2-all", copy 4227 / 4249 / 4229 GB/s): b32 34.1 / 34.0 / 34.6 us, b64 42.5 / 42.5 / 43.0 us, b128 61.3 /
# 60.6 / 60.6 us (25.3 % of copy at b128), against 35.5 / 35.7 / 35.4, 45.4 / 45.1 / 45.3, 62.8 / 62.5 / 62.6
# us for the L2 prefetch alone ("g2-l2", the default before) in the same runs; gemm_diff 2.7e-6 in all. Plus
# nope tiles a row a warp and 2 parts dequantised early ("g2-cf-e2"): rounds of 18:28 / 18:48 (copy 4229 / 4252
# GB/s) 34.4 / 33.8, 42.5 / 42.0, 58.1 / 59.4 us (g2-all 61.6, g2-l2 63.2 us at b128 in the 18:48 run)
GLUON_DEFAULT: dict | None = {"l2_prefetch": 1, "idx_ahead": True, "fused_combine": True, "q_async": True,
                               "row_warps": True, "early_parts": 2}


@triton.jit
def _gather(pool_ptr, pool16_ptr, pool64_ptr, idx_ptr, row, K, t0, hi, BLOCK_T: tl.constexpr, ROW: tl.constexpr,
            WIDE: tl.constexpr):
    """The raw bytes of the slots ``t0 .. t0+BLOCK_T`` (below ``hi``) of ``row``: nope tiles 0-3, 4-5 and 6
    (uint8), the rope (int16), each row's scale word (int64, byte j = tile j) and which slots are valid.
    Byte offsets are int32 unless the pool is 2 GiB or more (``WIDE``): half the registers for the next
    tile's addresses, which the pipelined loop keeps live."""
    slot = _slots(idx_ptr, row, K, t0, hi, BLOCK_T)
    return _rows(pool_ptr, pool16_ptr, pool64_ptr, slot, ROW, WIDE)


@triton.jit
def _prefetch_rows(pool_ptr, idx_ptr, row, K, t0, hi, BLOCK_T: tl.constexpr, ROW: tl.constexpr):
    """Ask L2 for the rows of the slots ``t0 .. t0+BLOCK_T``: one ``prefetch.global.L2`` every 80 bytes of
    each row (so every 128-byte line it spans), nothing waits on them and no register holds the bytes."""
    t = t0 + tl.arange(0, BLOCK_T)
    slot = tl.load(idx_ptr + row * K + t, mask=t < hi, other=-1)
    at = pool_ptr + (tl.maximum(slot, 0).to(tl.int64) * ROW)[:, None] + (tl.arange(0, 8) * 80)[None, :]
    at = tl.where((slot >= 0)[:, None], at, pool_ptr)
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                     [at.to(tl.int64, bitcast=True)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _slots(idx_ptr, row, K, t0, hi, BLOCK_T: tl.constexpr):
    t = t0 + tl.arange(0, BLOCK_T)
    return tl.load(idx_ptr + row * K + t, mask=t < hi, other=-1)


@triton.jit
def _rows(pool_ptr, pool16_ptr, pool64_ptr, slot, ROW: tl.constexpr, WIDE: tl.constexpr):
    if WIDE:
        slot = slot.to(tl.int64)
    ok = slot >= 0
    sl = tl.maximum(slot, 0)
    base = sl * ROW
    c256 = tl.arange(0, 256)
    c128 = tl.arange(0, 128)
    c64 = tl.arange(0, 64)
    n0 = tl.load(pool_ptr + base[:, None] + c256[None, :], mask=ok[:, None], other=0)
    n1 = tl.load(pool_ptr + base[:, None] + 256 + c128[None, :], mask=ok[:, None], other=0)
    n2 = tl.load(pool_ptr + base[:, None] + 384 + c64[None, :], mask=ok[:, None], other=0)
    r = tl.load(pool16_ptr + (sl * (ROW // 2))[:, None] + 224 + c64[None, :], mask=ok[:, None], other=0)
    w = tl.load(pool64_ptr + sl * (ROW // 8) + 72, mask=ok, other=0)
    return n0, n1, n2, r, w, ok


@triton.jit
def _fp8(byte, HW_CAST: tl.constexpr):
    if HW_CAST:
        return byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return e4m3_to_f32(byte)


@triton.jit
def _dequant(byte, w, FIRST: tl.constexpr, NT: tl.constexpr, BLOCK_T: tl.constexpr, HW_CAST: tl.constexpr,
             DT: tl.constexpr):
    """``NT`` nope tiles from tile ``FIRST``: e4m3 times 2^(e-127), exact in ``DT`` (bf16 or fp32)."""
    j = FIRST + tl.arange(0, NT)
    e = ((w[:, None] >> (8 * j).to(tl.int64)[None, :]) & 0xFF).to(tl.int32)
    sc = (e << 23).to(tl.float32, bitcast=True)
    v = tl.reshape(tl.reshape(_fp8(byte, HW_CAST), [BLOCK_T, NT, 64]) * sc[:, :, None], [BLOCK_T, NT * 64])
    return v.to(DT)


@triton.jit
def _dequant1(byte, w, TILE: tl.constexpr, HW_CAST: tl.constexpr, DT: tl.constexpr):
    e = ((w >> (8 * TILE)) & 0xFF).to(tl.int32)
    return (_fp8(byte, HW_CAST) * (e << 23).to(tl.float32, bitcast=True)[:, None]).to(DT)


@triton.jit
def _load_q(ptr, hm, FIRST: tl.constexpr, N: tl.constexpr, QCAST: tl.constexpr, DT: tl.constexpr,
            EXACT: tl.constexpr):
    c = FIRST + tl.arange(0, N)
    q = tl.load(ptr + c[None, :], mask=hm[:, None], other=0.0)
    if QCAST:  # a non-bf16 q rounds to bf16 for the tensor cores (a bf16 q is loaded as it is)
        q = cast_rne(q.to(tl.float32), tl.bfloat16, EXACT)
    return q.to(DT)


@triton.jit
def _store_part(ptr, x, hm, FIRST: tl.constexpr, N: tl.constexpr, EXACT: tl.constexpr):
    c = FIRST + tl.arange(0, N)
    tl.store(ptr + c[None, :], cast_rne(x, ptr.dtype.element_ty, EXACT), mask=hm[:, None])


@triton.jit
def _sparse_decode_kernel(q_ptr, pool_ptr, pool16_ptr, pool64_ptr, idx_ptr, sink_ptr, o_ptr, lse_ptr, K, H,
                          qk_scale, p_scr, m_scr, fo_ptr, cnt_ptr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                          HW_CAST: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, LOW: tl.constexpr, QCAST: tl.constexpr,
                          EXACT: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr, LAZY: tl.constexpr,
                          ROW: tl.constexpr, WIDE: tl.constexpr, XCHG: tl.constexpr, IDXPF: tl.constexpr,
                          FUSED: tl.constexpr, L2PF: tl.constexpr):
    """Online softmax (log2 domain) over this program's chunk of slots. Unsplit, it starts from the sink
    and writes the output; split, it writes its normalised partial and log-sum-exp for :func:`_merge`
    (the sink joins there, once), run by :func:`_combine_kernel` or, ``FUSED``, by the row's last chunk.
    ``o_ptr``/``lse_ptr``: the output, or the partials and their log-sum-exps; ``fo_ptr``: the output of
    the fused merge; ``cnt_ptr``: its arrival counters; ``p_scr``/``m_scr``: the exchange scratch."""
    row = tl.program_id(0).to(tl.int64)
    sp = tl.program_id(1)
    h = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < H
    qrow = q_ptr + (row * H + h[:, None]) * 512
    q0 = _load_q(qrow, hm, 0, 256, QCAST, DT, EXACT)
    q1 = _load_q(qrow, hm, 256, 128, QCAST, DT, EXACT)
    q2 = _load_q(qrow, hm, 384, 64, QCAST, DT, EXACT)
    q3 = _load_q(qrow, hm, 448, 64, QCAST, DT, EXACT)
    if SPLIT:
        m = tl.full([BLOCK_H], -1e30, tl.float32)  # finite: an empty chunk stays NaN-free
        lsum = tl.zeros([BLOCK_H], dtype=tl.float32)
    else:
        m = tl.load(sink_ptr + h, mask=hm, other=0.0).to(tl.float32) * 1.4426950408889634
        lsum = tl.full([BLOCK_H], 1.0, tl.float32)
    a0 = tl.zeros([BLOCK_H, 256], dtype=tl.float32)
    a1 = tl.zeros([BLOCK_H, 128], dtype=tl.float32)
    a2 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    a3 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    nt = tl.cdiv(K, BLOCK_T)  # tiles per row, dealt evenly to the chunks (they differ by one tile at most)
    if XCHG:  # this program's exchange slots for p and its reference max
        pid = (row * tl.num_programs(1) + sp) * tl.num_programs(2) + tl.program_id(2)
        hh = tl.arange(0, BLOCK_H)
        # two buffers, alternating by tile: a tile's stores cannot overtake the reads of the tile before it
        # (those precede the barrier between), so one barrier a tile suffices
        p_at = p_scr + pid * 2 * BLOCK_H * BLOCK_T + hh[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
        m_at = m_scr + pid * 2 * BLOCK_H + hh
        m_acc = m
    lo = (sp * nt // tl.num_programs(1)) * BLOCK_T
    hi = tl.minimum(((sp + 1) * nt // tl.num_programs(1)) * BLOCK_T, K)
    if PREFETCH:
        n0, n1, n2, r, w, ok = _gather(pool_ptr, pool16_ptr, pool64_ptr, idx_ptr, row, K, lo, hi, BLOCK_T, ROW, WIDE)
    if IDXPF:
        nslot = _slots(idx_ptr, row, K, lo, hi, BLOCK_T)
    if L2PF > 1:
        _prefetch_rows(pool_ptr, idx_ptr, row, K, lo + BLOCK_T, hi, BLOCK_T, ROW)
    for t0 in range(lo, hi, BLOCK_T):
        if L2PF > 0:  # the rows L2PF tiles ahead
            _prefetch_rows(pool_ptr, idx_ptr, row, K, t0 + L2PF * BLOCK_T, hi, BLOCK_T, ROW)
        if IDXPF:  # only the next tile's slot numbers are loaded ahead (a few registers)
            slot = nslot
            nslot = _slots(idx_ptr, row, K, t0 + BLOCK_T, hi, BLOCK_T)
            n0, n1, n2, r, w, ok = _rows(pool_ptr, pool16_ptr, pool64_ptr, slot, ROW, WIDE)
        elif PREFETCH:  # the next tile's loads go out before this tile's math (past hi: all masked, no traffic)
            x0, x1, x2, xr, xw, xok = _gather(pool_ptr, pool16_ptr, pool64_ptr, idx_ptr, row, K, t0 + BLOCK_T, hi,
                                              BLOCK_T, ROW, WIDE)
        else:
            n0, n1, n2, r, w, ok = _gather(pool_ptr, pool16_ptr, pool64_ptr, idx_ptr, row, K, t0, hi, BLOCK_T, ROW, WIDE)
        k0 = _dequant(n0, w, 0, 4, BLOCK_T, HW_CAST, DT)
        k1 = _dequant(n1, w, 4, 2, BLOCK_T, HW_CAST, DT)
        k2 = _dequant1(n2, w, 6, HW_CAST, DT)
        k3 = r.to(tl.bfloat16, bitcast=True).to(DT)
        if XCHG:  # unchained partial scores, each scaled (a dot feeding a dot, also as its accumulator after
            # the compiler folds an add into it, would pin that dot's layout too)
            s = tl.dot(q0, tl.trans(k0), input_precision=PREC) * qk_scale
            s += tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale
            s += tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale
            s += tl.dot(q3, tl.trans(k3), input_precision=PREC) * qk_scale
            s = tl.where(ok[None, :], s, float("-inf"))
        else:
            s = tl.dot(q0, tl.trans(k0), input_precision=PREC)
            s = tl.dot(q1, tl.trans(k1), s, input_precision=PREC)
            s = tl.dot(q2, tl.trans(k2), s, input_precision=PREC)
            s = tl.dot(q3, tl.trans(k3), s, input_precision=PREC)
            s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        if XCHG:
            # p and its max reach the value dots through memory: then no data path runs from the score dot
            # to the value dots, and the compiler splits the score tile over both warpgroups (a chained
            # dot would make each warpgroup compute all of it)
            if LAZY:
                m_use = tl.where(m_new - m > 8.0, m_new, m)  # per-row lazy rescale: p stays ≤ 256
            else:
                m_use = m_new
            p = tl.exp2(s - m_use[:, None])
            lsum = lsum * tl.exp2(m - m_use) + tl.sum(p, axis=1)
            m = m_use
            if LOW:
                p = cast_rne(p, tl.bfloat16, EXACT)
            par = (t0 // BLOCK_T) % 2
            tl.store(p_at + par * (BLOCK_H * BLOCK_T), p.to(p_scr.dtype.element_ty))
            tl.store(m_at + par * BLOCK_H, m_use)
            tl.debug_barrier()  # every warp's stores before any warp's loads (the loop's pipelining stops here)
            m_ld = tl.load(m_at + par * BLOCK_H, cache_modifier=".cg")
            p = tl.load(p_at + par * (BLOCK_H * BLOCK_T), cache_modifier=".cg")
            if LAZY:
                if tl.max(m_ld - m_acc, axis=0) > 0.0:
                    alpha = tl.exp2(m_acc - m_ld)
                    a0 = a0 * alpha[:, None]
                    a1 = a1 * alpha[:, None]
                    a2 = a2 * alpha[:, None]
                    a3 = a3 * alpha[:, None]
                    m_acc = m_ld
            else:
                alpha = tl.exp2(m_acc - m_ld)
                a0 = a0 * alpha[:, None]
                a1 = a1 * alpha[:, None]
                a2 = a2 * alpha[:, None]
                a3 = a3 * alpha[:, None]
                m_acc = m_ld
        elif LAZY:  # rescale only when some head's max grew past 2^8: p stays ≤ 256, exact either way
            if tl.max(m_new - m, axis=0) > 8.0:
                alpha = tl.exp2(m - m_new)
                lsum = lsum * alpha
                a0 = a0 * alpha[:, None]
                a1 = a1 * alpha[:, None]
                a2 = a2 * alpha[:, None]
                a3 = a3 * alpha[:, None]
                m = m_new
            p = tl.exp2(s - m[:, None])
            lsum = lsum + tl.sum(p, axis=1)
        else:
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s - m_new[:, None])
            lsum = lsum * alpha + tl.sum(p, axis=1)
            a0 = a0 * alpha[:, None]
            a1 = a1 * alpha[:, None]
            a2 = a2 * alpha[:, None]
            a3 = a3 * alpha[:, None]
            m = m_new
        if LOW and not XCHG:
            p = cast_rne(p, tl.bfloat16, EXACT)
        p = p.to(DT)
        a0 = tl.dot(p, k0, a0, input_precision=PREC)
        a1 = tl.dot(p, k1, a1, input_precision=PREC)
        a2 = tl.dot(p, k2, a2, input_precision=PREC)
        a3 = tl.dot(p, k3, a3, input_precision=PREC)
        if PREFETCH:
            n0, n1, n2, r, w, ok = x0, x1, x2, xr, xw, xok
    if SPLIT:
        empty = lsum == 0.0
        inv = 1.0 / tl.where(empty, 1.0, lsum)
        orow = o_ptr + ((row * tl.num_programs(1) + sp) * H + h[:, None]) * 512
        lse = tl.where(empty, -1e30, m + tl.log2(tl.where(empty, 1.0, lsum)))
        tl.store(lse_ptr + (row * tl.num_programs(1) + sp) * H + h, lse, mask=hm)
    else:
        inv = 1.0 / lsum
        orow = o_ptr + (row * H + h[:, None]) * 512
    _store_part(orow, a0 * inv[:, None], hm, 0, 256, EXACT)
    _store_part(orow, a1 * inv[:, None], hm, 256, 128, EXACT)
    _store_part(orow, a2 * inv[:, None], hm, 384, 64, EXACT)
    _store_part(orow, a3 * inv[:, None], hm, 448, 64, EXACT)
    if SPLIT and FUSED:
        # every thread's partial is stored before one thread counts this chunk in (release); the chunk that
        # counts last (acquire) merges the row's partials while they are in L2, and resets the counter
        tl.debug_barrier()
        cnt = cnt_ptr + row * tl.num_programs(2) + tl.program_id(2)
        done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if done == tl.num_programs(1) - 1:
            _merge(o_ptr, lse_ptr, sink_ptr, fo_ptr, row, h, hm, H, tl.num_programs(1), EXACT)
            tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


@triton.jit
def _merge(part_ptr, lse_ptr, sink_ptr, o_ptr, row, h, hm, H, n_split, EXACT: tl.constexpr):
    """Merge a row's normalised partials (for heads ``h``) by their log-sum-exps, with the sink (log2
    domain). Loads bypass L1: in the fused merge other SMs wrote them."""
    c = tl.arange(0, 512)
    sink = tl.load(sink_ptr + h, mask=hm, other=0.0).to(tl.float32) * 1.4426950408889634
    mx = sink
    for sp in range(0, n_split):
        mx = tl.maximum(mx, tl.load(lse_ptr + (row * n_split + sp) * H + h, mask=hm, other=-1e30,
                                    cache_modifier=".cg"))
    total = tl.exp2(sink - mx)
    acc = tl.zeros([h.shape[0], 512], dtype=tl.float32)
    for sp in range(0, n_split):
        base = (row * n_split + sp) * H + h
        wt = tl.exp2(tl.load(lse_ptr + base, mask=hm, other=-1e30, cache_modifier=".cg") - mx)
        total += wt
        acc += wt[:, None] * tl.load(part_ptr + base[:, None] * 512 + c[None, :], mask=hm[:, None], other=0.0,
                                     cache_modifier=".cg").to(tl.float32)
    out = acc / total[:, None]
    tl.store(o_ptr + (row * H + h[:, None]) * 512 + c[None, :], cast_rne(out, o_ptr.dtype.element_ty, EXACT),
             mask=hm[:, None])


@triton.jit
def _combine_kernel(part_ptr, lse_ptr, sink_ptr, o_ptr, H, n_split, BLOCK_H: tl.constexpr, EXACT: tl.constexpr):
    """:func:`_merge`, one program per (row, head block)."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    _merge(part_ptr, lse_ptr, sink_ptr, o_ptr, row, h, h < H, H, n_split, EXACT)


# --- Gluon (sm90) ------------------------------------------------------------------------------------
#
# The tl kernel above cannot keep the gathers in flight across a tile (its exchange barrier stops the
# compiler's pipelining) nor split the score tile over the warpgroups without that exchange. In Gluon the
# shared memory is explicit: a ring of raw rows filled by cp.async, one dequantised tile, and p. sm90 only
# (wgmma); the interpreter and other parts run the tl kernel.

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )
    HAVE_GLUON = True
except ImportError:  # a Triton without Gluon: the tl kernel serves every part
    HAVE_GLUON = False

if HAVE_GLUON:
    @gluon.jit
    def _g_slots(idx_ptr, row, K, t0, hi, BT: gl.constexpr, L: gl.constexpr):
        """The slot numbers of the tile ``t0 .. t0+BT`` of ``row`` along layout ``L`` (-1 from ``hi`` on)."""
        t = t0 + gl.arange(0, BT, layout=L)
        return gl.load(idx_ptr + row * K + t, mask=t < hi, other=-1)

    @gluon.jit
    def _g_issue(pool_ptr, pool16_ptr, slot, slots, r0, r1, r2, rr, rw, ROW: gl.constexpr, G: gl.constexpr,
                 GS: gl.constexpr, WIDE: gl.constexpr):
        """cp.async the raw parts of one tile's slots into one ring stage (8-byte copies; a slot of -1 fills
        zeros): nope tiles 0-3, 4-5, 6, the rope and the scale bytes. ``slot`` runs along G's rows, ``slots``
        along GS's (the scale words' layout)."""
        if WIDE:
            slot = slot.to(gl.int64)
            slots = slots.to(gl.int64)
        ok = gl.expand_dims(slot >= 0, 1)
        base = gl.expand_dims(gl.maximum(slot, 0) * ROW, 1)
        c256 = gl.expand_dims(gl.arange(0, 256, layout=gl.SliceLayout(0, G)), 0)
        c128 = gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, G)), 0)
        c64 = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, G)), 0)
        async_copy.async_copy_global_to_shared(r0, pool_ptr + base + c256, mask=ok & (c256 >= 0))
        async_copy.async_copy_global_to_shared(r1, pool_ptr + base + 256 + c128, mask=ok & (c128 >= 0))
        async_copy.async_copy_global_to_shared(r2, pool_ptr + base + 384 + c64, mask=ok & (c64 >= 0))
        async_copy.async_copy_global_to_shared(rr, pool16_ptr + base // 2 + 224 + c64, mask=ok & (c64 >= 0))
        oks = gl.expand_dims(slots >= 0, 1)
        c8 = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, GS)), 0)
        async_copy.async_copy_global_to_shared(rw, pool_ptr + gl.expand_dims(gl.maximum(slots, 0) * ROW, 1) + 576 + c8,
                                               mask=oks & (c8 >= 0))

    @gluon.jit
    def _g_issue_cf(pool_ptr, pool16_ptr, s0, s1, slot, slots, r0, r1, r2, rr, rw, ROW: gl.constexpr, G0: gl.constexpr,
                    G1: gl.constexpr, G: gl.constexpr, GS: gl.constexpr, WIDE: gl.constexpr):
        """:func:`_g_issue` with nope tiles 0-3 copied a whole 256-byte row a warp (``s0`` along G0's rows) and
        4-5 two 128-byte rows a warp (``s1`` along G1's), so that no two of a warp's copies share a bank."""
        if WIDE:
            s0 = s0.to(gl.int64)
            s1 = s1.to(gl.int64)
        c256 = gl.expand_dims(gl.arange(0, 256, layout=gl.SliceLayout(0, G0)), 0)
        c128 = gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, G1)), 0)
        async_copy.async_copy_global_to_shared(r0, pool_ptr + gl.expand_dims(gl.maximum(s0, 0) * ROW, 1) + c256,
                                               mask=gl.expand_dims(s0 >= 0, 1) & (c256 >= 0))
        async_copy.async_copy_global_to_shared(r1, pool_ptr + gl.expand_dims(gl.maximum(s1, 0) * ROW, 1) + 256 + c128,
                                               mask=gl.expand_dims(s1 >= 0, 1) & (c128 >= 0))
        if WIDE:
            slot = slot.to(gl.int64)
            slots = slots.to(gl.int64)
        ok = gl.expand_dims(slot >= 0, 1)
        base = gl.expand_dims(gl.maximum(slot, 0) * ROW, 1)
        c64 = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, G)), 0)
        async_copy.async_copy_global_to_shared(r2, pool_ptr + base + 384 + c64, mask=ok & (c64 >= 0))
        async_copy.async_copy_global_to_shared(rr, pool16_ptr + base // 2 + 224 + c64, mask=ok & (c64 >= 0))
        oks = gl.expand_dims(slots >= 0, 1)
        c8 = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, GS)), 0)
        async_copy.async_copy_global_to_shared(rw, pool_ptr + gl.expand_dims(gl.maximum(slots, 0) * ROW, 1) + 576 + c8,
                                               mask=oks & (c8 >= 0))

    @gluon.jit
    def _g_fetch(pool_ptr, pool16_ptr, idx_ptr, row, K, t0, hi, r0, r1, r2, rr, rw, BT: gl.constexpr,
                 ROW: gl.constexpr, G: gl.constexpr, GS: gl.constexpr, WIDE: gl.constexpr):
        """:func:`_g_issue` for the tile ``t0 .. t0+BT``, its slot numbers loaded here."""
        _g_issue(pool_ptr, pool16_ptr, _g_slots(idx_ptr, row, K, t0, hi, BT, gl.SliceLayout(1, G)),
                 _g_slots(idx_ptr, row, K, t0, hi, BT, gl.SliceLayout(1, GS)), r0, r1, r2, rr, rw, ROW, G, GS, WIDE)

    @gluon.jit
    def _g_prefetch(pool_ptr, slot, ROW: gl.constexpr, PF: gl.constexpr):
        """:func:`_prefetch_rows` in Gluon for a tile's slots (along PF's rows): one ``prefetch.global.L2``
        every 80 bytes of each row."""
        c8 = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, PF)), 0)
        at = pool_ptr + gl.expand_dims(gl.maximum(slot, 0).to(gl.int64) * ROW, 1) + c8 * 80
        at = gl.where(gl.expand_dims(slot >= 0, 1), at, pool_ptr)
        gl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [at.to(gl.int64, bitcast=True)],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _g_deq(raw, sc, NT: gl.constexpr, BT: gl.constexpr, L3: gl.constexpr):
        """``NT`` nope tiles (``raw`` [BT, NT*64] bytes in shared memory, ``sc`` [BT, NT] their scale bytes):
        e4m3 times 2^(e-127), exact in bf16."""
        b = raw.reshape([BT, NT, 64]).load(L3)
        e = sc.load(gl.SliceLayout(2, L3)).to(gl.int32)
        s = (e << 23).to(gl.float32, bitcast=True)
        v = b.to(gl.float8e4nv, bitcast=True).to(gl.float32) * gl.expand_dims(s, 2)
        return gl.reshape(v.to(gl.bfloat16), [BT, NT * 64])

    @gluon.jit
    def _g_qpart(q_ptr, row, H, h0, dst, FIRST: gl.constexpr, N: gl.constexpr, BH: gl.constexpr, QL: gl.constexpr,
                 QA: gl.constexpr):
        """Columns ``FIRST .. FIRST+N`` of the block's q into ``dst``: through registers (a 16-bit q: bf16 as it
        is, fp16 rounded to nearest even), or ``QA`` (a bf16 q) by cp.async, landing with the first tile's
        gathers (a head past ``H`` fills zeros)."""
        hq = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, QL))
        cq = FIRST + gl.arange(0, N, layout=gl.SliceLayout(0, QL))
        at = q_ptr + (row * H + gl.expand_dims(hq, 1)) * 512 + gl.expand_dims(cq, 0)
        mask = gl.expand_dims(hq < H, 1) & gl.expand_dims(cq >= 0, 0)
        if QA:
            async_copy.async_copy_global_to_shared(dst, at, mask=mask)
        else:
            dst.store(gl.load(at, mask=mask, other=0.0).to(gl.bfloat16))

    @gluon.jit
    def _g_store(o_ptr, base, ho, H, x, inv, FIRST: gl.constexpr, N: gl.constexpr, L: gl.constexpr):
        co = FIRST + gl.arange(0, N, layout=gl.SliceLayout(0, L))
        at = o_ptr + (base + gl.expand_dims(ho, 1)) * 512 + gl.expand_dims(co, 0)
        o = x * gl.expand_dims(gl.convert_layout(inv, gl.SliceLayout(1, L)), 1)
        gl.store(at, o.to(o_ptr.dtype.element_ty), mask=gl.expand_dims(ho < H, 1) & gl.expand_dims(co >= 0, 0))

    @gluon.jit
    def _g_merge(part_ptr, lse_ptr, sink_ptr, o_ptr, row, h0, H, nsp, BH: gl.constexpr, MG: gl.constexpr):
        """:func:`_merge` in Gluon for the fused combine (the row's last chunk merges), 16 heads at a time;
        loads bypass L1 (other SMs wrote them)."""
        c = gl.arange(0, 512, layout=gl.SliceLayout(0, MG))
        for hb in gl.static_range(BH // 16):
            h = h0 + hb * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, MG))
            hm = h < H
            m2 = gl.expand_dims(hm, 1) & gl.expand_dims(c >= 0, 0)
            sink = gl.load(sink_ptr + h, mask=hm, other=0.0).to(gl.float32) * 1.4426950408889634
            mx = sink
            for sp in range(0, nsp):
                mx = gl.maximum(mx, gl.load(lse_ptr + (row * nsp + sp) * H + h, mask=hm, other=-1e30,
                                            cache_modifier=".cg"))
            total = gl.exp2(sink - mx)
            acc = gl.zeros([16, 512], gl.float32, layout=MG)
            for sp in range(0, nsp):
                base = (row * nsp + sp) * H + h
                wt = gl.exp2(gl.load(lse_ptr + base, mask=hm, other=-1e30, cache_modifier=".cg") - mx)
                total += wt
                pv = gl.load(part_ptr + gl.expand_dims(base, 1) * 512 + gl.expand_dims(c, 0), mask=m2, other=0.0,
                             cache_modifier=".cg")
                acc += gl.expand_dims(wt, 1) * pv.to(gl.float32)
            out = acc / gl.expand_dims(total, 1)
            gl.store(o_ptr + (row * H + gl.expand_dims(h, 1)) * 512 + gl.expand_dims(c, 0),
                     out.to(o_ptr.dtype.element_ty), mask=m2)

    @gluon.jit
    def _g_count_in(cnt_ptr, part_ptr, lse_ptr, sink_ptr, o_ptr, row, h0, H, nsp, BH: gl.constexpr, MG: gl.constexpr):
        """The fused combine's hand-off: every thread's partial is stored before one thread counts this chunk
        in (release); the chunk that counts last (acquire) merges the row's partials while they are in L2
        (:func:`_g_merge`) and resets the counter."""
        gl.thread_barrier()
        cnt = cnt_ptr + row * gl.num_programs(2) + gl.program_id(2)
        done = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if done == nsp - 1:
            _g_merge(part_ptr, lse_ptr, sink_ptr, o_ptr, row, h0, H, nsp, BH, MG)
            gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")

    @gluon.jit
    def _sparse_decode_gluon(q_ptr, pool_ptr, pool16_ptr, idx_ptr, sink_ptr, o_ptr, lse_ptr, K, H, qk_scale, fo_ptr,
                             cnt_ptr, SPLIT: gl.constexpr, STAGES: gl.constexpr, ROW: gl.constexpr, WIDE: gl.constexpr,
                             L2PF: gl.constexpr, EARLY: gl.constexpr, LSUMW: gl.constexpr, IDXA: gl.constexpr,
                             FUSED: gl.constexpr, QA: gl.constexpr, CF: gl.constexpr):
        """:func:`_sparse_decode_kernel`'s online softmax for sm90 with explicit shared memory: the raw bytes of
        the rows ``STAGES - 1`` tiles ahead are gathered by cp.async into a ring while this tile is
        dequantised; the dequantised tile (bf16, wgmma's swizzled layout, one buffer per part of the row so
        that the parts' stores need no barrier between them) feeds both warpgroups' score and value wgmma.
        Each warpgroup computes half of the score tile (32 slots) and half of every output part; p reaches
        the value MMAs through shared memory, and the value MMAs of a tile run while the next tile is
        dequantised. Same roundings as the tl kernel (exact keys, bf16 p, fp32 accumulation).

        ``IDXA``: every slot number is loaded a trip before its use (the gathers', the L2 prefetch's, the
        score mask's), so no address waits on a global load. ``FUSED`` (split): the row's last chunk to
        finish merges the partials into ``fo_ptr`` (``cnt_ptr``: arrival counters, reset by the merger)."""
        BT: gl.constexpr = 64
        BH: gl.constexpr = 64
        row = gl.program_id(0).to(gl.int64)
        sp = gl.program_id(1)
        nsp = gl.num_programs(1)
        h0 = gl.program_id(2) * BH
        # wgmma accumulators split over the two warpgroups along N: the scores (32 slots each) and the
        # output parts (256/128/64/64 channels: half each)
        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
        O0: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 128, 16])
        O1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 64, 16])
        O2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
        G: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
        GS: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [2, 4], [1, 0])
        PF: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [8, 1], [1, 0])  # G's rows: its slots convert freely
        L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [4, 1, 8], [8, 1, 1], [2, 1, 0])
        if CF:  # a warp's copies and dequantising loads of nope tiles 0-3 take one row, of 4-5 two rows
            G0: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
            G1: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0])
            L30: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 4, 8], [8, 1, 1], [2, 1, 0])
            L31: gl.constexpr = gl.BlockedLayout([1, 1, 8], [2, 2, 8], [8, 1, 1], [2, 1, 0])
        else:
            G0: gl.constexpr = G
            G1: gl.constexpr = G
            L30: gl.constexpr = L3
            L31: gl.constexpr = L3
        MG: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [8, 1], [1, 0])
        MMA_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        RAW: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        SG: gl.constexpr = gl.SliceLayout(1, G)
        SGS: gl.constexpr = gl.SliceLayout(1, GS)
        SM: gl.constexpr = gl.SliceLayout(0, S_L)

        q0 = gl.allocate_shared_memory(gl.bfloat16, [BH, 256], MMA_SL)
        q1 = gl.allocate_shared_memory(gl.bfloat16, [BH, 128], MMA_SL)
        q2 = gl.allocate_shared_memory(gl.bfloat16, [BH, 64], MMA_SL)
        q3 = gl.allocate_shared_memory(gl.bfloat16, [BH, 64], MMA_SL)
        kv0 = gl.allocate_shared_memory(gl.bfloat16, [BT, 256], MMA_SL)
        kv1 = gl.allocate_shared_memory(gl.bfloat16, [BT, 128], MMA_SL)
        kv2 = gl.allocate_shared_memory(gl.bfloat16, [BT, 64], MMA_SL)
        kv3 = gl.allocate_shared_memory(gl.bfloat16, [BT, 64], MMA_SL)
        p_s = gl.allocate_shared_memory(gl.bfloat16, [BH, BT], MMA_SL)
        r0 = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 256], RAW)
        r1 = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 128], RAW)
        r2 = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 64], RAW)
        rr = gl.allocate_shared_memory(gl.int16, [STAGES, BT, 64], RAW)
        rw = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 8], RAW)

        nt = gl.cdiv(K, BT)  # tiles per row, dealt evenly to the chunks
        lo = (sp * nt // nsp) * BT
        hi = gl.minimum(((sp + 1) * nt // nsp) * BT, K)
        if QA:  # q's copies join the first tile's group
            _g_qpart(q_ptr, row, H, h0, q0, 0, 256, BH, G, QA)
            _g_qpart(q_ptr, row, H, h0, q1, 256, 128, BH, G, QA)
            _g_qpart(q_ptr, row, H, h0, q2, 384, 64, BH, G, QA)
            _g_qpart(q_ptr, row, H, h0, q3, 448, 64, BH, G, QA)
        for i in gl.static_range(STAGES - 1):
            if CF:
                _g_issue_cf(pool_ptr, pool16_ptr, _g_slots(idx_ptr, row, K, lo + i * BT, hi, BT, gl.SliceLayout(1, G0)),
                            _g_slots(idx_ptr, row, K, lo + i * BT, hi, BT, gl.SliceLayout(1, G1)),
                            _g_slots(idx_ptr, row, K, lo + i * BT, hi, BT, SG),
                            _g_slots(idx_ptr, row, K, lo + i * BT, hi, BT, SGS), r0.index(i), r1.index(i), r2.index(i),
                            rr.index(i), rw.index(i), ROW, G0, G1, G, GS, WIDE)
            else:
                _g_fetch(pool_ptr, pool16_ptr, idx_ptr, row, K, lo + i * BT, hi, r0.index(i), r1.index(i), r2.index(i),
                         rr.index(i), rw.index(i), BT, ROW, G, GS, WIDE)
            async_copy.commit_group()
        if IDXA:  # the slot numbers of the next gather (and of the L2 prefetch a tile beyond it)
            ns = _g_slots(idx_ptr, row, K, lo + (STAGES - 1) * BT, hi, BT, SG)
            nss = _g_slots(idx_ptr, row, K, lo + (STAGES - 1) * BT, hi, BT, SGS)
            if CF:
                ns0 = _g_slots(idx_ptr, row, K, lo + (STAGES - 1) * BT, hi, BT, gl.SliceLayout(1, G0))
                ns1 = _g_slots(idx_ptr, row, K, lo + (STAGES - 1) * BT, hi, BT, gl.SliceLayout(1, G1))
            if L2PF:
                n2 = _g_slots(idx_ptr, row, K, lo + STAGES * BT, hi, BT, SG)
            mslot = _g_slots(idx_ptr, row, K, lo, hi, BT, SM)
        if not QA:
            _g_qpart(q_ptr, row, H, h0, q0, 0, 256, BH, G, QA)
            _g_qpart(q_ptr, row, H, h0, q1, 256, 128, BH, G, QA)
            _g_qpart(q_ptr, row, H, h0, q2, 384, 64, BH, G, QA)
            _g_qpart(q_ptr, row, H, h0, q3, 448, 64, BH, G, QA)

        hs = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, S_L))
        # the sink joins after the loop (unsplit) or in the combine (split)
        m = gl.full([BH], -1e30, gl.float32, layout=gl.SliceLayout(1, S_L))  # finite: an empty chunk stays NaN-free
        lsum = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, S_L))
        s0 = gl.zeros([BH, BT], gl.float32, layout=S_L)
        if LSUMW:  # each warpgroup sums its own 32 slots of a tile; the two sums meet once, after the loop
            lw = gl.sum(gl.reshape(s0, [BH, 2, BT // 2]), axis=2)
        if not SPLIT:
            sink = gl.load(sink_ptr + hs, mask=hs < H, other=0.0).to(gl.float32) * 1.4426950408889634
        a0t = warpgroup_mma_init(gl.zeros([BH, 256], gl.float32, layout=O0))
        a1t = warpgroup_mma_init(gl.zeros([BH, 128], gl.float32, layout=O1))
        a2t = warpgroup_mma_init(gl.zeros([BH, 64], gl.float32, layout=O2))
        a3t = warpgroup_mma_init(gl.zeros([BH, 64], gl.float32, layout=O2))
        fence_async_shared()
        # at least one trip (an empty chunk's tile is all masked: it adds nothing): a loop the compiler
        # may skip gets a second path to the final MMA wait that writes the accumulators, and ptxas then
        # serialises every wgmma of the kernel
        for it in range(0, gl.maximum(gl.cdiv(hi - lo, BT), 1)):
            t0 = lo + it * BT
            nxt = (it + STAGES - 1) % STAGES
            # the gathers STAGES - 1 tiles ahead go out first, then the L2 prefetch one tile further
            if IDXA:
                if CF:
                    _g_issue_cf(pool_ptr, pool16_ptr, ns0, ns1, ns, nss, r0.index(nxt), r1.index(nxt), r2.index(nxt),
                                rr.index(nxt), rw.index(nxt), ROW, G0, G1, G, GS, WIDE)
                    ns0 = _g_slots(idx_ptr, row, K, t0 + STAGES * BT, hi, BT, gl.SliceLayout(1, G0))
                    ns1 = _g_slots(idx_ptr, row, K, t0 + STAGES * BT, hi, BT, gl.SliceLayout(1, G1))
                else:
                    _g_issue(pool_ptr, pool16_ptr, ns, nss, r0.index(nxt), r1.index(nxt), r2.index(nxt), rr.index(nxt),
                             rw.index(nxt), ROW, G, GS, WIDE)
                async_copy.commit_group()
                nss = _g_slots(idx_ptr, row, K, t0 + STAGES * BT, hi, BT, SGS)
                if L2PF:
                    _g_prefetch(pool_ptr, gl.convert_layout(n2, gl.SliceLayout(1, PF)), ROW, PF)
                    ns = n2
                    n2 = _g_slots(idx_ptr, row, K, t0 + (STAGES + 1) * BT, hi, BT, SG)
                else:
                    ns = _g_slots(idx_ptr, row, K, t0 + STAGES * BT, hi, BT, SG)
            elif CF:
                t1 = t0 + (STAGES - 1) * BT
                _g_issue_cf(pool_ptr, pool16_ptr, _g_slots(idx_ptr, row, K, t1, hi, BT, gl.SliceLayout(1, G0)),
                            _g_slots(idx_ptr, row, K, t1, hi, BT, gl.SliceLayout(1, G1)),
                            _g_slots(idx_ptr, row, K, t1, hi, BT, SG), _g_slots(idx_ptr, row, K, t1, hi, BT, SGS),
                            r0.index(nxt), r1.index(nxt), r2.index(nxt), rr.index(nxt), rw.index(nxt), ROW, G0, G1, G, GS,
                            WIDE)
                async_copy.commit_group()
                if L2PF:
                    _g_prefetch(pool_ptr, _g_slots(idx_ptr, row, K, t0 + STAGES * BT, hi, BT, gl.SliceLayout(1, PF)),
                                ROW, PF)
            else:
                _g_fetch(pool_ptr, pool16_ptr, idx_ptr, row, K, t0 + (STAGES - 1) * BT, hi, r0.index(nxt),
                         r1.index(nxt), r2.index(nxt), rr.index(nxt), rw.index(nxt), BT, ROW, G, GS, WIDE)
                async_copy.commit_group()
                if L2PF:
                    _g_prefetch(pool_ptr, _g_slots(idx_ptr, row, K, t0 + STAGES * BT, hi, BT, gl.SliceLayout(1, PF)),
                                ROW, PF)
            async_copy.wait_group(STAGES - 1)  # this thread's copies of this tile have landed
            gl.thread_barrier()  # and every thread's
            cur = it % STAGES
            w = rw.index(cur)
            # the first EARLY parts are dequantised while the last tile's value MMAs run (their registers
            # wait for the MMAs to release the kv buffers), the rest after
            k0 = _g_deq(r0.index(cur), w.slice(0, 4, dim=1), 4, BT, L30)
            if EARLY >= 2:
                k1 = _g_deq(r1.index(cur), w.slice(4, 2, dim=1), 2, BT, L31)
            if EARLY >= 3:
                k2 = _g_deq(r2.index(cur), w.slice(6, 1, dim=1), 1, BT, L3)
            if EARLY >= 4:
                k3 = rr.index(cur).load(G).to(gl.bfloat16, bitcast=True)
            a0, a1, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=(a0t, a1t, a2t, a3t))
            gl.thread_barrier()  # both warpgroups' value MMAs of the last tile are done with the kv and p buffers
            kv0.store(k0)
            if EARLY < 2:
                k1 = _g_deq(r1.index(cur), w.slice(4, 2, dim=1), 2, BT, L31)
            kv1.store(k1)
            if EARLY < 3:
                k2 = _g_deq(r2.index(cur), w.slice(6, 1, dim=1), 1, BT, L3)
            kv2.store(k2)
            if EARLY < 4:
                k3 = rr.index(cur).load(G).to(gl.bfloat16, bitcast=True)
            kv3.store(k3)
            fence_async_shared()
            gl.thread_barrier()
            st = warpgroup_mma(q0, kv0.permute((1, 0)), s0, use_acc=False, is_async=True)
            st = warpgroup_mma(q1, kv1.permute((1, 0)), st, is_async=True)
            st = warpgroup_mma(q2, kv2.permute((1, 0)), st, is_async=True)
            st = warpgroup_mma(q3, kv3.permute((1, 0)), st, is_async=True)
            if IDXA:
                slot = mslot
                mslot = _g_slots(idx_ptr, row, K, t0 + BT, hi, BT, SM)
            else:
                slot = _g_slots(idx_ptr, row, K, t0, hi, BT, SM)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(st,))
            s = gl.where(gl.expand_dims(slot >= 0, 0), s * qk_scale, float("-inf"))
            m_new = gl.maximum(m, gl.max(s, axis=1))
            alpha = gl.exp2(m - m_new)
            p = gl.exp2(s - gl.expand_dims(m_new, 1))
            if LSUMW:
                aw = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, lw.type.layout)), 1)
                lw = lw * aw + gl.sum(gl.reshape(p, [BH, 2, BT // 2]), axis=2)
            else:
                lsum = lsum * alpha + gl.sum(p, axis=1)
            m = m_new
            p_s.store(p.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            # every accumulator rescaled before the first value MMA goes out (an instruction writing an
            # accumulator among the MMAs would make ptxas serialise them)
            a0 = a0 * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, O0)), 1)
            a1 = a1 * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, O1)), 1)
            al2 = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, O2)), 1)
            a2 = a2 * al2
            a3 = a3 * al2
            a0t = warpgroup_mma(p_s, kv0, a0, is_async=True)
            a1t = warpgroup_mma(p_s, kv1, a1, is_async=True)
            a2t = warpgroup_mma(p_s, kv2, a2, is_async=True)
            a3t = warpgroup_mma(p_s, kv3, a3, is_async=True)
        a0, a1, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=(a0t, a1t, a2t, a3t))
        async_copy.wait_group(0)  # the ring's copies past the chunk's end
        if LSUMW:
            lsum = gl.convert_layout(gl.sum(lw, axis=1), gl.SliceLayout(1, S_L))

        if SPLIT:
            empty = lsum == 0.0
            inv = 1.0 / gl.where(empty, 1.0, lsum)
            lse = gl.where(empty, -1e30, m + gl.log2(gl.where(empty, 1.0, lsum)))
            gl.store(lse_ptr + (row * nsp + sp) * H + hs, lse, mask=hs < H)
            base = (row * nsp + sp) * H
        else:
            mx = gl.maximum(m, sink)
            keep = gl.exp2(m - mx)
            inv = keep / (lsum * keep + gl.exp2(sink - mx))
            base = row * H
        _g_store(o_ptr, base, h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, O0)), H, a0, inv, 0, 256, O0)
        _g_store(o_ptr, base, h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, O1)), H, a1, inv, 256, 128, O1)
        _g_store(o_ptr, base, h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, O2)), H, a2, inv, 384, 64, O2)
        _g_store(o_ptr, base, h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, O2)), H, a3, inv, 448, 64, O2)
        if SPLIT and FUSED:
            _g_count_in(cnt_ptr, o_ptr, lse_ptr, sink_ptr, fo_ptr, row, h0, H, nsp, BH, MG)

    # --- warp-specialised (sm90): a producer warpgroup gathers and dequantises, two consumer warpgroups
    # run the MMAs and the softmax, double-buffered on mbarriers ---------------------------------------
    #
    # 32-slot tiles (shared memory: q 64 KB, two bf16 tiles 64 KB, the raw ring 18.6 KB a stage). Each
    # consumer warpgroup computes the whole 64 × 32 score tile (the score MMAs run twice, once a warpgroup)
    # so that its softmax needs nothing from the other one: p goes through the warpgroup's own shared
    # buffer to its value MMA, which covers its half of the channels (0-255 or 256-511). The only per-tile
    # synchronisation between partitions is the pair of mbarriers of each tile buffer (filled / released).

    @gluon.jit
    def _ws_deq(raw, sc, D: gl.constexpr):
        """One 64-channel nope tile: ``raw`` [BT, 64] e4m3 bytes times 2^(``sc`` - 127) ([BT, 1] scale
        bytes), exact in bf16."""
        b = raw.load(D)
        e = sc.load(D).to(gl.int32)
        s = (e << 23).to(gl.float32, bitcast=True)
        return (b.to(gl.float8e4nv, bitcast=True).to(gl.float32) * s).to(gl.bfloat16)

    @gluon.jit
    def _ws_producer(pool_ptr, pool16_ptr, idx_ptr, r0, r1, r2, rr, rw, kv, kv_ready, kv_empty, row, K, lo, hi,
                     ROW: gl.constexpr, WIDE: gl.constexpr, L2PF: gl.constexpr, BT: gl.constexpr,
                     STAGES: gl.constexpr, PID: gl.constexpr, NPROD: gl.constexpr, IDXA: gl.constexpr):
        """Producer ``PID`` of ``NPROD`` takes the tiles ``PID``, ``PID + NPROD``, ...: gathers their raw rows
        ``STAGES - 1`` of its tiles ahead (cp.async into its own ring; ``IDXA``: their slot numbers loaded a
        trip before), then dequantises each into its bf16 buffer once both consumers have released it, and
        marks it filled."""
        G: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        GS: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [1, 4], [1, 0])
        PF: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [4, 1], [1, 0])
        D: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        n = gl.maximum(gl.cdiv(hi - lo, BT), 1)
        STEP: gl.constexpr = NPROD * BT
        for c in gl.static_range(STAGES - 1):
            _g_fetch(pool_ptr, pool16_ptr, idx_ptr, row, K, lo + PID * BT + c * STEP, hi, r0.index(c), r1.index(c),
                     r2.index(c), rr.index(c), rw.index(c), BT, ROW, G, GS, WIDE)
            async_copy.commit_group()
        if IDXA:  # the slot numbers of the next gather (and of the L2 prefetch one of this producer's tiles on)
            at = lo + PID * BT + (STAGES - 1) * STEP
            ns = _g_slots(idx_ptr, row, K, at, hi, BT, gl.SliceLayout(1, G))
            nss = _g_slots(idx_ptr, row, K, at, hi, BT, gl.SliceLayout(1, GS))
            n2 = _g_slots(idx_ptr, row, K, at + STEP, hi, BT, gl.SliceLayout(1, G))
        for k in range(0, gl.cdiv(n - PID, NPROD)):
            i = PID + NPROD * k  # the tile
            t0 = lo + i * BT
            nxt = (k + STAGES - 1) % STAGES
            if IDXA:
                _g_issue(pool_ptr, pool16_ptr, ns, nss, r0.index(nxt), r1.index(nxt), r2.index(nxt), rr.index(nxt),
                         rw.index(nxt), ROW, G, GS, WIDE)
                async_copy.commit_group()
                nss = _g_slots(idx_ptr, row, K, t0 + STAGES * STEP, hi, BT, gl.SliceLayout(1, GS))
                if L2PF:
                    _g_prefetch(pool_ptr, gl.convert_layout(n2, gl.SliceLayout(1, PF)), ROW, PF)
                ns = n2
                n2 = _g_slots(idx_ptr, row, K, t0 + (STAGES + 1) * STEP, hi, BT, gl.SliceLayout(1, G))
            else:
                _g_fetch(pool_ptr, pool16_ptr, idx_ptr, row, K, t0 + (STAGES - 1) * STEP, hi, r0.index(nxt),
                         r1.index(nxt), r2.index(nxt), rr.index(nxt), rw.index(nxt), BT, ROW, G, GS, WIDE)
                async_copy.commit_group()
                if L2PF:
                    _g_prefetch(pool_ptr, _g_slots(idx_ptr, row, K, t0 + STAGES * STEP, hi, BT, gl.SliceLayout(1, PF)),
                                ROW, PF)
            async_copy.wait_group(STAGES - 1)  # this thread's copies of tile i have landed
            gl.thread_barrier()  # and every thread's of this producer
            cur = k % STAGES
            b = i % 2
            mbarrier.wait(kv_empty.index(b), ((i // 2) & 1) ^ 1)  # both consumers are done with the buffer
            w = rw.index(cur)
            for j in gl.static_range(4):
                kv[j].index(b).store(_ws_deq(r0.index(cur).slice(64 * j, 64, dim=1), w.slice(j, 1, dim=1), D))
            for j in gl.static_range(2):
                kv[4 + j].index(b).store(_ws_deq(r1.index(cur).slice(64 * j, 64, dim=1), w.slice(4 + j, 1, dim=1),
                                                 D))
            kv[6].index(b).store(_ws_deq(r2.index(cur), w.slice(6, 1, dim=1), D))
            kv[7].index(b).store(rr.index(cur).load(D).to(gl.bfloat16, bitcast=True))
            fence_async_shared()  # the stores before the consumers' MMAs read them
            gl.thread_barrier()
            mbarrier.arrive(kv_ready.index(b))
        async_copy.wait_group(0)

    @gluon.jit
    def _ws_consumer(q_ptr, q_s, q_ready, p_s, kv, kv_ready, kv_empty, xs, x_ready, idx_ptr, sink_ptr, o_ptr, lse_ptr,
                     row, sp, nsp, h0, K, H, lo, hi, qk_scale, PART: gl.constexpr, SPLIT: gl.constexpr,
                     BT: gl.constexpr, KSPLIT: gl.constexpr, LAZY: gl.constexpr, QA: gl.constexpr):
        """One warpgroup's online softmax over the chunk: the whole score tile (``KSPLIT``: its half of the
        channels, the other half from the other warpgroup through ``xs``), then the value MMA of its half of
        the channels (``PART`` 0: 0-255, 1: 256-511); writes that half."""
        BH: gl.constexpr = 64
        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
        SM: gl.constexpr = gl.SliceLayout(0, S_L)
        QL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        J0: gl.constexpr = 4 * PART  # this warpgroup's four 64-channel tiles
        # this warpgroup's half of q (while the producer's first gathers fly), then the other's
        for c in gl.static_range(2):
            _g_qpart(q_ptr, row, H, h0, q_s.slice(256 * PART + 128 * c, 128, dim=1), 256 * PART + 128 * c, 128, BH,
                     QL, QA)
        if QA:
            async_copy.commit_group()
            async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(q_ready.index(0))
        n = gl.maximum(gl.cdiv(hi - lo, BT), 1)
        hs = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, S_L))
        m = gl.full([BH], -1e30, gl.float32, layout=gl.SliceLayout(1, S_L))  # finite: an empty chunk stays NaN-free
        lsum = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, S_L))
        s0 = gl.zeros([BH, BT], gl.float32, layout=S_L)
        a0t = warpgroup_mma_init(gl.zeros([BH, 64], gl.float32, layout=O_L))
        a1t = warpgroup_mma_init(gl.zeros([BH, 64], gl.float32, layout=O_L))
        a2t = warpgroup_mma_init(gl.zeros([BH, 64], gl.float32, layout=O_L))
        a3t = warpgroup_mma_init(gl.zeros([BH, 64], gl.float32, layout=O_L))
        mslot = _g_slots(idx_ptr, row, K, lo, hi, BT, SM)
        ps = p_s.index(PART)
        mbarrier.wait(q_ready.index(0), 0)
        for i in range(0, n):
            t0 = lo + i * BT
            b = i % 2
            slot = mslot  # loaded a trip ahead
            mslot = _g_slots(idx_ptr, row, K, t0 + BT, hi, BT, SM)
            mbarrier.wait(kv_ready.index(b), (i // 2) & 1)
            if KSPLIT:  # this warpgroup's half of the channels
                st = warpgroup_mma(q_s.slice(64 * J0, 64, dim=1), kv[J0].index(b).permute((1, 0)), s0,
                                   use_acc=False, is_async=True)
                for j in gl.static_range(1, 4):
                    st = warpgroup_mma(q_s.slice(64 * (J0 + j), 64, dim=1), kv[J0 + j].index(b).permute((1, 0)),
                                       st, is_async=True)
            else:
                st = warpgroup_mma(q_s.slice(0, 64, dim=1), kv[0].index(b).permute((1, 0)), s0, use_acc=False,
                                   is_async=True)
                for j in gl.static_range(1, 8):
                    st = warpgroup_mma(q_s.slice(64 * j, 64, dim=1), kv[j].index(b).permute((1, 0)), st,
                                       is_async=True)
            s, a0, a1, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=(st, a0t, a1t, a2t, a3t))
            gl.thread_barrier()  # every warp of this warpgroup is past the last tile's value MMAs
            mbarrier.arrive(kv_empty.index(1 - b), pred=i > 0)
            if KSPLIT:  # the halves meet in shared memory (a + b == b + a: both warpgroups get the same bits)
                xs.index(2 * b + PART).store(s)
                gl.thread_barrier()
                mbarrier.arrive(x_ready.index(b))
                mbarrier.wait(x_ready.index(b), (i // 2) & 1)
                s = s + xs.index(2 * b + 1 - PART).load(S_L)
            s = gl.where(gl.expand_dims(slot >= 0, 0), s * qk_scale, float("-inf"))
            m_new = gl.maximum(m, gl.max(s, axis=1))
            if LAZY:  # rescale only when some head's max grew past 2^8 (p stays <= 256; both warpgroups agree)
                if gl.max(m_new - m, axis=0) > 8.0:
                    alpha = gl.exp2(m - m_new)
                    lsum = lsum * alpha
                    al = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, O_L)), 1)
                    a0 = a0 * al
                    a1 = a1 * al
                    a2 = a2 * al
                    a3 = a3 * al
                    m = m_new
                p = gl.exp2(s - gl.expand_dims(m, 1))
                lsum = lsum + gl.sum(p, axis=1)
            else:
                alpha = gl.exp2(m - m_new)
                p = gl.exp2(s - gl.expand_dims(m_new, 1))
                lsum = lsum * alpha + gl.sum(p, axis=1)
                m = m_new
                # every accumulator rescaled before the first value MMA goes out (an instruction writing an
                # accumulator among the MMAs would make ptxas serialise them)
                al = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, O_L)), 1)
                a0 = a0 * al
                a1 = a1 * al
                a2 = a2 * al
                a3 = a3 * al
            # p through this warpgroup's own shared buffer (an async MMA with p in registers makes ptxas
            # serialise every wgmma for want of registers)
            ps.store(p.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            a0t = warpgroup_mma(ps, kv[J0].index(b), a0, is_async=True)
            a1t = warpgroup_mma(ps, kv[J0 + 1].index(b), a1, is_async=True)
            a2t = warpgroup_mma(ps, kv[J0 + 2].index(b), a2, is_async=True)
            a3t = warpgroup_mma(ps, kv[J0 + 3].index(b), a3, is_async=True)
        a0, a1, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=(a0t, a1t, a2t, a3t))
        if SPLIT:
            empty = lsum == 0.0
            inv = 1.0 / gl.where(empty, 1.0, lsum)
            if PART == 0:
                lse = gl.where(empty, -1e30, m + gl.log2(gl.where(empty, 1.0, lsum)))
                gl.store(lse_ptr + (row * nsp + sp) * H + hs, lse, mask=hs < H)
            base = (row * nsp + sp) * H
        else:
            sink = gl.load(sink_ptr + hs, mask=hs < H, other=0.0).to(gl.float32) * 1.4426950408889634
            mx = gl.maximum(m, sink)
            keep = gl.exp2(m - mx)
            inv = keep / (lsum * keep + gl.exp2(sink - mx))
            base = row * H
        ho = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, O_L))
        _g_store(o_ptr, base, ho, H, a0, inv, 64 * J0, 64, O_L)
        _g_store(o_ptr, base, ho, H, a1, inv, 64 * J0 + 64, 64, O_L)
        _g_store(o_ptr, base, ho, H, a2, inv, 64 * J0 + 128, 64, O_L)
        _g_store(o_ptr, base, ho, H, a3, inv, 64 * J0 + 192, 64, O_L)

    @gluon.jit
    def _sparse_decode_ws(q_ptr, pool_ptr, pool16_ptr, idx_ptr, sink_ptr, o_ptr, lse_ptr, K, H, qk_scale, fo_ptr,
                          cnt_ptr, SPLIT: gl.constexpr, STAGES: gl.constexpr, ROW: gl.constexpr, WIDE: gl.constexpr,
                          L2PF: gl.constexpr, FUSED: gl.constexpr, QA: gl.constexpr, KSPLIT: gl.constexpr,
                          LAZY: gl.constexpr, NPROD: gl.constexpr, IDXA: gl.constexpr, CREGS: gl.constexpr,
                          PREGS: gl.constexpr):
        """:func:`_sparse_decode_gluon`'s math, warp-specialised: this launch's 4 warps run the producer
        (``NPROD`` 2: the first of two; the second gets ``PREGS`` registers), two consumer warpgroups
        (``CREGS`` registers each) join them. Each consumer loads half of q while the producer's first
        gathers fly. Chunks are cut in 64-slot tiles, as for the other kernels."""
        BT: gl.constexpr = 32
        BH: gl.constexpr = 64
        row = gl.program_id(0).to(gl.int64)
        sp = gl.program_id(1)
        nsp = gl.num_programs(1)
        h0 = gl.program_id(2) * BH
        MG: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
        MMA_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        P_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        RAW: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        q_s = gl.allocate_shared_memory(gl.bfloat16, [BH, 512], MMA_SL)
        # the two bf16 tile buffers, one allocation a 64-channel tile (stores to slices of one allocation would
        # put a barrier between them)
        kv = (gl.allocate_shared_memory(gl.bfloat16, [2, BT, 64], MMA_SL),
              gl.allocate_shared_memory(gl.bfloat16, [2, BT, 64], MMA_SL),
              gl.allocate_shared_memory(gl.bfloat16, [2, BT, 64], MMA_SL),
              gl.allocate_shared_memory(gl.bfloat16, [2, BT, 64], MMA_SL),
              gl.allocate_shared_memory(gl.bfloat16, [2, BT, 64], MMA_SL),
              gl.allocate_shared_memory(gl.bfloat16, [2, BT, 64], MMA_SL),
              gl.allocate_shared_memory(gl.bfloat16, [2, BT, 64], MMA_SL),
              gl.allocate_shared_memory(gl.bfloat16, [2, BT, 64], MMA_SL))
        p_s = gl.allocate_shared_memory(gl.bfloat16, [2, BH, BT], P_SL)  # one p buffer a consumer
        r0 = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 256], RAW)
        r1 = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 128], RAW)
        r2 = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 64], RAW)
        rr = gl.allocate_shared_memory(gl.int16, [STAGES, BT, 64], RAW)
        rw = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 8], RAW)
        # KSPLIT: each consumer's half of the scores, by tile parity (else a token buffer)
        xs = gl.allocate_shared_memory(gl.float32, [4, BH, BT] if KSPLIT else [1, 1, 1], RAW)
        kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        x_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(kv_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=2)  # both consumer warpgroups release a buffer
            mbarrier.init(x_ready.index(i), count=2)  # both halves of a tile's scores are there
        nt = gl.cdiv(K, 64)  # 64-slot tiles per row, dealt evenly to the chunks
        lo = (sp * nt // nsp) * 64
        hi = gl.minimum(((sp + 1) * nt // nsp) * 64, K)
        q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready.index(0), count=2)  # both consumers' halves of q
        # the launch's own warps run the (first) producer; the two consumers are workers with CREGS registers
        # each (as is a second producer, with PREGS): the producer is left with the rest
        if NPROD == 2:  # two producers, each with its own ring, take alternate tiles (one tile buffer each)
            s0 = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 256], RAW)
            s1 = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 128], RAW)
            s2 = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 64], RAW)
            sr = gl.allocate_shared_memory(gl.int16, [STAGES, BT, 64], RAW)
            sw = gl.allocate_shared_memory(gl.uint8, [STAGES, BT, 8], RAW)
            gl.warp_specialize([
                (_ws_producer, (pool_ptr, pool16_ptr, idx_ptr, r0, r1, r2, rr, rw, kv, kv_ready, kv_empty, row, K, lo,
                                hi, ROW, WIDE, L2PF, BT, STAGES, 0, 2, IDXA)),
                (_ws_consumer, (q_ptr, q_s, q_ready, p_s, kv, kv_ready, kv_empty, xs, x_ready, idx_ptr, sink_ptr, o_ptr,
                                lse_ptr, row, sp, nsp, h0, K, H, lo, hi, qk_scale, 0, SPLIT, BT, KSPLIT, LAZY, QA)),
                (_ws_consumer, (q_ptr, q_s, q_ready, p_s, kv, kv_ready, kv_empty, xs, x_ready, idx_ptr, sink_ptr, o_ptr,
                                lse_ptr, row, sp, nsp, h0, K, H, lo, hi, qk_scale, 1, SPLIT, BT, KSPLIT, LAZY, QA)),
                (_ws_producer, (pool_ptr, pool16_ptr, idx_ptr, s0, s1, s2, sr, sw, kv, kv_ready, kv_empty, row, K, lo,
                                hi, ROW, WIDE, L2PF, BT, STAGES, 1, 2, IDXA)),
            ], [4, 4, 4], [CREGS, CREGS, PREGS])
        else:
            gl.warp_specialize([
                (_ws_producer, (pool_ptr, pool16_ptr, idx_ptr, r0, r1, r2, rr, rw, kv, kv_ready, kv_empty, row, K, lo,
                                hi, ROW, WIDE, L2PF, BT, STAGES, 0, 1, IDXA)),
                (_ws_consumer, (q_ptr, q_s, q_ready, p_s, kv, kv_ready, kv_empty, xs, x_ready, idx_ptr, sink_ptr, o_ptr,
                                lse_ptr, row, sp, nsp, h0, K, H, lo, hi, qk_scale, 0, SPLIT, BT, KSPLIT, LAZY, QA)),
                (_ws_consumer, (q_ptr, q_s, q_ready, p_s, kv, kv_ready, kv_empty, xs, x_ready, idx_ptr, sink_ptr, o_ptr,
                                lse_ptr, row, sp, nsp, h0, K, H, lo, hi, qk_scale, 1, SPLIT, BT, KSPLIT, LAZY, QA)),
            ], [4, 4], [CREGS, CREGS])
        if SPLIT and FUSED:  # the partitions have joined: every partial is stored
            _g_count_in(cnt_ptr, o_ptr, lse_ptr, sink_ptr, fo_ptr, row, h0, H, nsp, BH, MG)


def sparse_mla_decode(q: torch.Tensor, pool: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor, scale: float,
                      *, out: torch.Tensor | None = None, config: SparseConfig | None = None) -> torch.Tensor:
    """Triton :func:`sparse_mla_decode_ref`: bf16 tensor-core dots over exactly dequantised keys (fp32 dots
    for an fp32 q); ``config`` overrides :func:`sparse_config`.

    A decode step calls this once per layer, so the host side is kept short: the launch plan is cached
    per shape, and the chunks' partials and the exchange scratch live in one per-device workspace reused
    by every call (calls on one stream run in order; concurrent streams need their own process-level
    serialisation, as for the other decode kernels' counters)."""
    from kernels.kv584 import HEAD_DIM, TOKEN_BYTES

    b, h, d = q.shape
    if d != HEAD_DIM:
        raise ValueError(f"sparse_mla_decode: q must be [B, H, {HEAD_DIM}], got {tuple(q.shape)}")
    if indices.dim() != 2 or indices.shape[0] != b:
        raise ValueError(f"sparse_mla_decode: indices must be [{b}, K], got {tuple(indices.shape)}")
    if pool.dtype != torch.uint8 or pool.shape[-1] != TOKEN_BYTES:
        raise ValueError(f"kv584: the pool must be uint8 [..., {TOKEN_BYTES}], got {pool.dtype} {tuple(pool.shape)}")
    o = out if out is not None else torch.empty_like(q)
    k = indices.shape[1]
    if b == 0:
        return o
    if k == 0:
        return o.zero_()
    dev = q.device
    plan = _plan(b, h, k, q.dtype, dev.type, dev.index, pool.numel() >= 2**31, config, _INTERP)
    grid, n_split, part_bf16, n_part, n_lse, n_p, n_m, args, plan_key = plan
    qc = q if q.is_contiguous() else q.contiguous()
    idx = indices if indices.dtype == torch.int32 and indices.is_contiguous() else indices.to(torch.int32).contiguous()
    sk = sinks if sinks.dtype == torch.float32 and sinks.is_contiguous() else sinks.float().contiguous()
    pools = _pool_views(pool)
    qk = float(scale) * LOG2E
    # a launch key for the compiled kernel: the shape (in the plan), the split, and the 16-byte alignment of
    # the caller's tensors that Triton specialises on (the workspace's are always aligned)
    fast = plan_key if args["FAST"] else None
    if fast is not None:
        al = (qc.data_ptr() | pools[0].data_ptr() | idx.data_ptr() | sk.data_ptr() | o.data_ptr()) & 15 == 0
    if args["GLUON"]:
        gargs = {"SPLIT": n_split > 1, "STAGES": args["num_stages"], "ROW": TOKEN_BYTES, "WIDE": args["WIDE"],
                 "L2PF": bool(args["L2PF"]), "EARLY": args["EARLY"], "LSUMW": args["LSUMW"], "IDXA": args["IDXA"],
                 "FUSED": args["FUSED"], "QA": args["QA"], "KSPLIT": args["KSPLIT"],
                 "LAZY": args["LAZY"], "CF": args["CF"], "num_warps": 8}
        kernel = _sparse_decode_gluon
        if args["WS"]:  # 4 warps launched (the first consumer), 8 more in the partitions: 168 registers a thread
            kernel = _sparse_decode_ws
            regs = WS_REGS[args["NPROD"]]
            gargs.update(num_warps=4, maxnreg=regs[0], CREGS=regs[1], PREGS=regs[2], NPROD=args["NPROD"])
        if n_split == 1:
            _launch(kernel, fast and (fast, 4, al), grid, (qc, pools[0], pools[1], idx, sk, o, sk, k, h,
                    qk, o, idx), gargs)
            return o
        part, lse, _, _ = _workspace(dev, n_part, n_lse, 0, 0, part_bf16, args["LOW"])
        cnt = _counters(dev, b * grid[2]) if args["FUSED"] else idx
        _launch(kernel, fast and (fast, 5, al), grid, (qc, pools[0], pools[1], idx, sk, part, lse, k, h,
                qk, o, cnt), gargs)
        if args["FUSED"]:
            return o
        _launch(_combine_kernel, fast and (fast, 3, al), (b, -(-h // 8), 1), (part, lse, sk, o, h, n_split),
                {"num_warps": 4}, BLOCK_H=8, EXACT=False)
        return o
    if n_split == 1 and not n_p:
        _launch(_sparse_decode_kernel, fast and (fast, 0, al), grid, (qc, *pools, idx, sk, o, o, k, h, qk, sk, sk, o,
                idx), args, SPLIT=False)
        return o
    part, lse, p_scr, m_scr = _workspace(dev, n_part, n_lse, n_p, n_m, part_bf16, args["LOW"])
    if n_split == 1:
        _launch(_sparse_decode_kernel, fast and (fast, 1, al), grid, (qc, *pools, idx, sk, o, o, k, h, qk, p_scr,
                m_scr, o, idx), args, SPLIT=False)
        return o
    cnt = _counters(dev, b * grid[2]) if args["FUSED"] else idx
    _launch(_sparse_decode_kernel, fast and (fast, 2, al), grid, (qc, *pools, idx, sk, part, lse, k, h, qk, p_scr,
            m_scr, o, cnt), args, SPLIT=True)
    if args["FUSED"]:
        return o
    _launch(_combine_kernel, fast and (fast, 3, al), (b, -(-h // 8), 1), (part, lse, sk, o, h, n_split),
            {"num_warps": 4 if args["num_warps"] > 1 else 1}, BLOCK_H=8, EXACT=args["EXACT"])
    return o


_COMPILED: dict[tuple, tuple] = {}
# the warp-specialised kernel's registers a thread, by its producer count: at launch (12 or 16 warps in one
# 64K register file), then each consumer warpgroup's and the second producer's (the first producer gets the
# rest: warpgroups x launch count - the others)
WS_REGS = {1: (168, 208, 0), 2: (128, 208, 48)}


def _launch(fn, key, grid, pos: tuple, args: dict, **more) -> None:
    """:func:`kernels._launch.launch` with this module's cache of compiled kernels."""
    launch(fn, key, grid, pos, args, _COMPILED, **more)


@functools.lru_cache(maxsize=256)
def _plan(b: int, h: int, k: int, dtype: torch.dtype, dev_type: str, dev_index: int | None, wide: bool,
          config: SparseConfig | None, interp: bool) -> tuple:
    """Grid, chunk count, workspace sizes and compile-time arguments of one launch shape."""
    from kernels.kv584 import TOKEN_BYTES

    dev = torch.device(dev_type, dev_index)
    cap = capability(dev)
    low = dtype != torch.float32
    cfg = config or sparse_config(b, h, k, cap, low, _num_sms(dev) if cap else 132)
    bt = cfg.block_t
    n_split = max(1, min(cfg.n_split, triton.cdiv(k, bt)))
    hb = triton.cdiv(h, cfg.block_h)
    f32 = interp or not low  # fp32 dots: an fp32 q, and the interpreter (its bf16 dot is wrong)
    args = dict(BLOCK_H=cfg.block_h, BLOCK_T=bt, HW_CAST=fp8_hw_cast(cap), DT=tl.float32 if f32 else tl.bfloat16,
                PREC="ieee" if f32 else "tf32", LOW=low, QCAST=low and (dtype != torch.bfloat16 or f32),
                EXACT=interp, PREFETCH=cfg.prefetch, LAZY=cfg.lazy, ROW=TOKEN_BYTES, WIDE=wide, XCHG=cfg.xchg,
                IDXPF=cfg.idx_prefetch and not cfg.prefetch, FUSED=cfg.fused_combine and n_split > 1,
                L2PF=0 if interp else min(int(cfg.l2_prefetch), 2), FAST=cfg.fast_launch and not interp,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    args["GLUON"] = use_gluon(cfg, cap, low, interp)
    args["EARLY"] = min(4, max(1, cfg.early_parts))
    args["LSUMW"] = cfg.wg_sums
    args["IDXA"] = cfg.idx_ahead
    args["QA"] = cfg.q_async and dtype == torch.bfloat16
    args["WS"] = cfg.warp_spec
    args["KSPLIT"] = cfg.score_split
    args["NPROD"] = 2 if cfg.producers > 1 else 1
    args["CF"] = cfg.row_warps
    progs = b * n_split * hb
    n_part, n_lse = (b * n_split * h * 512, b * n_split * h) if n_split > 1 else (0, 0)
    n_p, n_m = (2 * progs * cfg.block_h * bt, 2 * progs * cfg.block_h) if cfg.xchg and not args["GLUON"] else (0, 0)
    key = (b, h, k, dtype, dev_type, dev_index, wide, config, interp)  # what this plan was made from
    return (b, n_split, hb), n_split, cfg.part_bf16, n_part, n_lse, n_p, n_m, args, key


def use_gluon(cfg: SparseConfig, cap: tuple[int, int] | None, low: bool, interp: bool) -> bool:
    """Whether a launch takes the Gluon kernel: asked for, on sm90 (wgmma; the interpreter and other parts
    run the tl kernel), a 16-bit q, and its fixed tiles (64 heads a block, 64-slot tiles)."""
    return (cfg.gluon and HAVE_GLUON and not interp and cap is not None and cap[0] == 9 and low
            and cfg.block_h == 64 and cfg.block_t == 64)


_WORKSPACE: dict[torch.device, torch.Tensor] = {}
_WS_VIEWS: dict[tuple, tuple[torch.Tensor, ...]] = {}
_POOL_VIEWS: dict[int, tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = {}
_INTERP = interpreting()  # fixed when the kernels were defined (triton.jit decides it then)


def _workspace(dev: torch.device, n_part: int, n_lse: int, n_p: int, n_m: int, part_bf16: bool,
               low: bool) -> tuple[torch.Tensor, ...]:
    """Views of one per-device buffer (grown on demand, views cached per size): partials, their
    log-sum-exps, p's scratch (bf16 for a 16-bit q) and the maxima's, each 256-byte aligned."""
    key = (dev, n_part, n_lse, n_p, n_m, part_bf16, low)
    views = _WS_VIEWS.get(key)
    if views is not None:
        return views
    sizes = [-(-max(n * w, 1) // 256) * 256 for n, w in
             ((n_part, 2 if part_bf16 else 4), (n_lse, 4), (n_p, 2 if low else 4), (n_m, 4))]
    total = sum(sizes)
    buf = _WORKSPACE.get(dev)
    if buf is None or buf.numel() < total:
        buf = _WORKSPACE[dev] = torch.empty(max(total, 1 << 20), dtype=torch.uint8, device=dev)
        for stale in [kk for kk in _WS_VIEWS if kk[0] == dev]:
            del _WS_VIEWS[stale]
    dts = (torch.bfloat16 if part_bf16 else torch.float32, torch.float32, torch.bfloat16 if low else torch.float32,
           torch.float32)
    out, at = [], 0
    for n, dt in zip(sizes, dts):
        out.append(buf[at:at + n].view(dt))
        at += n
    views = _WS_VIEWS[key] = tuple(out)
    return views


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counters(dev: torch.device, n: int) -> torch.Tensor:
    """Arrival counters of the fused merge, one per (row, head block), zero between calls (the merging
    program resets its own)."""
    have = _COUNTERS.get(dev)
    if have is None or have.numel() < n:
        have = _COUNTERS[dev] = torch.zeros(max(n, 1024), dtype=torch.int32, device=dev)
    return have


def _pool_views(pool: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The pool as rows of bytes, of int16 and of int64 (the last two pools' views are kept: a decode step
    asks for the same pool once per layer)."""
    from kernels.kv584 import TOKEN_BYTES

    hit = _POOL_VIEWS.get(id(pool))
    if hit is not None and hit[0] is pool:  # the entry holds the pool: its id cannot be reused meanwhile
        return hit[1]
    flat = pool.view(-1, TOKEN_BYTES)
    views = (flat, flat.view(torch.int16), flat.view(torch.int64))
    if len(_POOL_VIEWS) >= 2:
        _POOL_VIEWS.pop(next(iter(_POOL_VIEWS)))
    _POOL_VIEWS[id(pool)] = (pool, views)
    return views


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    return _sms(device.index if device.index is not None else torch.cuda.current_device())


# --- parity ------------------------------------------------------------------------------------------

def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    from kernels.kv584 import HEAD_DIM, kv584_store_ref, new_pool

    b, h, k, pages, page = case.params["shape"]
    pool = new_pool(pages, page, device)
    n = pages * page
    kv = torch.randn(n, HEAD_DIM, generator=gen, device=device)
    kv584_store_ref(kv, pool, torch.arange(n, device=device))
    idx = torch.stack([torch.randperm(n, generator=gen, device=device)[:k] for _ in range(b)]).to(torch.int32)
    drop = torch.rand(b, k, generator=gen, device=device) < case.params.get("drop", 0.2)
    idx = idx.masked_fill(drop, -1)
    if b > 1:
        idx[-1] = -1  # a row with nothing to attend: only the sink
    q = (torch.randn(b, h, HEAD_DIM, generator=gen, device=device) * 0.5).to(case.dtype)
    return {"q": q, "pool": pool, "indices": idx, "sinks": torch.randn(h, generator=gen, device=device),
            "scale": HEAD_DIM ** -0.5}


SPEC = ParitySpec(
    op="sparse_mla_decode", make_inputs=_inputs, reference=sparse_mla_decode_ref,
    kernel=lambda out, **i: sparse_mla_decode(**i, out=out[0]),
    cases=[Case("2x16 heads k40", {"shape": (2, 16, 40, 4, 16)}),
           Case("2x4 heads k24 fp32", {"shape": (2, 4, 24, 2, 16)}, dtype=torch.float32),
           Case("3x20 heads k17", {"shape": (3, 20, 17, 2, 16)}),
           Case("flash decode b32 h64 k640", {"shape": (32, 64, 640, 512, 64)}, devices=("cuda",)),
           Case("flash decode b64 h64 k640", {"shape": (64, 64, 640, 1024, 64)}, devices=("cuda",))],
    checks=[Check("gemm_diff", 2e-5, "bf16 probabilities into fp32-accumulated dots over exact keys (FlashMLA's "
                  "choice), plus the bf16 output's own rounding, which alone is ~5e-6", dtypes=(torch.bfloat16,)),
            Check("allclose", 1.0, "fp32 q: fp32 dots over exact keys, online vs one-pass softmax",
                  opts={"atol": 1e-5, "rtol": 1e-4}, dtypes=(torch.float32,))],
    description="sparse MLA decode over the 584-byte FP8 pool with a per-head sink",
)
