"""The compressor's fused store: gated pooling of a window, RMSNorm, rope on the trailing 64 channels,
FP8 quantisation and the write into the 584-byte pool, in one pass over the window.

Inputs are one window per entry: ``kv[n, L, 512]`` source projections and ``gate[n, L, 512]`` logits with
the slot bias already added (``-inf`` where a slot has no source token: CSA's first window). The pooling
is an online softmax over ``L`` per channel, so HCA's 128-token windows stream through registers.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.arch import capability, fp8_hw_cast, interpreting
from kernels.harness import Case, Check, ParitySpec
from kernels.kv584 import (
    HEAD_DIM,
    N_TILES,
    NOPE_DIM,
    ROPE_DIM,
    SCALE_OFFSET,
    TOKEN_BYTES,
    _flat,
    _words,
    kv584_load_ref,
    kv584_store_ref,
    new_pool,
    pack_row,
    pack_words,
    store_tiles,
    store_words,
)


def compress_ref(kv: torch.Tensor, gate: torch.Tensor, norm_weight: torch.Tensor, eps: float, cos: torch.Tensor,
                 sin: torch.Tensor) -> torch.Tensor:
    """fp32 entries ``[n, 512]``: softmax-gated sum over the window, RMSNorm, interleaved rope on the tail."""
    from kernels.rope import rope_ref

    p = gate.float().softmax(dim=1)
    pooled = (kv.float() * p).sum(dim=1)
    y = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + eps) * norm_weight.float()
    return torch.cat([y[:, :-ROPE_DIM], rope_ref(y[:, -ROPE_DIM:], cos, sin)], dim=1)


def compress_store_ref(kv, gate, norm_weight, eps, cos, sin, pool, slots) -> torch.Tensor:
    """The oracle: :func:`compress_ref`, then pack into ``pool[slots]``."""
    return kv584_store_ref(compress_ref(kv, gate, norm_weight, eps, cos, sin), pool, slots)


@triton.jit
def _compress_kernel(kv_ptr, gate_ptr, w_ptr, cos_ptr, sin_ptr, slot_ptr, pool_ptr, pool16_ptr, L, eps,
                     BLOCK_L: tl.constexpr, HW_CAST: tl.constexpr, EXACT: tl.constexpr, ROW: tl.constexpr = TOKEN_BYTES):
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    c = tl.arange(0, 512)
    m = tl.full([512], float("-inf"), tl.float32)
    lsum = tl.zeros([512], dtype=tl.float32)
    acc = tl.zeros([512], dtype=tl.float32)
    for l0 in range(0, L, BLOCK_L):
        r = l0 + tl.arange(0, BLOCK_L)
        rm = (r < L)[:, None]
        base = (i * L + r[:, None]) * 512 + c[None, :]
        g = tl.load(gate_ptr + base, mask=rm, other=float("-inf")).to(tl.float32)
        x = tl.load(kv_ptr + base, mask=rm, other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(g, axis=0))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - safe)
        p = tl.exp(g - safe[None, :])
        lsum = lsum * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p * x, axis=0)
        m = m_new
    pooled = acc / lsum
    rstd = 1.0 / tl.sqrt_rn(tl.sum(pooled * pooled, axis=0) / 512 + eps)
    y = pooled * rstd * tl.load(w_ptr + c).to(tl.float32)
    ye, yo = tl.split(tl.reshape(y, [256, 2]))
    pr = tl.arange(0, 256)
    tail = pr >= 224
    cs = tl.load(cos_ptr + i * 32 + (pr - 224), mask=tail, other=1.0)
    sn = tl.load(sin_ptr + i * 32 + (pr - 224), mask=tail, other=0.0)
    y = tl.reshape(tl.join(ye * cs - yo * sn, ye * sn + yo * cs), [512])
    if slot >= 0:
        pack_row(y, pool_ptr + slot * ROW, pool16_ptr + slot * (ROW // 2), HW_CAST, EXACT)


@triton.jit
def _exp(x, FAST: tl.constexpr):
    """``e^x``; ``FAST`` (GPU): ``ex2.approx.ftz`` of ``x·log2 e``, two instructions instead of tl.exp's five (its
    extra ones rescue results below 2^-126, which weigh nothing against the window's largest weight 1)."""
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.exp(x)


@triton.jit
def _pool_elem(g, x, m, lsum, acc, FAST: tl.constexpr = False):
    """One window row into the per-channel online softmax: elementwise, nothing crosses threads, and one
    exp per element (the larger of ``m`` and ``g`` gets weight 1, the other ``exp(-|g - m|)``)."""
    up = g > m
    d = tl.where(up, m - g, g - m)
    e = _exp(tl.where(tl.maximum(m, g) == float("-inf"), float("-inf"), d), FAST)  # both -inf: weight 0, no NaN
    alpha = tl.where(up, e, 1.0)
    p = tl.where(up, 1.0, e)
    return tl.maximum(m, g), lsum * alpha + p, acc * alpha + p * x


@triton.jit
def _compress_unrolled_kernel(kv_ptr, gate_ptr, w_ptr, cos_ptr, sin_ptr, slot_ptr, pool64_ptr, n, L, eps,
                              ENTRIES: tl.constexpr, UNROLL: tl.constexpr, HW_CAST: tl.constexpr,
                              EXACT: tl.constexpr, EVICT: tl.constexpr, FAST: tl.constexpr = False,
                              NT: tl.constexpr = N_TILES, NOPE: tl.constexpr = NOPE_DIM):
    """``ENTRIES`` entries per program; the window streams row by row (``UNROLL`` rows per loop trip, so their
    loads are in flight together) through a per-channel online softmax, with no reduction over the window."""
    eid = tl.program_id(0).to(tl.int64) * ENTRIES + tl.arange(0, ENTRIES)
    live = eid < n
    slot = tl.load(slot_ptr + eid, mask=live, other=-1).to(tl.int64)
    tile = tl.arange(0, 8)
    wi = tl.arange(0, 8)
    col = tile[:, None, None] * 64 + wi[None, :, None] * 8 + wi[None, None, :]  # [8, 8, 8]
    tm = (tile < NT)[:, None, None]
    j = tl.arange(0, 16)
    two = tl.arange(0, 2)
    rcol = NOPE + j[:, None, None] * 4 + two[None, :, None] * 2 + two[None, None, :]  # [16, 2, 2]
    m = tl.full([ENTRIES, 8, 8, 8], float("-inf"), tl.float32)
    lsum = tl.zeros([ENTRIES, 8, 8, 8], dtype=tl.float32)
    acc = tl.zeros([ENTRIES, 8, 8, 8], dtype=tl.float32)
    mr = tl.full([ENTRIES, 16, 2, 2], float("-inf"), tl.float32)
    lr = tl.zeros([ENTRIES, 16, 2, 2], dtype=tl.float32)
    ar = tl.zeros([ENTRIES, 16, 2, 2], dtype=tl.float32)
    e4 = eid[:, None, None, None]
    for l0 in range(0, L, UNROLL):
        for u in tl.static_range(UNROLL):
            lm = live & (eid * 0 + (l0 + u) < L)
            base = (e4 * L + l0 + u) * 512
            m4 = lm[:, None, None, None] & tm[None]
            g = tl.load(gate_ptr + base + col[None], mask=m4, other=float("-inf")).to(tl.float32)
            x = tl.load(kv_ptr + base + col[None], mask=m4, other=0.0).to(tl.float32)
            mr4 = lm[:, None, None, None]
            gr = tl.load(gate_ptr + base + rcol[None], mask=mr4, other=float("-inf")).to(tl.float32)
            xr = tl.load(kv_ptr + base + rcol[None], mask=mr4, other=0.0).to(tl.float32)
            m, lsum, acc = _pool_elem(g, x, m, lsum, acc, FAST)
            mr, lr, ar = _pool_elem(gr, xr, mr, lr, ar, FAST)
    pooled = tl.where(tm[None], acc / lsum, 0.0)
    pr = ar / lr
    ss = tl.sum(tl.sum(tl.sum(pooled * pooled, axis=3), axis=2), axis=1)
    ss += tl.sum(tl.sum(tl.sum(pr * pr, axis=3), axis=2), axis=1)  # [E]
    rstd = 1.0 / tl.sqrt_rn(ss / 512 + eps)
    yn = pooled * rstd[:, None, None, None] * tl.load(w_ptr + col, mask=tm, other=0.0).to(tl.float32)[None]
    yr = pr * rstd[:, None, None, None] * tl.load(w_ptr + rcol).to(tl.float32)[None]
    ye, yo = tl.split(yr)  # [E, 16, 2]: pair 2j + p
    pidx = eid[:, None, None] * 32 + j[None, :, None] * 2 + two[None, None, :]
    cs = tl.load(cos_ptr + pidx, mask=live[:, None, None], other=1.0)
    sn = tl.load(sin_ptr + pidx, mask=live[:, None, None], other=0.0)
    rope = tl.reshape(tl.join(ye * cs - yo * sn, ye * sn + yo * cs), [ENTRIES, 16, 4])
    q, r, sw = pack_words(yn, rope, HW_CAST, EXACT)
    store_words(pool64_ptr, slot, slot >= 0, q, r, sw, EVICT)


@triton.jit
def _rows2(gp, kvp, off, EVICT: tl.constexpr, CACHE: tl.constexpr = ""):
    """Window rows ``off`` and ``off + 512`` (int32 element offsets ``[8, 64]``): gates and sources (fp32)
    ``[8, 64, 2]``, the two rows side by side in each thread."""
    g = tl.join(tl.load(gp + off, eviction_policy=EVICT, cache_modifier=CACHE),
                tl.load(gp + off + 512, eviction_policy=EVICT, cache_modifier=CACHE))
    x = tl.join(tl.load(kvp + off, eviction_policy=EVICT, cache_modifier=CACHE),
                tl.load(kvp + off + 512, eviction_policy=EVICT, cache_modifier=CACHE))
    return g, x.to(tl.float32)


@triton.jit
def _rows(gp, kvp, off, U: tl.constexpr, EVICT: tl.constexpr, CACHE: tl.constexpr = ""):
    """``U`` (1, 2, 4 or 8) window rows from ``off``: gates and sources (fp32) ``[8, 64, U]``, the rows side by
    side in each thread (joined, so every load is issued before the first use of any)."""
    if U == 1:
        g = tl.load(gp + off, eviction_policy=EVICT, cache_modifier=CACHE)[:, :, None]
        x = tl.load(kvp + off, eviction_policy=EVICT, cache_modifier=CACHE).to(tl.float32)[:, :, None]
    elif U == 2:
        g, x = _rows2(gp, kvp, off, EVICT, CACHE)
    elif U == 4:
        g0, x0 = _rows2(gp, kvp, off, EVICT, CACHE)
        g1, x1 = _rows2(gp, kvp, off + 1024, EVICT, CACHE)
        g = tl.reshape(tl.join(g0, g1), [8, 64, 4])
        x = tl.reshape(tl.join(x0, x1), [8, 64, 4])
    else:
        tl.static_assert(U == 8, "rows per step: 1, 2, 4 or 8")
        g0, x0 = _rows2(gp, kvp, off, EVICT, CACHE)
        g1, x1 = _rows2(gp, kvp, off + 1024, EVICT, CACHE)
        g2, x2 = _rows2(gp, kvp, off + 2048, EVICT, CACHE)
        g3, x3 = _rows2(gp, kvp, off + 3072, EVICT, CACHE)
        g = tl.reshape(tl.join(tl.join(g0, g1), tl.join(g2, g3)), [8, 64, 8])
        x = tl.reshape(tl.join(tl.join(x0, x1), tl.join(x2, x3)), [8, 64, 8])
    return g, x


@triton.jit
def _pool_rows(g, x, m, lsum, acc, FAST: tl.constexpr):
    """Rows ``g``/``x`` ``[8, 64, U]`` (in-thread along U) into the per-channel online softmax: one max, one exp
    per element and one rescale per step (``FAST``: ``ex2.approx.ftz`` of ``g·log2 e − max·log2 e``, one FFMA)."""
    mx = tl.maximum(m, tl.max(g, axis=2))
    safe = tl.where(mx == float("-inf"), 0.0, mx)
    if FAST:
        sl = safe * 1.4426950408889634
        alpha = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [m * 1.4426950408889634 - sl],
                                          dtype=tl.float32, is_pure=True, pack=1)
        p = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [g * 1.4426950408889634 - sl[:, :, None]],
                                      dtype=tl.float32, is_pure=True, pack=1)
    else:
        alpha = tl.exp(m - safe)
        p = tl.exp(g - safe[:, :, None])
    return mx, lsum * alpha + tl.sum(p, axis=2), acc * alpha + tl.sum(p * x, axis=2)


@triton.jit
def _tail_inputs(w_ptr, cos_ptr, sin_ptr, slot_ptr, e, off, tile, is_rope):
    """What an entry's tail reads besides its pooled state: the norm weight, the rope angles (tile 7 only) and
    the pool slot ``[1]``."""
    w = tl.load(w_ptr + off)
    pidx = e * 32 + (tile[:, None] * 0 + tl.arange(0, 32)[None, :])  # [8, 32]: pair index
    cs = tl.load(cos_ptr + pidx, mask=is_rope, other=1.0)
    sn = tl.load(sin_ptr + pidx, mask=is_rope, other=0.0)
    slot = tl.load(slot_ptr + e + tl.arange(0, 1))
    return w, cs, sn, slot


@triton.jit
def _finish(acc, lsum, w, cs, sn, slot, is_rope, eps, pool8_ptr, pool32_ptr, pool64_ptr, HW_CAST: tl.constexpr,
            EXACT: tl.constexpr, EVICT: tl.constexpr):
    """An entry's tail from its pooled state ``acc / lsum`` ``[tile 8, 64]``: RMSNorm, rope on tile 7
    (interleaved pairs, each pair inside one thread), pack and store."""
    pooled = acc / lsum
    ss = tl.sum(tl.sum(pooled * pooled, axis=1), axis=0)
    y = pooled * (1.0 / tl.sqrt_rn(ss / 512 + eps)) * w
    ye, yo = tl.split(tl.reshape(y, [8, 32, 2]))
    rope = tl.reshape(tl.join(ye * cs - yo * sn, ye * sn + yo * cs), [8, 64])
    store_tiles(tl.where(is_rope, rope, y), slot, pool8_ptr, pool32_ptr, pool64_ptr, HW_CAST, EXACT, EVICT)


@triton.jit
def _compress_stream_kernel(kv_ptr, gate_ptr, w_ptr, cos_ptr, sin_ptr, slot_ptr, pool8_ptr, pool32_ptr, pool64_ptr,
                            L, eps, UNROLL: tl.constexpr, HW_CAST: tl.constexpr, EXACT: tl.constexpr,
                            EVICT: tl.constexpr, FAST: tl.constexpr = False, CACHE: tl.constexpr = "",
                            PRE: tl.constexpr = False, NT: tl.constexpr = N_TILES):
    """One entry per program, its window streamed ``UNROLL`` rows per step (the rows of a step side by side in
    each thread: all their loads go out first, then one max and one rescale per step; the rows past the last
    whole step one at a time), every tensor ``[tile 8, 64]`` over the 512 channels (tile 7 = rope) at int32
    offsets from the entry's base. A thread owns 4 adjacent channels: a 16-byte gate and an 8-byte source load
    per row, and in the tail its 4 e4m3 bytes become one int32 word and its 4 bf16 rope values one int64 word
    without leaving the thread (only the tile amax and the RMS sum are reductions). ``PRE``: the tail's inputs
    (norm weight, rope angles, slot) are loaded right after the first step's rows and folded into the state's
    zeros (``x · 0`` is not folded away for floats), so they arrive with those rows, not in a second round trip
    at the end (needs ``L >= UNROLL``, which the launcher keeps)."""
    e = tl.program_id(0).to(tl.int64)
    tile = tl.arange(0, 8)
    ch = tl.arange(0, 64)
    off = tile[:, None] * 64 + ch[None, :]  # [8, 64] int32
    is_rope = (tile == NT)[:, None]
    kvp = kv_ptr + e * L * 512
    gp = gate_ptr + e * L * 512
    m = tl.full([8, 64], float("-inf"), tl.float32)
    acc = tl.zeros([8, 64], dtype=tl.float32)
    lsum = tl.zeros([8, 64], dtype=tl.float32)
    start = 0
    if PRE:  # the first step's rows go out, then the tail's inputs; that step waits on all of them
        g0, x0 = _rows(gp, kvp, off, UNROLL, EVICT, CACHE)
        w, cs, sn, slot = _tail_inputs(w_ptr, cos_ptr, sin_ptr, slot_ptr, e, off, tile, is_rope)
        zero = (w + slot.to(tl.float32)[:, None] + tl.sum(tl.sum(cs + sn, axis=1), axis=0)) * 0.0
        m, lsum, acc = _pool_rows(g0, x0, m, zero, acc, FAST)
        start = UNROLL
    whole = L - L % UNROLL
    for l0 in range(start, whole, UNROLL):
        g, x = _rows(gp, kvp, l0 * 512 + off, UNROLL, EVICT, CACHE)
        m, lsum, acc = _pool_rows(g, x, m, lsum, acc, FAST)
    for lr in range(whole, L):
        g1, x1 = _rows(gp, kvp, lr * 512 + off, 1, EVICT, CACHE)
        m, lsum, acc = _pool_rows(g1, x1, m, lsum, acc, FAST)
    if not PRE:
        w, cs, sn, slot = _tail_inputs(w_ptr, cos_ptr, sin_ptr, slot_ptr, e, off, tile, is_rope)
    _finish(acc, lsum, w, cs, sn, slot, is_rope, eps, pool8_ptr, pool32_ptr, pool64_ptr, HW_CAST, EXACT, EVICT)


@triton.jit
def _compress_part_kernel(kv_ptr, gate_ptr, part_ptr, L, CHUNK, UNROLL: tl.constexpr, EVICT: tl.constexpr,
                          FAST: tl.constexpr = False, CACHE: tl.constexpr = ""):
    """Split windows, pass 1: program ``(entry, part)`` pools rows ``part · CHUNK ..`` (``CHUNK`` a multiple of
    ``UNROLL``) like :func:`_compress_stream_kernel` and writes its online-softmax state (max, sum, weighted sum:
    ``[3, 512]`` fp32) to ``part_ptr[entry, part]``."""
    e = tl.program_id(0).to(tl.int64)
    sp = tl.program_id(1)
    off = tl.arange(0, 8)[:, None] * 64 + tl.arange(0, 64)[None, :]  # [8, 64] int32
    row0 = e * L + sp * CHUNK
    kvp = kv_ptr + row0 * 512
    gp = gate_ptr + row0 * 512
    m = tl.full([8, 64], float("-inf"), tl.float32)
    lsum = tl.zeros([8, 64], dtype=tl.float32)
    acc = tl.zeros([8, 64], dtype=tl.float32)
    for l0 in range(0, CHUNK, UNROLL):
        g, x = _rows(gp, kvp, l0 * 512 + off, UNROLL, EVICT, CACHE)
        m, lsum, acc = _pool_rows(g, x, m, lsum, acc, FAST)
    base = part_ptr + (e * tl.num_programs(1) + sp) * 1536
    tl.store(base + off, m)
    tl.store(base + 512 + off, lsum)
    tl.store(base + 1024 + off, acc)


@triton.jit
def _compress_merge_kernel(part_ptr, w_ptr, cos_ptr, sin_ptr, slot_ptr, pool8_ptr, pool32_ptr, pool64_ptr, eps,
                           S: tl.constexpr, HW_CAST: tl.constexpr, EXACT: tl.constexpr, EVICT: tl.constexpr,
                           NT: tl.constexpr = N_TILES):
    """Split windows, pass 2: one program per entry merges its ``S`` partial states (exact ``exp``: the
    rescale factors multiply whole partial sums), then RMSNorm, rope, pack and store as the stream kernel's tail."""
    e = tl.program_id(0).to(tl.int64)
    tile = tl.arange(0, 8)
    off = tile[:, None] * 64 + tl.arange(0, 64)[None, :]
    is_rope = (tile == NT)[:, None]
    w, cs, sn, slot = _tail_inputs(w_ptr, cos_ptr, sin_ptr, slot_ptr, e, off, tile, is_rope)
    mm = tl.full([8, 64], float("-inf"), tl.float32)
    lsum = tl.zeros([8, 64], dtype=tl.float32)
    acc = tl.zeros([8, 64], dtype=tl.float32)
    for sp in tl.static_range(S):
        base = part_ptr + (e * S + sp) * 1536
        ms = tl.load(base + off)
        mx = tl.maximum(mm, ms)
        safe = tl.where(mx == float("-inf"), 0.0, mx)
        c0 = tl.exp(mm - safe)
        c1 = tl.exp(ms - safe)
        lsum = lsum * c0 + tl.load(base + 512 + off) * c1
        acc = acc * c0 + tl.load(base + 1024 + off) * c1
        mm = mx
    _finish(acc, lsum, w, cs, sn, slot, is_rope, eps, pool8_ptr, pool32_ptr, pool64_ptr, HW_CAST, EXACT, EVICT)


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _split(n: int, length: int, unroll: int, device: torch.device) -> int:
    """Parts per window for the split pass: a power of two that brings ``n · parts`` up to about
    :data:`STREAM_SPLIT_PROGRAMS` programs per SM, each part at least :data:`STREAM_SPLIT_ROWS` rows and a
    whole number of steps (1: no split)."""
    if not STREAM_SPLIT or device.type != "cuda" or interpreting() or n < STREAM_SPLIT_MIN_ENTRIES:
        return 1
    sms = _sms(device.index if device.index is not None else torch.cuda.current_device())
    if n >= sms:  # one program per SM already: splitting lost on the H200 (512 x 128 in 2 parts: 60.1 vs 58.2 us)
        return 1
    target = STREAM_SPLIT_PROGRAMS * sms
    parts = 1
    while (n * parts * 2 <= target and length % (parts * 2 * unroll) == 0
           and length // (parts * 2) >= STREAM_SPLIT_ROWS):
        parts *= 2
    return parts


COMPRESS_IMPL = "stream"  # the default kernel of compress_store
# H200 (round 1 of 2026-12-01 d, ceiling 4228 GB/s), 4096 x 8 / 16384 x 8 / 1024 x 128: stream, 4 rows per step with
# the tail's inputs loaded early, 69.8 / 91.4 / 91.7 % of copy (83.8 / 96.1 / 95.9 % of a same-size copy); 8 rows
# 66.6 / 90.6 / 92.4 %; the unrolled kernel 55.7 / 74.8 / 77.0 %
COMPRESS_WARPS = 4  # the unrolled kernel: warps, entries per program, window rows per loop trip
COMPRESS_ENTRIES = 1
COMPRESS_UNROLL = 2
# the unrolled and stream kernels' exp: ex2.approx.ftz (GPU) instead of tl.exp (stream, 8 rows: 66.6 / 90.6 /
# 92.4 % of copy, tl.exp 65.6 / 88.4 / 91.3 %)
COMPRESS_FAST_EXP = True
STREAM_UNROLL = 4  # the stream kernel: window rows per step (1, 2, 4 or 8; 8 warps: 62.5 / 86.3 / 88.4 %), warps
STREAM_WARPS = 4
STREAM_CACHE = ""  # the stream kernel's load cache modifier ("" or ".cg": L2 only; no faster)
# the stream kernel's L2 hint for CSA-sized windows (each row is read once). H200 (round 3, median of 3 passes):
# 4096 x 8 / 16384 x 8 at 74.9 / 92.2 % of copy with evict_first, 69.7 / 91.4 % without; HCA 1024 x 128 89.3 % with,
# 91.3 % without, so HCA windows go without
STREAM_EVICT = "evict_first"
STREAM_EVICT_ROWS = 16
# the stream kernel loads the tail's inputs with the first step's rows (8 rows per step: 72 registers, 7
# programs per SM, so 1024 HCA entries take two waves: 80.6 % at 1024 x 128)
STREAM_PRE = True
# windows of fewer entries than SMs (HCA at a 16K-token prefill: 128 entries) are split into parts pooled by
# separate programs, then merged: up to this many programs per SM, parts of at least this many rows, and only from
# STREAM_SPLIT_MIN_ENTRIES entries (a decode step's few entries keep the one pass). H200, graphed device time
# (v4_bench compress_parts, two passes): 128 x 128 one pass 32.1 us, 2 / 4 / 8 / 16 parts 25.4 / 21.9-22.2 /
# 22.8-23.1 / 25.3-25.7 us; 256 x 128 one pass 39.2-39.6 us, 2 parts 36.2-36.7 us; 512 x 128 one pass 58.2 us, 2 parts
# 60.1 us. Timed eagerly (events around each call, the GPU idle before it) the split's two launches and workspace
# cost more host time than the one pass's launch: 27-77 us against 34-41 us at 128 x 128, varying run to run. In a
# prefill the host runs ahead of the GPU's GEMMs, so the device time is what the split saves.
STREAM_SPLIT = True
STREAM_SPLIT_PROGRAMS = 4
STREAM_SPLIT_ROWS = 16
STREAM_SPLIT_MIN_ENTRIES = 64


def compress_store(kv, gate, norm_weight, eps, cos, sin, pool, slots, *, impl: str | None = None,
                   block_l: int | None = None, num_warps: int | None = None, entries: int | None = None,
                   evict: str | None = None, fast_exp: bool | None = None, parts: int | None = None) -> torch.Tensor:
    """Triton :func:`compress_store_ref`. ``impl``: ``"stream"``, one entry per program, the window ``block_l``
    rows per step (1, 2, 4 or 8) side by side in each thread (``evict``: the L2 hint of its loads and stores,
    None: :data:`STREAM_EVICT` for windows up to :data:`STREAM_EVICT_ROWS` rows, else none;
    ``parts`` > 1: each window pooled in that many parts by separate programs, then merged; None: by
    :func:`_split`);
    ``"unrolled"``, ``entries`` per program streaming the window ``block_l`` rows per loop trip through an
    elementwise online softmax, rows written as int64 words; ``"row"``: the byte-store kernel, one entry per
    program (also the path for a pool that is not 8-byte aligned). ``None``: :data:`COMPRESS_IMPL`.
    ``fast_exp``: :data:`COMPRESS_FAST_EXP` where None (GPU only)."""
    n, length, d = kv.shape
    if d != HEAD_DIM or gate.shape != kv.shape or cos.shape != (n, ROPE_DIM // 2):
        raise ValueError(f"compress_store: kv/gate must be [n, L, {HEAD_DIM}] and cos/sin [n, {ROPE_DIM // 2}], got "
                         f"{tuple(kv.shape)}, {tuple(gate.shape)}, {tuple(cos.shape)}")
    impl = impl or COMPRESS_IMPL
    if impl not in ("stream", "unrolled", "row"):
        raise ValueError(f"compress_store: impl must be 'stream', 'unrolled' or 'row', got {impl!r}")
    flat = _flat(pool)
    if not n:
        return pool
    args = (kv.contiguous(), gate.float().contiguous(), norm_weight.float().contiguous(), cos.float().contiguous(),
            sin.float().contiguous(), slots.to(torch.int64).contiguous())
    hw, exact = fp8_hw_cast(capability(kv.device)), interpreting()
    fast = bool(COMPRESS_FAST_EXP if fast_exp is None else fast_exp) and kv.is_cuda and not exact
    words = _words(flat) if impl != "row" else None
    if words is None:
        _compress_kernel[(n,)](*args, flat, flat.view(torch.int16), length, float(eps),
                               BLOCK_L=block_l or (8 if exact else 4), HW_CAST=hw, EXACT=exact,
                               num_warps=num_warps or 4)
    elif impl == "stream":
        unroll = 1 << (min(block_l or STREAM_UNROLL, 8, length).bit_length() - 1)  # a power of two <= the window
        parts = _split(n, length, unroll, kv.device) if parts is None else parts
        if evict is None:
            evict = STREAM_EVICT if length <= STREAM_EVICT_ROWS else ""
        if parts > 1 and length % (parts * unroll):
            raise ValueError(f"compress_store: {parts} parts of {unroll}-row steps do not tile a window of {length}")
        if parts > 1:
            part = torch.empty(n, parts, 3, HEAD_DIM, dtype=torch.float32, device=kv.device)
            _compress_part_kernel[(n, parts)](args[0], args[1], part, length, length // parts, UNROLL=unroll,
                                              EVICT=evict, FAST=fast, CACHE=STREAM_CACHE,
                                              num_warps=num_warps or STREAM_WARPS)
            _compress_merge_kernel[(n,)](part, *args[2:], flat, flat.view(torch.int32), words, float(eps), S=parts,
                                         HW_CAST=hw, EXACT=exact, EVICT=evict, num_warps=4)
        else:
            _compress_stream_kernel[(n,)](*args, flat, flat.view(torch.int32), words, length, float(eps),
                                          UNROLL=unroll, HW_CAST=hw, EXACT=exact, EVICT=evict, FAST=fast,
                                          CACHE=STREAM_CACHE, PRE=STREAM_PRE, num_warps=num_warps or STREAM_WARPS)
    else:
        ent = entries or COMPRESS_ENTRIES
        _compress_unrolled_kernel[(triton.cdiv(n, ent),)](*args, words, n, length, float(eps), ENTRIES=ent,
                                                          UNROLL=block_l or COMPRESS_UNROLL, HW_CAST=hw, EXACT=exact,
                                                          EVICT="", FAST=fast, num_warps=num_warps or COMPRESS_WARPS)
    return pool


# --- parity ------------------------------------------------------------------------------------------

def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    n, length, pages = case.params["shape"]
    kv = torch.randn(n, length, HEAD_DIM, generator=gen, device=device).to(case.dtype)
    gate = torch.randn(n, length, HEAD_DIM, generator=gen, device=device)
    if case.params.get("overlap"):
        gate[0, : length // 2] = float("-inf")  # CSA's first window: no previous half
    ang = torch.rand(n, ROPE_DIM // 2, generator=gen, device=device) * 6.28
    slots = torch.randperm(pages * 16, generator=gen, device=device)[:n]
    return {"kv": kv, "gate": gate, "norm_weight": 1 + 0.1 * torch.randn(HEAD_DIM, generator=gen, device=device),
            "eps": 1e-6, "cos": ang.cos(), "sin": ang.sin(), "pool": new_pool(pages, 16, device), "slots": slots}


def _ref(**inp):
    pool = compress_store_ref(**dict(inp, pool=inp["pool"].clone()))
    rows = _flat(pool)[inp["slots"]]
    return kv584_load_ref(pool, inp["slots"]), rows[:, SCALE_OFFSET:].contiguous()


def _run(out, **inp):
    pool = inp["pool"].clone()
    compress_store(**dict(inp, pool=pool))
    out[0].copy_(kv584_load_ref(pool, inp["slots"]))
    out[1].copy_(_flat(pool)[inp["slots"]][:, SCALE_OFFSET:])


SPEC = ParitySpec(
    op="compress_store", make_inputs=_inputs, reference=_ref, kernel=_run,
    cases=[Case("csa 3x8", {"shape": (3, 8, 2), "overlap": True}, dtype=torch.float32),
           Case("hca 2x128 bf16", {"shape": (2, 128, 2)}),
           Case("flash csa 4096x8", {"shape": (4096, 8, 512), "overlap": True}, devices=("cuda",)),
           Case("flash hca 256x128", {"shape": (256, 128, 32)}, devices=("cuda",))],
    checks=[Check("allclose", 1.0, "online vs two-pass softmax differ by fp32 ulps, which can move a value across "
                  "an e4m3 rounding boundary: one e4m3 step at most, 2^-3 relative, or for subnormals 2^-9 of "
                  "the tile scale (<= 2^-6 for these unit-RMS rows, so 2^-15 absolute)",
                  opts={"atol": 2.0**-15, "rtol": 0.13}, name="entries"),
            Check("bit_exact", 0, "the tile scales are powers of two picked from the amax: only an amax within an "
                  "ulp of a binade edge could flip one", output=1, name="scales")],
    description="CSA/HCA compressor: gated pool + RMSNorm + rope + FP8 quant + store into the 584-byte pool",
)
