"""The compressor's fused store: gated pooling of a window, RMSNorm, rope on the trailing 64 channels,
FP8 quantisation and the write into the 584-byte pool, in one pass over the window.

Inputs are one window per entry: ``kv[n, L, 512]`` source projections and ``gate[n, L, 512]`` logits with
the slot bias already added (``-inf`` where a slot has no source token: CSA's first window). The pooling
is an online softmax over ``L`` per channel, so HCA's 128-token windows stream through registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.arch import capability, fp8_hw_cast, interpreting
from kernels.harness import Case, Check, ParitySpec
from kernels.kv584 import (
    HEAD_DIM,
    ROPE_DIM,
    SCALE_OFFSET,
    TOKEN_BYTES,
    _flat,
    kv584_load_ref,
    kv584_store_ref,
    new_pool,
    pack_row,
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


def compress_store(kv, gate, norm_weight, eps, cos, sin, pool, slots) -> torch.Tensor:
    """Triton :func:`compress_store_ref` (one program per entry)."""
    n, length, d = kv.shape
    if d != HEAD_DIM or gate.shape != kv.shape or cos.shape != (n, ROPE_DIM // 2):
        raise ValueError(f"compress_store: kv/gate must be [n, L, {HEAD_DIM}] and cos/sin [n, {ROPE_DIM // 2}], got "
                         f"{tuple(kv.shape)}, {tuple(gate.shape)}, {tuple(cos.shape)}")
    flat = _flat(pool)
    if n:
        _compress_kernel[(n,)](kv.contiguous(), gate.float().contiguous(), norm_weight.float().contiguous(),
                               cos.float().contiguous(), sin.float().contiguous(), slots.to(torch.int64).contiguous(),
                               flat, flat.view(torch.int16), length, float(eps), BLOCK_L=8 if interpreting() else 4,
                               HW_CAST=fp8_hw_cast(capability(kv.device)), EXACT=interpreting(), num_warps=4)
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
