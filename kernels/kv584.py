"""The paged FP8 KV pool of DeepSeek-V4: 584 bytes per token.

One token's 512-wide key (= value) is stored as

======  =====  ==========================================================================
bytes   width  content
======  =====  ==========================================================================
0       448    the nope channels, float8_e4m3fn, in 7 tiles of 64
448     128    the 64 rope channels, bfloat16 (little-endian), unquantised: rope must stay exact
576     7      one UE8M0 scale per nope tile (``2^(byte-127)``, the power of two at or above amax/448)
583     1      padding (zero), so a token row is 8-byte aligned
======  =====  ==========================================================================

Rows live in pages of ``page_size`` tokens; a slot index is ``page * page_size + offset``. ``kv584_store``
packs rows into slots, ``kv584_load`` unpacks slots; both are bit-exact with the references (the scale is
a power of two, so ``x / scale`` is exact and only the e4m3 rounding, RNE, remains).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._tl import cast_rne, e4m3_bits, e4m3_to_f32
from kernels.arch import capability, fp8_hw_cast, interpreting
from kernels.harness import Case, Check, ParitySpec

NOPE_DIM = 448
ROPE_DIM = 64
TILE = 64
N_TILES = NOPE_DIM // TILE  # 7
ROPE_BYTES = ROPE_DIM * 2  # bf16
SCALE_BYTES = N_TILES + 1  # 7 UE8M0 scales + 1 pad byte
TOKEN_BYTES = NOPE_DIM + ROPE_BYTES + SCALE_BYTES  # 584
HEAD_DIM = NOPE_DIM + ROPE_DIM  # 512
ROPE_OFFSET = NOPE_DIM
SCALE_OFFSET = NOPE_DIM + ROPE_BYTES  # 576
AMAX_FLOOR = 1e-4
FP8_MAX = 448.0


def new_pool(num_pages: int, page_size: int = 64, device: str | torch.device = "cpu") -> torch.Tensor:
    """An empty pool ``[num_pages, page_size, TOKEN_BYTES]`` uint8."""
    return torch.zeros(num_pages, page_size, TOKEN_BYTES, dtype=torch.uint8, device=device)


def _flat(pool: torch.Tensor) -> torch.Tensor:
    if pool.dtype != torch.uint8 or pool.shape[-1] != TOKEN_BYTES:
        raise ValueError(f"kv584: the pool must be uint8 [..., {TOKEN_BYTES}], got {pool.dtype} {tuple(pool.shape)}")
    return pool.view(-1, TOKEN_BYTES)


def pack_ref(kv: torch.Tensor) -> torch.Tensor:
    """The oracle: ``kv[N, 512]`` (any float dtype) → ``[N, 584]`` uint8 rows."""
    if kv.shape[-1] != HEAD_DIM:
        raise ValueError(f"kv584: rows must be {HEAD_DIM} wide ({NOPE_DIM} nope + {ROPE_DIM} rope), got {kv.shape[-1]}")
    n = kv.shape[0]
    nope = kv[:, :NOPE_DIM].float().view(n, N_TILES, TILE)
    amax = nope.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    s = amax / torch.full_like(amax, FP8_MAX)
    m, e = torch.frexp(s)
    e = torch.where(m == 0.5, e - 1, e)  # the power of two at or above s
    scale = torch.ldexp(torch.ones_like(s), e)
    q = (nope / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    rope = kv[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)
    scales = (e + 127).to(torch.uint8)
    pad = torch.zeros(n, 1, dtype=torch.uint8, device=kv.device)
    return torch.cat([q.reshape(n, NOPE_DIM), rope.reshape(n, ROPE_BYTES), scales, pad], dim=1)


def ue8m0_scale(byte: torch.Tensor) -> torch.Tensor:
    """UE8M0 scale bytes → fp32 ``2^(byte-127)`` built from bits, exact for every byte on any device: byte 0
    is the subnormal ``2^-127`` (bit 22), 255 is ``2^128`` = inf."""
    b = byte.to(torch.int32)
    return torch.where(b == 0, 1 << 22, b << 23).view(torch.float32)


def unpack_ref(rows: torch.Tensor) -> torch.Tensor:
    """``[N, 584]`` uint8 → ``[N, 512]`` fp32 (exact: e4m3 times a power of two; bf16 widened)."""
    n = rows.shape[0]
    q = rows[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float().view(n, N_TILES, TILE)
    nope = q * ue8m0_scale(rows[:, SCALE_OFFSET:SCALE_OFFSET + N_TILES]).unsqueeze(-1)
    rope = rows[:, ROPE_OFFSET:SCALE_OFFSET].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope.reshape(n, NOPE_DIM), rope], dim=1)


def kv584_store_ref(kv: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Pack ``kv[N, 512]`` into ``pool``'s slots (``-1``: skip); returns the pool."""
    flat = _flat(pool)
    keep = slots >= 0
    flat[slots[keep].long()] = pack_ref(kv[keep])
    return pool


def kv584_load_ref(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The rows at ``slots[N]`` unpacked to ``[N, 512]`` fp32 (zeros where the slot is ``-1``)."""
    rows = _flat(pool)[slots.clamp(min=0).long()]
    return unpack_ref(rows).masked_fill((slots < 0).unsqueeze(-1), 0.0)


# --- Triton ------------------------------------------------------------------------------------------

@triton.jit
def pack_row(x, row_ptr, row16_ptr, HW_CAST: tl.constexpr, EXACT: tl.constexpr, NOPE: tl.constexpr = NOPE_DIM,
             SOFF: tl.constexpr = SCALE_OFFSET):
    """Store one token's fp32 ``x[512]`` as its bytes at ``row_ptr`` (``row16_ptr``: the same row as int16);
    offsets come from the layout constants above."""
    t2 = tl.reshape(x, [8, 64])  # tiles 0..6 nope, tile 7 rope
    tile = tl.arange(0, 8)
    amax = tl.maximum(tl.max(tl.abs(t2), axis=1), 1e-4)
    s = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    b = s.to(tl.int32, bitcast=True)
    ebyte = ((b >> 23) & 0xFF) + tl.where((b & 0x7FFFFF) != 0, 1, 0)  # biased exponent of the scale
    inv = ((254 - ebyte) << 23).to(tl.float32, bitcast=True)  # 2^-(e) exactly
    y = t2 * inv[:, None]
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    if HW_CAST:
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        code = e4m3_bits(y).to(tl.uint8)
    c = tl.arange(0, 64)
    nt = NOPE // 64
    tl.store(row_ptr + tile[:, None] * 64 + c[None, :], code, mask=(tile < nt)[:, None])
    # tile 7's bits picked out by an integer sum (a float sum would turn -0.0 into +0.0)
    rope = tl.sum(tl.where((tile == nt)[:, None], t2.to(tl.int32, bitcast=True), 0), axis=0).to(tl.float32,
                                                                                               bitcast=True)
    r16 = cast_rne(rope, tl.bfloat16, EXACT).to(tl.int16, bitcast=True)
    tl.store(row16_ptr + NOPE // 2 + c, r16)
    tl.store(row_ptr + SOFF + tile, tl.where(tile < nt, ebyte, 0).to(tl.uint8))


@triton.jit
def _ue8m0(e):
    """UE8M0 bytes ``e`` (int32, 0..255) → fp32 ``2^(e-127)`` from bits; byte 0 is the subnormal 2^-127."""
    return tl.where(e == 0, 1 << 22, e << 23).to(tl.float32, bitcast=True)


@triton.jit
def unpack_row(row_ptr, row16_ptr, HW_CAST: tl.constexpr, NOPE: tl.constexpr = NOPE_DIM,
               SOFF: tl.constexpr = SCALE_OFFSET):
    """One token's bytes → fp32 ``[512]``."""
    c = tl.arange(0, 512)
    is_nope = c < NOPE
    byte = tl.load(row_ptr + c, mask=is_nope, other=0)
    if HW_CAST:
        v = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        v = e4m3_to_f32(byte)
    e = tl.load(row_ptr + SOFF + c // 64, mask=is_nope, other=127).to(tl.int32) & 0xFF
    nope = v * _ue8m0(e)
    r16 = tl.load(row16_ptr + NOPE // 2 + (c - NOPE), mask=c >= NOPE, other=0)
    rope = (r16.to(tl.int32) << 16).to(tl.float32, bitcast=True)  # bf16 widened by its bits (subnormals too)
    return tl.where(is_nope, nope, rope)


@triton.jit
def _store_kernel(kv_ptr, slot_ptr, pool_ptr, pool16_ptr, stride_kv, HW_CAST: tl.constexpr, EXACT: tl.constexpr,
                  ROW: tl.constexpr = TOKEN_BYTES):
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    if slot >= 0:
        x = tl.load(kv_ptr + i * stride_kv + tl.arange(0, 512)).to(tl.float32)
        pack_row(x, pool_ptr + slot * ROW, pool16_ptr + slot * (ROW // 2), HW_CAST, EXACT)


@triton.jit
def pack_words(nope, rope, HW_CAST: tl.constexpr, EXACT: tl.constexpr, NT: tl.constexpr = N_TILES):
    """Rows as little-endian int64 words: ``nope[R, 8, 8, 8]`` fp32 (tile, word, byte; tile 7 is ignored)
    and ``rope[R, 16, 4]`` fp32 → ``(q[R, 8, 8], r[R, 16], s[R])``: the e4m3 words of tiles 0..6 (tile 7's
    are garbage, don't store them), the bf16 rope words, and the word of the 7 scale bytes plus the pad."""
    tile = tl.arange(0, 8)
    amax = tl.maximum(tl.max(tl.max(tl.abs(nope), axis=3), axis=2), 1e-4)  # [R, 8]
    s = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    b = s.to(tl.int32, bitcast=True)
    ebyte = ((b >> 23) & 0xFF) + tl.where((b & 0x7FFFFF) != 0, 1, 0)  # biased exponent of the scale
    inv = ((254 - ebyte) << 23).to(tl.float32, bitcast=True)  # 2^-(e) exactly
    y = nope * inv[:, :, None, None]
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    if HW_CAST:
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int64)
    else:
        code = e4m3_bits(y).to(tl.int64)
    sh8 = (tl.arange(0, 8) * 8).to(tl.int64)
    q = tl.sum(code << sh8[None, None, None, :], axis=3)  # [R, 8, 8]
    r16 = cast_rne(rope, tl.bfloat16, EXACT).to(tl.int16, bitcast=True).to(tl.int64) & 0xFFFF
    sh16 = (tl.arange(0, 4) * 16).to(tl.int64)
    r = tl.sum(r16 << sh16[None, None, :], axis=2)  # [R, 16]
    e64 = tl.where(tile[None, :] < NT, ebyte, 0).to(tl.int64)
    sw = tl.sum(e64 << sh8[None, :], axis=1)  # [R]
    return q, r, sw


@triton.jit
def store_words(pool64_ptr, slot, ok, q, r, sw, EVICT: tl.constexpr, WORDS: tl.constexpr = TOKEN_BYTES // 8,
                NT: tl.constexpr = N_TILES):
    """Write :func:`pack_words`' output for rows whose ``ok[R]`` holds, at int64 ``slot[R]`` of the pool.
    ``EVICT``: the L2 eviction hint of the stores ("" for none; pass it from the kernel's constexpr)."""
    tile = tl.arange(0, 8)
    w8 = tl.arange(0, 8)
    w16 = tl.arange(0, 16)
    base = slot * WORDS  # [R] int64
    qoff = base[:, None, None] + tile[None, :, None] * 8 + w8[None, None, :]
    tl.store(pool64_ptr + qoff, q, mask=ok[:, None, None] & (tile < NT)[None, :, None], eviction_policy=EVICT)
    tl.store(pool64_ptr + base[:, None] + NT * 8 + w16[None, :], r, mask=ok[:, None], eviction_policy=EVICT)
    tl.store(pool64_ptr + base + NT * 8 + 16, sw, mask=ok, eviction_policy=EVICT)


@triton.jit
def scale_byte(amax):
    """The UE8M0 byte of the scale for tile amax ``amax`` (fp32, normal, the floor applied): the exponent of the
    power of two at or above ``RN(amax / 448)``, from the bits of ``amax`` alone. That power of two ``P`` is the
    smallest with ``448 · P >= amax`` (no fp32 lies between ``448 · P`` and the next value that rounds to ``P``),
    and ``448 = 1.75 · 2^8``: so ``biased exponent - 8``, plus one where the mantissa is above 1.75's."""
    b = amax.to(tl.int32, bitcast=True)
    return ((b >> 23) & 0xFF) - 8 + tl.where((b & 0x7FFFFF) > 0x600000, 1, 0)


@triton.jit
def _quarters(y):
    """``y[M, 4K]`` → its 4 columns of every group of 4 adjacent channels, ``[M, K]`` each (in-thread splits)."""
    a, b = tl.split(tl.reshape(y, [y.shape[0], y.shape[1] // 4, 2, 2]))  # a: channels 4k, 4k+2; b: 4k+1, 4k+3
    c0, c2 = tl.split(a)
    c1, c3 = tl.split(b)
    return c0, c1, c2, c3


@triton.jit
def e4m3_words(y, ASM: tl.constexpr):
    """``y[M, 4K]`` fp32 (``|y| <= 448`` or saturated) → ``[M, K]`` int32: the e4m3 bytes of each 4 adjacent
    channels, little-endian. ``ASM`` (sm89+): two ``cvt.rn.satfinite.e4m3x2.f32`` and a move per word; else the
    byte arithmetic (exact for the interpreter and older parts)."""
    if ASM:
        c0, c1, c2, c3 = _quarters(y)
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
            "mov.b32 $0, {lo, hi}; }", "=r,f,f,f,f", [c0, c1, c2, c3], dtype=tl.int32, is_pure=True, pack=1)
    else:
        code = e4m3_bits(tl.minimum(tl.maximum(y, -448.0), 448.0))
        sh = (tl.arange(0, 4) * 8)[None, None, :]
        return tl.sum(tl.reshape(code, [y.shape[0], y.shape[1] // 4, 4]) << sh, axis=2)


@triton.jit
def bf16_words(y, ASM: tl.constexpr, EXACT: tl.constexpr):
    """``y[M, 4K]`` fp32 → ``[M, K]`` int64: the bf16 (round to nearest even) of each 4 adjacent channels,
    little-endian. ``ASM`` (sm80+): two ``cvt.rn.bf16x2.f32`` and a move per word."""
    if ASM:
        c0, c1, c2, c3 = _quarters(y)
        return tl.inline_asm_elementwise(
            "{ .reg .b32 lo, hi; cvt.rn.bf16x2.f32 lo, $2, $1; cvt.rn.bf16x2.f32 hi, $4, $3; mov.b64 $0, {lo, hi}; }",
            "=l,f,f,f,f", [c0, c1, c2, c3], dtype=tl.int64, is_pure=True, pack=1)
    else:
        r16 = cast_rne(y, tl.bfloat16, EXACT).to(tl.int16, bitcast=True).to(tl.int64) & 0xFFFF
        sh = (tl.arange(0, 4) * 16).to(tl.int64)[None, None, :]
        return tl.sum(tl.reshape(r16, [y.shape[0], y.shape[1] // 4, 4]) << sh, axis=2)


@triton.jit
def store_tiles(y, slot, pool8_ptr, pool32_ptr, pool64_ptr, HW_CAST: tl.constexpr, EXACT: tl.constexpr,
                EVICT: tl.constexpr, NT: tl.constexpr = N_TILES, ROW: tl.constexpr = TOKEN_BYTES,
                SOFF: tl.constexpr = SCALE_OFFSET):
    """Pack one token ``y[tile 8, 64]`` fp32 (tile 7: the rope channels) and store it at int64 ``slot[1]``
    (``-1``: skip), in a layout where a thread owns 4 adjacent channels: its e4m3 bytes become an int32 word and
    its bf16 rope values an int64 word without leaving the thread (``HW_CAST``: by the paired hardware
    converts); only the tile amax is a reduction. The 7 scale bytes and the zero pad go as bytes."""
    tile = tl.arange(0, 8)
    ebyte = scale_byte(tl.maximum(tl.max(tl.abs(y), axis=1), 1e-4))  # [8]
    inv = ((254 - ebyte) << 23).to(tl.float32, bitcast=True)  # 2^-(e) exactly
    qw = e4m3_words(y * inv[:, None], HW_CAST)  # [8, 16]
    rw = bf16_words(y, HW_CAST, EXACT)  # [8, 16]
    ok = slot >= 0
    w32 = slot * (ROW // 4)
    q16 = tl.arange(0, 16)
    tl.store(pool32_ptr + w32[:, None] + tile[:, None] * 16 + q16[None, :], qw,
             mask=ok[:, None] & (tile < NT)[:, None], eviction_policy=EVICT)
    tl.store(pool64_ptr + (w32 // 2)[:, None] + NT * 8 + (tile[:, None] * 0 + q16[None, :]), rw,
             mask=ok[:, None] & (tile == NT)[:, None], eviction_policy=EVICT)
    tl.store(pool8_ptr + slot * ROW + SOFF + tile, tl.where(tile < NT, ebyte, 0).to(tl.uint8), mask=ok & (tile >= 0),
             eviction_policy=EVICT)


@triton.jit
def _store_block(kv_ptr, slot_ptr, pool64_ptr, n, stride_kv, blk, ROWS: tl.constexpr, HW_CAST: tl.constexpr,
                 EXACT: tl.constexpr, EVICT: tl.constexpr, NT: tl.constexpr = N_TILES, NOPE: tl.constexpr = NOPE_DIM):
    """Tokens ``blk * ROWS ..`` packed and written as 73 int64 words each (584 = 8 · 73)."""
    rid = blk * ROWS + tl.arange(0, ROWS)
    live = rid < n
    slot = tl.load(slot_ptr + rid, mask=live, other=-1).to(tl.int64)
    tile = tl.arange(0, 8)
    w = tl.arange(0, 8)
    k = tl.arange(0, 8)
    col = tile[:, None, None] * 64 + w[None, :, None] * 8 + k[None, None, :]  # [8, 8, 8]
    row = kv_ptr + rid * stride_kv  # the loads do not wait on the slots
    m4 = live[:, None, None, None] & (tile < NT)[None, :, None, None]
    nope = tl.load(row[:, None, None, None] + col[None], mask=m4, other=0.0, eviction_policy=EVICT).to(tl.float32)
    j = tl.arange(0, 16)
    e = tl.arange(0, 4)
    rcol = NOPE + j[:, None] * 4 + e[None, :]
    rope = tl.load(row[:, None, None] + rcol[None], mask=live[:, None, None], other=0.0,
                   eviction_policy=EVICT).to(tl.float32)
    q, r, sw = pack_words(nope, rope, HW_CAST, EXACT)
    store_words(pool64_ptr, slot, slot >= 0, q, r, sw, EVICT)


@triton.jit
def _store_rows_kernel(kv_ptr, slot_ptr, pool64_ptr, n, stride_kv, ROWS: tl.constexpr, HW_CAST: tl.constexpr,
                       EXACT: tl.constexpr, EVICT: tl.constexpr = "", STAGES: tl.constexpr = 0):
    """``ROWS`` tokens per program; ``STAGES`` > 0: persistent programs stride over the blocks with their loads
    software-pipelined ``STAGES`` deep."""
    if STAGES == 0:
        _store_block(kv_ptr, slot_ptr, pool64_ptr, n, stride_kv, tl.program_id(0).to(tl.int64), ROWS, HW_CAST,
                     EXACT, EVICT)
    else:
        for b in tl.range(tl.program_id(0), tl.cdiv(n, ROWS), tl.num_programs(0), num_stages=STAGES):
            _store_block(kv_ptr, slot_ptr, pool64_ptr, n, stride_kv, (tl.program_id(0) * 0 + b).to(tl.int64), ROWS,
                         HW_CAST, EXACT, EVICT)


@triton.jit
def _store_tiles_kernel(kv_ptr, kv32_ptr, slot_ptr, pool8_ptr, pool32_ptr, n, stride_kv, ROWS: tl.constexpr,
                        HW_CAST: tl.constexpr, EXACT: tl.constexpr, BF16: tl.constexpr, EVICT: tl.constexpr = "",
                        NT: tl.constexpr = N_TILES, ROW: tl.constexpr = TOKEN_BYTES, SOFF: tl.constexpr = SCALE_OFFSET):
    """``ROWS`` tokens per program, all 512 channels as ``[ROWS · 8 (token, tile), 64]`` (tile 7's e4m3 bytes are
    computed and dropped: cheaper than a second layout), so a thread owns adjacent channels of one tile (8 for
    bf16 input: one 16-byte load) and packs its e4m3 bytes into int32 words itself (``HW_CAST``: by the paired
    hardware converts, which saturate: ``|y / scale| <= 448`` holds anyway for the power-of-two scale at or
    above amax / 448); only the tile amax is a reduction, over the tile's few threads. The rope channels come
    from a second, small load as int32 words: for bf16 input (``BF16``) their bits unchanged, else rounded to
    bf16. Each (token, tile) writes its scale byte (tile 7: the zero pad)."""
    pid = tl.program_id(0).to(tl.int64)
    rt = tl.arange(0, ROWS * 8)
    tile = rt % 8
    rid = pid * ROWS + rt // 8
    live = rid < n
    if BF16:  # pairs of bf16 as int32 words, widened by a shift and a mask
        w = tl.load(kv32_ptr + (rid * (stride_kv // 2) + tile * 32)[:, None] + tl.arange(0, 32)[None, :],
                    mask=live[:, None], other=0, eviction_policy=EVICT)
        y = tl.reshape(tl.join((w << 16).to(tl.float32, bitcast=True),
                               (w & -65536).to(tl.float32, bitcast=True)), [ROWS * 8, 64])
    else:
        ch = tl.arange(0, 64)
        y = tl.load(kv_ptr + (rid * stride_kv + tile * 64)[:, None] + ch[None, :], mask=live[:, None], other=0.0,
                    eviction_policy=EVICT).to(tl.float32)
    r = pid * ROWS + tl.arange(0, ROWS)
    rl = r < n
    j = tl.arange(0, 32)
    if BF16:
        rw = tl.load(kv32_ptr + (r * (stride_kv // 2) + (NT * 32))[:, None] + j[None, :], mask=rl[:, None], other=0,
                     eviction_policy=EVICT)
    else:
        two = tl.arange(0, 2)
        v = tl.load(kv_ptr + (r * stride_kv + NT * 64)[:, None, None] + (j * 2)[None, :, None] + two[None, None, :],
                    mask=rl[:, None, None], other=0.0, eviction_policy=EVICT).to(tl.float32)
        b16 = cast_rne(v, tl.bfloat16, EXACT).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        rw = tl.sum(b16 << (two * 16)[None, None, :], axis=2)  # [R, 32]: two bf16, little-endian
    slot = tl.load(slot_ptr + rid, mask=live, other=-1)  # [R·8]: each tile's own copy of its token's slot
    s1 = tl.load(slot_ptr + r, mask=rl, other=-1)
    ebyte = scale_byte(tl.maximum(tl.max(tl.abs(y), axis=1), 1e-4))  # [R·8]
    inv = ((254 - ebyte) << 23).to(tl.float32, bitcast=True)  # 2^-(e) exactly
    qw = e4m3_words(y * inv[:, None], HW_CAST)  # [R·8, 16]
    ok = slot >= 0
    tl.store(pool32_ptr + (slot * (ROW // 4) + tile * 16)[:, None] + tl.arange(0, 16)[None, :], qw,
             mask=(ok & (tile < NT))[:, None], eviction_policy=EVICT)
    tl.store(pool32_ptr + (s1 * (ROW // 4) + NT * 16)[:, None] + j[None, :], rw, mask=(s1 >= 0)[:, None],
             eviction_policy=EVICT)
    tl.store(pool8_ptr + slot * ROW + SOFF + tile, tl.where(tile < NT, ebyte, 0).to(tl.uint8), mask=ok,
             eviction_policy=EVICT)


@triton.jit
def _load_kernel(pool_ptr, pool16_ptr, slot_ptr, o_ptr, HW_CAST: tl.constexpr, ROW: tl.constexpr = TOKEN_BYTES):
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    c = tl.arange(0, 512)
    sl = tl.maximum(slot, 0)
    x = unpack_row(pool_ptr + sl * ROW, pool16_ptr + sl * (ROW // 2), HW_CAST)
    tl.store(o_ptr + i * 512 + c, tl.where(slot >= 0, x, 0.0))


@triton.jit
def _load_rows_kernel(pool64_ptr, slot_ptr, o_ptr, n, ROWS: tl.constexpr, HW_CAST: tl.constexpr,
                      NT: tl.constexpr = N_TILES, NOPE: tl.constexpr = NOPE_DIM, WORDS: tl.constexpr = TOKEN_BYTES // 8):
    """``ROWS`` slots per program, each row read as 73 int64 words and unpacked to fp32."""
    rid = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = rid < n
    slot = tl.load(slot_ptr + rid, mask=live, other=-1).to(tl.int64)
    ok = slot >= 0
    base = tl.maximum(slot, 0) * WORDS
    tile = tl.arange(0, 8)
    w = tl.arange(0, 8)
    k = tl.arange(0, 8)
    qw = tl.load(pool64_ptr + base[:, None, None] + tile[None, :, None] * 8 + w[None, None, :],
                 mask=ok[:, None, None] & (tile < NT)[None, :, None], other=0)  # [R, 8, 8]
    sw = tl.load(pool64_ptr + base + NT * 8 + 16, mask=ok, other=0)  # [R]
    byte = ((qw[:, :, :, None] >> (k * 8).to(tl.int64)[None, None, None, :]) & 0xFF).to(tl.uint8)
    if HW_CAST:
        v = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        v = e4m3_to_f32(byte)
    e = ((sw[:, None] >> (tile * 8).to(tl.int64)[None, :]) & 0xFF).to(tl.int32)  # [R, 8]
    nope = v * _ue8m0(e)[:, :, None, None]
    col = tile[:, None, None] * 64 + w[None, :, None] * 8 + k[None, None, :]
    orow = o_ptr + rid * 512
    tl.store(orow[:, None, None, None] + col[None], tl.where(ok[:, None, None, None], nope, 0.0),
             mask=live[:, None, None, None] & (tile < NT)[None, :, None, None])
    j = tl.arange(0, 16)
    h = tl.arange(0, 4)
    rw = tl.load(pool64_ptr + base[:, None] + NT * 8 + j[None, :], mask=ok[:, None], other=0)  # [R, 16]
    r32 = (((rw[:, :, None] >> (h * 16).to(tl.int64)[None, None, :]) & 0xFFFF) << 16).to(tl.int32)
    rope = r32.to(tl.float32, bitcast=True)  # bf16 widened by its bits (subnormals too)
    tl.store(orow[:, None, None] + NOPE + j[None, :, None] * 4 + h[None, None, :], rope, mask=live[:, None, None])


STORE_IMPL = "tiles"  # the default kernel of kv584_store
# H200 (round 1 of 2026-12-01 d, ceiling 4228 GB/s), 65536 / 262144 tokens: tiles, 4 tokens x 2 warps, 78.0 / 94.8 % of
# copy (95.3 / 99.6 % of a same-size copy; 8 x 2: 77.0 / 93.8 %, 16 x 4: 73.8 / 92.6 %); words 73.4 / 89.1 %. Rounds
# 2-3: 2 tokens x 2 warps 78.4 / 94.9 % and 79.6 / 95.1 % (4 x 2 in the same runs: 77.6 / 93.8 %, 76.8 / 95.2 %)
TILES_ROWS = 2  # the tiles kernel: tokens per program, warps
TILES_WARPS = 2
STORE_ROWS = 4  # tokens per program of the word-store kernel (4 rows x 2 warps: best of 4..32 x 2..8 on the H200)
STORE_WARPS = 2


def _words(flat: torch.Tensor) -> torch.Tensor | None:
    """``flat`` as int64 words ``[N, 73]``, or None where its storage is not 8-byte aligned."""
    if flat.storage_offset() % 8 or flat.data_ptr() % 8 or flat.stride(0) != TOKEN_BYTES:
        return None
    return flat.view(torch.int64)


def kv584_store(kv: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, *, impl: str | None = None,
                rows: int | None = None, num_warps: int | None = None, evict: str = "", stages: int = 0,
                programs: int | None = None) -> torch.Tensor:
    """Triton :func:`kv584_store_ref`. ``impl="tiles"``: ``rows`` tokens per program, each thread packing the
    e4m3 bytes of its own adjacent channels; ``"words"``: ``rows`` tokens per program written as int64 words
    (``stages`` > 0: ``programs`` persistent programs, default 4 per SM, with loads pipelined that deep);
    ``"row"``: one program per token with byte stores (also the path for a pool whose storage is not 8-byte
    aligned). ``None``: :data:`STORE_IMPL`. ``evict``: the L2 eviction hint of the tiles and word kernels ("" or
    "evict_first", for a pool written once and read much later)."""
    flat = _flat(pool)
    if kv.dim() != 2 or kv.shape[1] != HEAD_DIM or kv.stride(1) != 1 or slots.shape != (kv.shape[0],):
        raise ValueError(f"kv584: kv must be [N, {HEAD_DIM}] (unit stride) with slots [N], got "
                         f"{tuple(kv.shape)} and {tuple(slots.shape)}")
    impl = impl or STORE_IMPL
    if impl not in ("tiles", "words", "row"):
        raise ValueError(f"kv584_store: impl must be 'tiles', 'words' or 'row', got {impl!r}")
    hw = fp8_hw_cast(capability(kv.device))
    n = kv.shape[0]
    if not n:
        return pool
    sl = slots.to(torch.int64).contiguous()
    words = _words(flat) if impl != "row" else None
    if words is not None and impl == "tiles":
        r = rows or TILES_ROWS
        bf16 = kv.dtype == torch.bfloat16 and kv.stride(0) % 2 == 0 and kv.data_ptr() % 4 == 0
        kv32 = kv.view(torch.int32) if bf16 else kv  # bf16 pairs as int32 words
        _store_tiles_kernel[(triton.cdiv(n, r),)](kv, kv32, sl, flat, flat.view(torch.int32), n, kv.stride(0), ROWS=r,
                                                  HW_CAST=hw, EXACT=interpreting(), BF16=bf16, EVICT=evict,
                                                  num_warps=num_warps or TILES_WARPS)
    elif words is None:
        _store_kernel[(n,)](kv, sl, flat, flat.view(torch.int16), kv.stride(0), HW_CAST=hw, EXACT=interpreting(),
                            num_warps=num_warps or 2)
    else:
        r = rows or STORE_ROWS
        grid = triton.cdiv(n, r)
        if stages:
            sms = torch.cuda.get_device_properties(kv.device).multi_processor_count if kv.is_cuda else 1
            grid = min(grid, programs or 4 * sms)
        _store_rows_kernel[(grid,)](kv, sl, words, n, kv.stride(0), ROWS=r, HW_CAST=hw, EXACT=interpreting(),
                                    EVICT=evict, STAGES=stages, num_warps=num_warps or STORE_WARPS)
    return pool


LOAD_IMPL = "row"  # the default kernel of kv584_load
LOAD_ROWS = 8
LOAD_WARPS = 4


def kv584_load(pool: torch.Tensor, slots: torch.Tensor, *, out: torch.Tensor | None = None, impl: str | None = None,
               rows: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """Triton :func:`kv584_load_ref`. ``impl``: ``"row"``, one program per slot; ``"words"``, ``rows`` slots per
    program read as int64 words; ``None``: :data:`LOAD_IMPL`. A non-contiguous ``out`` is filled through a
    contiguous buffer (the kernels write rows of 512)."""
    flat = _flat(pool)
    if out is not None and not out.is_contiguous():
        out.copy_(kv584_load(pool, slots, impl=impl, rows=rows, num_warps=num_warps))
        return out
    o = out if out is not None else torch.empty(slots.shape[0], HEAD_DIM, dtype=torch.float32, device=pool.device)
    impl = impl or LOAD_IMPL
    if impl not in ("words", "row"):
        raise ValueError(f"kv584_load: impl must be 'words' or 'row', got {impl!r}")
    hw = fp8_hw_cast(capability(pool.device))
    n = slots.shape[0]
    if not n:
        return o
    sl = slots.to(torch.int64).contiguous()
    words = _words(flat) if impl == "words" else None
    if words is None:
        _load_kernel[(n,)](flat, flat.view(torch.int16), sl, o, HW_CAST=hw, num_warps=num_warps or 2)
    else:
        r = rows or LOAD_ROWS
        _load_rows_kernel[(triton.cdiv(n, r),)](words, sl, o, n, ROWS=r, HW_CAST=hw,
                                                num_warps=num_warps or LOAD_WARPS)
    return o


# --- parity ------------------------------------------------------------------------------------------

def _rows(n: int, gen: torch.Generator, device, dtype) -> torch.Tensor:
    """Rows spanning magnitudes tile by tile, with exact binade edges and e4m3 ties planted in tile 0."""
    x = torch.randn(n, HEAD_DIM, generator=gen, device=device)
    mag = torch.exp2(torch.randint(-12, 8, (n, N_TILES + 1), generator=gen, device=device).float())
    x = (x.view(n, N_TILES + 1, TILE) * mag.unsqueeze(-1)).view(n, HEAD_DIM)
    if n >= 2:
        x[0, :8] = torch.tensor([448.0, -448.0, 124.9, 240.0, 256.0, 0.0, -0.0, 17.0], device=device)
        x[1, :4] = torch.tensor([1.0, 1.0625, 1.1875, -2.0 ** -9], device=device)  # ties to even, a subnormal
        x[1, 4:64] = 0.0  # a tile of zeros takes the amax floor
    return x.to(dtype)


def _store_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    n, pages, page = case.params["shape"]
    perm = torch.randperm(pages * page, generator=gen, device=device)[:n]
    slots = perm.clone()
    if n > 3:
        slots[3] = -1
    pool = new_pool(pages, page, device)
    pool.view(-1)[:] = torch.randint(0, 256, (pool.numel(),), generator=gen, device=device).to(torch.uint8)
    return {"kv": _rows(n, gen, device, case.dtype), "pool": pool, "slots": slots}


def _store_ref(kv, pool, slots):
    return kv584_store_ref(kv, pool.clone(), slots)


def _store_run(out, kv, pool, slots):
    out[0].copy_(pool)
    kv584_store(kv, out[0], slots)


def _load_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    inp = _store_inputs(case, device, gen)
    kv584_store_ref(**inp)
    return {"pool": inp["pool"], "slots": inp["slots"]}


def _load_run(out, pool, slots):
    kv584_load(pool, slots, out=out[0])


_CASES = [
    Case("5 rows fp32", {"shape": (5, 2, 4)}, dtype=torch.float32),
    Case("9 rows bf16", {"shape": (9, 3, 4)}),
    Case("64 rows fp32 page16", {"shape": (64, 8, 16)}, dtype=torch.float32),
    Case("flash 8192 rows", {"shape": (8192, 256, 64)}, devices=("cuda",)),
    Case("flash 65536 rows fp32", {"shape": (65536, 1100, 64)}, dtype=torch.float32, devices=("cuda",)),
]

SPEC_STORE = ParitySpec(
    op="kv584_store", make_inputs=_store_inputs, reference=_store_ref, kernel=_store_run, cases=_CASES,
    checks=[Check("bit_exact", 0, "power-of-two scales make x/s exact; e4m3 and bf16 round to nearest even",
                  name="pool")],
    description="pack rows into the 584-byte paged FP8 pool (448 e4m3 + 64 bf16 rope + 7 UE8M0 + pad)",
)
SPEC_LOAD = ParitySpec(
    op="kv584_load", make_inputs=_load_inputs, reference=kv584_load_ref, kernel=_load_run, cases=_CASES,
    checks=[Check("bit_exact", 0, "e4m3 times a power of two and widened bf16 are exact in fp32")],
    description="unpack slots of the 584-byte pool to fp32 rows",
)
SPEC = SPEC_STORE
