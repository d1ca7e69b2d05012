"""Attention with a learnable sink over V4's shared key/value head, dense-masked (the engine's oracle) and
sparse over the 584-byte paged FP8 pool (decode).

The sink is one logit per head that joins the softmax's denominator and contributes no value, so a head
can attend to "nothing". Keys are also values (MQA with one 512-wide head).
"""

from __future__ import annotations

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

@triton.jit
def _sparse_decode_kernel(q_ptr, pool_ptr, pool16_ptr, idx_ptr, sink_ptr, o_ptr, ml_ptr, K, H, qk_scale, chunk,
                          BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, HW_CAST: tl.constexpr,
                          F32_DOT: tl.constexpr, ROW: tl.constexpr, NOPE: tl.constexpr, SOFF: tl.constexpr,
                          LOW: tl.constexpr, EXACT: tl.constexpr, SPLIT: tl.constexpr):
    """One program per (row, block of heads, split of the indices): gathers BLOCK_T slots at a time,
    dequantises them to bf16 (exact: e4m3 times a power of two, and bf16 rope) and runs an online softmax.
    Unsplit, it starts from the sink and writes the output; split, it writes its (acc, max, sum) for
    :func:`_combine` (the sink joins there, once)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    sp = tl.program_id(2)
    hm = h < H
    c = tl.arange(0, 512)
    q = tl.load(q_ptr + (b * H + h[:, None]) * 512 + c[None, :], mask=hm[:, None], other=0.0)
    if LOW:  # bf16 tensor-core dots; an fp32 q keeps fp32 dots (the engine's fp32 oracle runs)
        q = cast_rne(q.to(tl.float32), tl.bfloat16, EXACT)
    if F32_DOT:  # fp32 dots (also for the interpreter, whose bf16 dot is wrong in triton 3.9)
        q = q.to(tl.float32)
    if SPLIT:
        m = tl.full([BLOCK_H], -1e30, tl.float32)  # finite: an empty split stays NaN-free
        lsum = tl.zeros([BLOCK_H], dtype=tl.float32)
    else:
        m = tl.load(sink_ptr + h, mask=hm, other=0.0).to(tl.float32) * 1.4426950408889634
        lsum = tl.full([BLOCK_H], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_H, 512], dtype=tl.float32)
    is_nope = c < NOPE
    tile = tl.arange(0, 8)
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, K)
    for t0 in range(lo, hi, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        slot = tl.load(idx_ptr + b * K + t, mask=t < hi, other=-1).to(tl.int64)
        ok = slot >= 0
        sl = tl.maximum(slot, 0)
        byte = tl.load(pool_ptr + sl[:, None] * ROW + c[None, :], mask=ok[:, None] & is_nope[None, :], other=0)
        if HW_CAST:
            v = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            v = e4m3_to_f32(byte)
        # one scale byte per 64-channel tile, broadcast over the tile (the rope tile's 8th byte is padding)
        e = tl.load(pool_ptr + sl[:, None] * ROW + SOFF + tile[None, :], mask=ok[:, None] & (tile < NOPE // 64)[None, :],
                    other=127).to(tl.int32)
        sc = ((e & 0xFF) << 23).to(tl.float32, bitcast=True)
        nope = tl.reshape(tl.reshape(v, [BLOCK_T, 8, 64]) * sc[:, :, None], [BLOCK_T, 512])
        r16 = tl.load(pool16_ptr + sl[:, None] * (ROW // 2) + NOPE // 2 + (c[None, :] - NOPE),
                      mask=ok[:, None] & (c >= NOPE)[None, :], other=0)
        kv = tl.where(is_nope[None, :], nope, r16.to(tl.bfloat16, bitcast=True).to(tl.float32))
        if not F32_DOT:
            kv = kv.to(tl.bfloat16)  # exact: e4m3 times a power of two fits bf16
        if F32_DOT:
            s = tl.dot(q, tl.trans(kv), input_precision="ieee") * qk_scale  # log2 domain
        else:
            s = tl.dot(q, tl.trans(kv)) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, axis=1)
        pd = p
        if LOW:
            pd = cast_rne(p, tl.bfloat16, EXACT)
        if F32_DOT:
            pd = pd.to(tl.float32)
        if F32_DOT:
            acc = acc * alpha[:, None] + tl.dot(pd, kv, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(pd.to(tl.bfloat16), kv)
        m = m_new
    if SPLIT:
        n_split = tl.num_programs(2)
        base = (b * n_split + sp) * H + h
        tl.store(o_ptr + base[:, None] * 512 + c[None, :], acc, mask=hm[:, None])
        tl.store(ml_ptr + base * 2, m, mask=hm)
        tl.store(ml_ptr + base * 2 + 1, lsum, mask=hm)
    else:
        o = acc / lsum[:, None]
        tl.store(o_ptr + (b * H + h[:, None]) * 512 + c[None, :], o.to(o_ptr.dtype.element_ty), mask=hm[:, None])


@triton.jit
def _combine_kernel(part_ptr, ml_ptr, sink_ptr, o_ptr, H, n_split, BLOCK_H: tl.constexpr):
    """Merge the splits' partial softmaxes with the sink (log2 domain), one program per (row, head block)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < H
    c = tl.arange(0, 512)
    mx = tl.load(sink_ptr + h, mask=hm, other=0.0).to(tl.float32) * 1.4426950408889634
    for sp in range(0, n_split):
        mx = tl.maximum(mx, tl.load(ml_ptr + ((b * n_split + sp) * H + h) * 2, mask=hm, other=-1e30))
    total = tl.exp2(tl.load(sink_ptr + h, mask=hm, other=0.0).to(tl.float32) * 1.4426950408889634 - mx)
    acc = tl.zeros([BLOCK_H, 512], dtype=tl.float32)
    for sp in range(0, n_split):
        base = (b * n_split + sp) * H + h
        w = tl.exp2(tl.load(ml_ptr + base * 2, mask=hm, other=-1e30) - mx)
        total += w * tl.load(ml_ptr + base * 2 + 1, mask=hm, other=0.0)
        acc += w[:, None] * tl.load(part_ptr + base[:, None] * 512 + c[None, :], mask=hm[:, None], other=0.0)
    tl.store(o_ptr + (b * H + h[:, None]) * 512 + c[None, :], (acc / total[:, None]).to(o_ptr.dtype.element_ty),
             mask=hm[:, None])


def sparse_mla_decode(q: torch.Tensor, pool: torch.Tensor, indices: torch.Tensor, sinks: torch.Tensor, scale: float,
                      *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton :func:`sparse_mla_decode_ref`: bf16 tensor-core dots over exactly dequantised keys."""
    from kernels.kv584 import HEAD_DIM, NOPE_DIM, SCALE_OFFSET, TOKEN_BYTES, _flat

    b, h, d = q.shape
    if d != HEAD_DIM:
        raise ValueError(f"sparse_mla_decode: q must be [B, H, {HEAD_DIM}], got {tuple(q.shape)}")
    flat = _flat(pool)
    o = out if out is not None else torch.empty_like(q)
    cap = capability(q.device)
    bh = 16
    bt = 16
    k = indices.shape[1]
    low = q.dtype != torch.float32
    f32 = interpreting() or not low
    hb = triton.cdiv(h, bh)
    # split the indices until the grid fills the GPU (~4 programs per SM); the interpreter splits to test it
    if cap is None:
        n_split = 2 if k > 2 * bt else 1
    else:
        n_split = max(1, min(triton.cdiv(k, 4 * bt), triton.cdiv(528, max(1, b * hb))))
    chunk = triton.cdiv(triton.cdiv(k, n_split), bt) * bt
    n_split = triton.cdiv(k, chunk) if k else 1
    args = dict(BLOCK_H=bh, BLOCK_T=bt, HW_CAST=fp8_hw_cast(cap), F32_DOT=f32, ROW=TOKEN_BYTES, NOPE=NOPE_DIM,
                SOFF=SCALE_OFFSET, LOW=low, EXACT=interpreting(), num_warps=4 if cap else 1)
    qc, idx, sk = q.contiguous(), indices.to(torch.int32).contiguous(), sinks.float().contiguous()
    if b and k and n_split == 1:
        _sparse_decode_kernel[(b, hb, 1)](qc, flat, flat.view(torch.int16), idx, sk, o, o, k, h,
                                          float(scale) * 1.4426950408889634, chunk, SPLIT=False, **args)
    elif b and k:
        part = torch.empty(b, n_split, h, 512, dtype=torch.float32, device=q.device)
        ml = torch.empty(b, n_split, h, 2, dtype=torch.float32, device=q.device)
        _sparse_decode_kernel[(b, hb, n_split)](qc, flat, flat.view(torch.int16), idx, sk, part, ml, k, h,
                                                float(scale) * 1.4426950408889634, chunk, SPLIT=True, **args)
        _combine_kernel[(b, hb)](part, ml, sk, o, h, n_split, BLOCK_H=bh, num_warps=4 if cap else 1)
    elif b:
        o.zero_()
    return o


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
