"""Absorbed-MLA decode attention over a paged latent KV cache (one query token per sequence).

Layout, as in FlashMLA and vLLM: every cached token is one 576-wide row, the 512-wide compressed latent
``c_kv`` followed by the 64-wide rotated ``k_pe``; the latent doubles as V. The cache is
``[num_pages, page_size, 576]`` and ``block_table[b, i]`` names the page holding tokens
``i*page_size … (i+1)*page_size-1`` of sequence ``b``. Queries arrive already absorbed
(``q_nope · W_UK`` ‖ ``q_pe``), ``[B, H, 576]``; the output is ``[B, H, 512]`` in the latent space, plus the
natural-log LSE of the scaled scores ``[B, H]`` (fp32).

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
from kernels.harness import Case, Check, ParitySpec

LATENT = 512
ROPE = 64
PAGE = 64
_LOG2E = 1.4426950408889634


def mla_decode_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 oracle: gathers each sequence's rows through the block table, softmax in fp32.

    Returns ``(out[B, H, 512] in q.dtype, lse[B, H] fp32)``. Every ``seq_lens[b]`` must be ≥ 1.
    """
    _check(q, kv_cache, block_table, seq_lens)
    page = kv_cache.shape[1]
    b_sz, h, _ = q.shape
    out = torch.empty(b_sz, h, LATENT, dtype=torch.float32, device=q.device)
    lse = torch.empty(b_sz, h, dtype=torch.float32, device=q.device)
    for b in range(b_sz):
        n = int(seq_lens[b])
        if n < 1:
            raise ValueError(f"mla_decode: seq_lens[{b}] = {n}; every sequence needs at least one cached token")
        pos = torch.arange(n, device=q.device)
        rows = kv_cache[block_table[b, pos // page].long(), pos % page].float()  # [n, 576]
        s = (q[b].float() @ rows.t()) * softmax_scale  # [H, n]
        lse[b] = torch.logsumexp(s, dim=-1)
        out[b] = torch.softmax(s, dim=-1) @ rows[:, :LATENT]
    return out.to(q.dtype), lse


def _check(q, kv_cache, block_table, seq_lens) -> None:
    if q.dim() != 3 or q.shape[-1] != LATENT + ROPE:
        raise ValueError(f"mla_decode: q must be [batch, heads, {LATENT + ROPE}], got {tuple(q.shape)}")
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != LATENT + ROPE:
        raise ValueError(
            f"mla_decode: kv_cache must be [pages, page_size, {LATENT + ROPE}], got {tuple(kv_cache.shape)}"
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


def decode_config(
    batch: int, heads: int, max_context: int, capability: tuple[int, int] | None, num_sms: int = 132
) -> DecodeConfig:
    """Tiles and split count. ``max_context`` is the block table's capacity (a shape, never a device read,
    so the choice is fixed under CUDA-graph capture).

    A 64-token tile of 576 bf16 columns is 72 KB; sm90 double-buffers it in its 228 KB of shared memory,
    smaller-memory parts (sm120: ~100 KB) take 32-token tiles. Splits aim at two waves of programs.
    """
    block_h = 16 if heads <= 16 else 32
    if capability is None:
        return DecodeConfig(16, 32, max(1, min(4, triton.cdiv(max_context, 32))), 4, 1)
    big_smem = capability[0] == 9
    block_n = 64 if big_smem else 32
    programs = batch * triton.cdiv(heads, block_h)
    splits = max(1, min(triton.cdiv(2 * num_sms, programs), triton.cdiv(max_context, 4 * block_n), 64))
    return DecodeConfig(block_h, block_n, splits, 4 if block_h == 16 else 8, 2 if big_smem else 1)


@triton.jit
def _mla_split_kernel(
    q_ptr, kv_ptr, bt_ptr, len_ptr, o_ptr, lse_ptr,
    scale_log2, H,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_btb,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    PAGE_SIZE: tl.constexpr, D_LAT: tl.constexpr, D_ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, F32_DOT: tl.constexpr,
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    hb = tl.program_id(2)
    seq_len = tl.load(len_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    d_lat = tl.arange(0, D_LAT)
    d_rope = tl.arange(0, D_ROPE)
    q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q_lat = tl.load(q_row + d_lat[None, :], mask=h_ok[:, None], other=0.0)
    q_pe = tl.load(q_row + D_LAT + d_rope[None, :], mask=h_ok[:, None], other=0.0)
    if F32_DOT:
        q_lat = q_lat.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, D_LAT), dtype=tl.float32)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        t_ok = t < end
        page = tl.load(bt_ptr + b * stride_btb + t // PAGE_SIZE, mask=t_ok, other=0)
        row = kv_ptr + page.to(tl.int64) * stride_kp + (t % PAGE_SIZE) * stride_kt
        kv = tl.load(row[:, None] + d_lat[None, :], mask=t_ok[:, None], other=0.0)
        k_pe = tl.load(row[:, None] + D_LAT + d_rope[None, :], mask=t_ok[:, None], other=0.0)
        if F32_DOT:
            kv = kv.to(tl.float32)
            k_pe = k_pe.to(tl.float32)
        s = tl.dot(q_lat, tl.trans(kv))
        s = tl.dot(q_pe, tl.trans(k_pe), s)
        s = tl.where(t_ok[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if F32_DOT:  # the same products, rounded as the tensor cores round p
            p_dot = p.to(q_ptr.dtype.element_ty).to(tl.float32)
        else:
            p_dot = p.to(kv.dtype)
        acc = acc * alpha[:, None] + tl.dot(p_dot, kv)
        m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    o_ptrs = o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d_lat[None, :]
    tl.store(o_ptrs, out, mask=h_ok[:, None])
    tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse2, mask=h_ok)


@triton.jit
def _mla_merge_kernel(
    po_ptr, plse_ptr, o_ptr, lse_ptr,
    stride_pb, stride_ph, stride_ps, stride_lpb, stride_lph,
    stride_ob, stride_oh, stride_lb, stride_lh,
    NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, D_LAT: tl.constexpr, EXACT: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_P2)
    s_ok = s < NUM_SPLITS
    lse = tl.load(plse_ptr + b * stride_lpb + h * stride_lph + s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - m))
    total = tl.sum(w, 0)
    d = tl.arange(0, D_LAT)
    part = tl.load(
        po_ptr + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + d[None, :], mask=s_ok[:, None], other=0.0
    )
    out = tl.sum(part * w[:, None], 0) / total
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, cast_rne(out, o_ptr.dtype.element_ty, EXACT))
    tl.store(lse_ptr + b * stride_lb + h * stride_lh, (m + tl.log2(total)) / 1.4426950408889634)


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: DecodeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of :func:`mla_decode_ref`, writing into ``out=(o, lse)`` when given. No host
    synchronisation, so it can be graph-captured."""
    _check(q, kv_cache, block_table, seq_lens)
    b_sz, h, _ = q.shape
    page = kv_cache.shape[1]
    if kv_cache.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError("mla_decode: the last dim of q and kv_cache must be contiguous")
    cap = capability(q.device)
    if config is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if cap else 132
        config = decode_config(b_sz, h, block_table.shape[1] * page, cap, sms)
    splits = config.num_splits
    part_o = torch.empty(b_sz, h, splits, LATENT, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(b_sz, h, splits, dtype=torch.float32, device=q.device)
    if out is None:
        out = torch.empty(b_sz, h, LATENT, dtype=q.dtype, device=q.device)
        lse = torch.empty(b_sz, h, dtype=torch.float32, device=q.device)
    else:
        out, lse = out
        if tuple(out.shape) != (b_sz, h, LATENT) or out.dtype != q.dtype or out.stride(2) != 1:
            raise ValueError(f"mla_decode: out must be [{b_sz}, {h}, {LATENT}] {q.dtype}, got {tuple(out.shape)} {out.dtype}")
        if tuple(lse.shape) != (b_sz, h) or lse.dtype != torch.float32:
            raise ValueError(f"mla_decode: lse must be [{b_sz}, {h}] float32, got {tuple(lse.shape)} {lse.dtype}")
    if b_sz == 0:
        return out, lse
    grid = (b_sz, splits, triton.cdiv(h, config.block_h))
    _mla_split_kernel[grid](
        q, kv_cache, block_table, seq_lens, part_o, part_lse,
        softmax_scale * _LOG2E, h,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        PAGE_SIZE=page, D_LAT=LATENT, D_ROPE=ROPE,
        BLOCK_H=config.block_h, BLOCK_N=config.block_n, NUM_SPLITS=splits, F32_DOT=cap is None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    _mla_merge_kernel[(b_sz, h)](
        part_o, part_lse, out, lse,
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        NUM_SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits), D_LAT=LATENT, EXACT=interpreting(),
        num_warps=4,
    )
    return out, lse


def bytes_moved(seq_lens: torch.Tensor, heads: int, elem: int = 2) -> int:
    """The fewest bytes one call must move: each cached row once, q in, out and LSE back."""
    rows = int(seq_lens.sum())
    b = seq_lens.numel()
    return rows * (LATENT + ROPE) * elem + b * heads * ((LATENT + ROPE) * elem + LATENT * elem + 4)


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
    op="mla_decode",
    make_inputs=_inputs,
    reference=mla_decode_ref,
    kernel=lambda out, **inp: mla_decode(**inp, out=out),
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
        Check("lse_abs", 5e-6, "fp32 softmax stats over a different split order: a few ulps of |lse| < 16",
              output=1, name="lse"),
    ],
    description="absorbed MLA decode over a paged 512+64 latent cache, split-KV with an LSE merge",
)
