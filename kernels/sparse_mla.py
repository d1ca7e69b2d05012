"""Attention with a learnable sink over V4's shared key/value head, dense-masked (the engine's oracle) and
sparse over the 584-byte paged FP8 pool (decode).

The sink is one logit per head that joins the softmax's denominator and contributes no value, so a head
can attend to "nothing". Keys are also values (MQA with one 512-wide head).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

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
# feeds it to all BLOCK_H heads' tensor-core dots (64 heads: the wgmma M). A row's 512 channels are kept as
# four power-of-two parts that match the 584-byte row: nope tiles 0-3 (256 fp8 bytes), 4-5 (128), 6 (64)
# and the rope (64 bf16), so every load is a full-width vector with no column mask, and the scale of each
# 64-channel tile comes from one 8-byte word per row. The next tile's bytes are loaded before this tile's
# dots (PREFETCH), so the gather of tile i+1 overlaps the math of tile i.

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
    return SparseConfig(bh, bt, max(1, min(num_sms // progs, triton.cdiv(k, 2 * bt))), 8, 2, False)


@triton.jit
def _gather(pool_ptr, pool16_ptr, pool64_ptr, idx_ptr, row, K, t0, hi, BLOCK_T: tl.constexpr, ROW: tl.constexpr,
            WIDE: tl.constexpr):
    """The raw bytes of the slots ``t0 .. t0+BLOCK_T`` (below ``hi``) of ``row``: nope tiles 0-3, 4-5 and 6
    (uint8), the rope (int16), each row's scale word (int64, byte j = tile j) and which slots are valid.
    Byte offsets are int32 unless the pool is 2 GiB or more (``WIDE``): half the registers for the next
    tile's addresses, which the pipelined loop keeps live."""
    t = t0 + tl.arange(0, BLOCK_T)
    slot = tl.load(idx_ptr + row * K + t, mask=t < hi, other=-1)
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
                          qk_scale, p_scr, m_scr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, HW_CAST: tl.constexpr,
                          DT: tl.constexpr, PREC: tl.constexpr, LOW: tl.constexpr, QCAST: tl.constexpr,
                          EXACT: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr, LAZY: tl.constexpr,
                          ROW: tl.constexpr, WIDE: tl.constexpr, XCHG: tl.constexpr):
    """Online softmax (log2 domain) over this program's chunk of slots. Unsplit, it starts from the sink
    and writes the output; split, it writes its normalised partial and log-sum-exp for :func:`_combine`
    (the sink joins there, once)."""
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
        p_at = p_scr + pid * BLOCK_H * BLOCK_T + hh[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
        m_at = m_scr + pid * BLOCK_H + hh
        m_acc = m
    lo = (sp * nt // tl.num_programs(1)) * BLOCK_T
    hi = tl.minimum(((sp + 1) * nt // tl.num_programs(1)) * BLOCK_T, K)
    if PREFETCH:
        n0, n1, n2, r, w, ok = _gather(pool_ptr, pool16_ptr, pool64_ptr, idx_ptr, row, K, lo, hi, BLOCK_T, ROW, WIDE)
    for t0 in range(lo, hi, BLOCK_T):
        if PREFETCH:  # the next tile's loads go out before this tile's math (past hi: all masked, no traffic)
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
            m_use = tl.where(m_new - m > 8.0, m_new, m)  # per-row lazy rescale: p stays ≤ 256
            p = tl.exp2(s - m_use[:, None])
            lsum = lsum * tl.exp2(m - m_use) + tl.sum(p, axis=1)
            m = m_use
            if LOW:
                p = cast_rne(p, tl.bfloat16, EXACT)
            tl.debug_barrier()  # every warp has read the previous tile's p (the loop's pipelining stops here)
            tl.store(p_at, p.to(p_scr.dtype.element_ty))
            tl.store(m_at, m_use)
            tl.debug_barrier()
            m_ld = tl.load(m_at, cache_modifier=".cg")
            p = tl.load(p_at, cache_modifier=".cg")
            if tl.max(m_ld - m_acc, axis=0) > 0.0:
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


@triton.jit
def _combine_kernel(part_ptr, lse_ptr, sink_ptr, o_ptr, H, n_split, BLOCK_H: tl.constexpr, EXACT: tl.constexpr):
    """Merge a row's normalised partials by their log-sum-exps, with the sink (log2 domain); one program
    per (row, head block)."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < H
    c = tl.arange(0, 512)
    sink = tl.load(sink_ptr + h, mask=hm, other=0.0).to(tl.float32) * 1.4426950408889634
    mx = sink
    for sp in range(0, n_split):
        mx = tl.maximum(mx, tl.load(lse_ptr + (row * n_split + sp) * H + h, mask=hm, other=-1e30))
    total = tl.exp2(sink - mx)
    acc = tl.zeros([BLOCK_H, 512], dtype=tl.float32)
    for sp in range(0, n_split):
        base = (row * n_split + sp) * H + h
        wt = tl.exp2(tl.load(lse_ptr + base, mask=hm, other=-1e30) - mx)
        total += wt
        acc += wt[:, None] * tl.load(part_ptr + base[:, None] * 512 + c[None, :], mask=hm[:, None],
                                     other=0.0).to(tl.float32)
    out = acc / total[:, None]
    tl.store(o_ptr + (row * H + h[:, None]) * 512 + c[None, :], cast_rne(out, o_ptr.dtype.element_ty, EXACT),
             mask=hm[:, None])


def sparse_mla_decode(q: torch.Tensor, pool: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor, scale: float,
                      *, out: torch.Tensor | None = None, config: SparseConfig | None = None) -> torch.Tensor:
    """Triton :func:`sparse_mla_decode_ref`: bf16 tensor-core dots over exactly dequantised keys (fp32 dots
    for an fp32 q); ``config`` overrides :func:`sparse_config`."""
    from kernels.kv584 import HEAD_DIM, TOKEN_BYTES, _flat

    b, h, d = q.shape
    if d != HEAD_DIM:
        raise ValueError(f"sparse_mla_decode: q must be [B, H, {HEAD_DIM}], got {tuple(q.shape)}")
    if indices.dim() != 2 or indices.shape[0] != b:
        raise ValueError(f"sparse_mla_decode: indices must be [{b}, K], got {tuple(indices.shape)}")
    flat = _flat(pool)
    o = out if out is not None else torch.empty_like(q)
    cap = capability(q.device)
    k = indices.shape[1]
    low = q.dtype != torch.float32
    if b == 0:
        return o
    if k == 0:
        return o.zero_()
    cfg = config or sparse_config(b, h, k, cap, low, _num_sms(q.device) if cap else 132)
    bt = cfg.block_t
    n_split = max(1, min(cfg.n_split, triton.cdiv(k, bt)))
    hb = triton.cdiv(h, cfg.block_h)
    qc, idx, sk = q.contiguous(), indices.to(torch.int32).contiguous(), sinks.float().contiguous()
    f32 = interpreting() or not low  # fp32 dots: an fp32 q, and the interpreter (its bf16 dot is wrong)
    args = dict(BLOCK_H=cfg.block_h, BLOCK_T=bt, HW_CAST=fp8_hw_cast(cap), DT=tl.float32 if f32 else tl.bfloat16,
                PREC="ieee" if f32 else "tf32", LOW=low, QCAST=low and (q.dtype != torch.bfloat16 or f32),
                EXACT=interpreting(), PREFETCH=cfg.prefetch, LAZY=cfg.lazy, ROW=TOKEN_BYTES, WIDE=flat.numel() >= 2**31,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages)
    pools = (flat, flat.view(torch.int16), flat.view(torch.int64))
    qk = float(scale) * LOG2E
    if cfg.xchg:
        progs = b * n_split * hb
        scr = (torch.empty(progs * cfg.block_h * bt, dtype=torch.bfloat16 if low else torch.float32, device=q.device),
               torch.empty(progs * cfg.block_h, dtype=torch.float32, device=q.device))
    else:
        scr = (sk, sk)
    args["XCHG"] = cfg.xchg
    if n_split == 1:
        _sparse_decode_kernel[(b, 1, hb)](qc, *pools, idx, sk, o, o, k, h, qk, *scr, SPLIT=False, **args)
        return o
    part = torch.empty(b, n_split, h, HEAD_DIM, dtype=torch.bfloat16 if cfg.part_bf16 else torch.float32,
                       device=q.device)
    lse = torch.empty(b, n_split, h, dtype=torch.float32, device=q.device)
    _sparse_decode_kernel[(b, n_split, hb)](qc, *pools, idx, sk, part, lse, k, h, qk, *scr, SPLIT=True, **args)
    _combine_kernel[(b, triton.cdiv(h, 8))](part, lse, sk, o, h, n_split, BLOCK_H=8, EXACT=interpreting(),
                                            num_warps=4 if cap else 1)
    return o


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
