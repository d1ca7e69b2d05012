"""MXFP4 expert weights: e2m1 values packed two per byte (low nibble first) with one UE8M0 scale per 32.

``mxfp4_dequant`` expands ``w[..., N, K/2]`` (int8/uint8 bytes) and ``scale[..., N, K/32]`` (UE8M0: the value
is ``2^(byte-127)``) to a float weight. ``mxfp4_moe`` is the routed-expert SwiGLU (with V4's clamp) that
reads the packed weights directly (w4a16): each (token, expert) pair dequantises only the tiles it
multiplies, so decode streams 4.25 bits per weight instead of 16. FP4 tensor cores (sm100+) are not used:
sm90 has none, and sm120's need a different operand layout, so this path is the same on every part.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._launch import next_pow2
from kernels.arch import capability, interpreting
from kernels.harness import Case, Check, ParitySpec

GROUP = 32  # elements per UE8M0 scale
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def fp4_hw(cap: tuple[int, int] | None) -> bool:
    """Whether a part converts e2m1 in hardware (sm100 and up, sm120 included). No kernel here needs it:
    the dequantising path decodes nibbles in integer arithmetic, which is exact everywhere."""
    return cap is not None and cap >= (10, 0)


def ue8m0_to_f32(s: torch.Tensor) -> torch.Tensor:
    """UE8M0 scales (``float8_e8m0fnu`` or raw ``uint8`` bytes) as fp32 powers of two."""
    b = s.view(torch.uint8) if s.dtype != torch.uint8 else s
    return torch.ldexp(torch.ones_like(b, dtype=torch.float32), b.to(torch.int32) - 127)


def mxfp4_dequant_ref(w: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The oracle: ``w[..., N, K/2]`` packed bytes, ``scale[..., N, K/32]`` → ``[..., N, K]`` in ``out_dtype``."""
    if w.shape[:-1] != scale.shape[:-1] or w.shape[-1] * 2 != scale.shape[-1] * GROUP:
        raise ValueError(f"mxfp4: weight {tuple(w.shape)} (K/2 bytes per row) and scale {tuple(scale.shape)} "
                         f"(one per {GROUP}) disagree")
    lut = torch.tensor(E2M1, dtype=torch.float32, device=w.device)
    u8 = w.contiguous().view(torch.uint8)
    vals = torch.stack([lut[(u8 & 0xF).long()], lut[(u8 >> 4).long()]], dim=-1).flatten(-2)
    s = ue8m0_to_f32(scale).repeat_interleave(GROUP, dim=-1)
    return (vals * s).to(out_dtype)


def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w[..., N, K]`` → (int8 packed ``[..., N, K/2]``, float8_e8m0fnu ``[..., N, K/32]``): the scale is the
    power of two that puts the group's amax at or under 6, each value rounds to the nearest e2m1."""
    if w.shape[-1] % GROUP:
        raise ValueError(f"mxfp4: K ({w.shape[-1]}) must be a multiple of {GROUP}")
    g = w.float().reshape(*w.shape[:-1], -1, GROUP)
    amax = g.abs().amax(dim=-1, keepdim=True).clamp_min(2.0**-126)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    q = g / torch.exp2(exp)
    lut = torch.tensor(E2M1[:8], dtype=torch.float32, device=w.device)
    code = (q.abs().unsqueeze(-1) - lut).abs().argmin(dim=-1)
    code = code | ((q < 0) & (code > 0)).long() << 3
    code = code.reshape(*w.shape[:-1], -1, 2).to(torch.uint8)
    packed = (code[..., 0] | (code[..., 1] << 4)).view(torch.int8)
    scale = (exp.squeeze(-1) + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return packed, scale


def _swiglu(h: torch.Tensor, limit: float | None) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return F.silu(gate) * up


def swiglu_moe_ref(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, limit: float | None) -> torch.Tensor:
    """Routed experts with dense weights: ``gate_up[E, 2I, H]`` (gate rows first), ``down[E, H, I]``;
    ``gate`` clamped above and ``up`` both ways at ``limit``. ``x[T, H]``; returns ``[T, H]`` in ``x.dtype``."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = _swiglu(F.linear(x[tok], gate_up[e].to(x.dtype)), limit)
        y = F.linear(h, down[e].to(x.dtype)) * weights[tok, slot, None].to(x.dtype)
        out.index_add_(0, tok, y.float())
    return out.to(x.dtype)


def mxfp4_moe_ref(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                  gate_up_scale: torch.Tensor, down: torch.Tensor, down_scale: torch.Tensor,
                  limit: float | None) -> torch.Tensor:
    """:func:`swiglu_moe_ref` over MXFP4 weights, dequantised expert by expert (only the experts used)."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        wgu = mxfp4_dequant_ref(gate_up[e], gate_up_scale[e], torch.float32)
        wd = mxfp4_dequant_ref(down[e], down_scale[e], torch.float32)
        h = _swiglu(F.linear(x[tok].float(), wgu), limit)
        out.index_add_(0, tok, F.linear(h, wd) * weights[tok, slot, None].float())
    return out.to(x.dtype)


# --- Triton ------------------------------------------------------------------------------------------

@triton.jit
def _e2m1(code):
    """fp32 value of e2m1 codes (int32, 0..15): exponent 0 is the subnormal 0/0.5, then 1·2^(e-1)·(1+m/2)."""
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    mag = tl.where(e == 0, m * 0.5, tl.exp2((e - 1).to(tl.float32)) * (1.0 + 0.5 * m))
    # the sign as a bit, so code 8 is -0.0 (a negation can be folded away for a zero)
    return (mag.to(tl.int32, bitcast=True) | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, o_ptr, n_bytes, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n_bytes
    b = tl.load(w_ptr + i, mask=m, other=0).to(tl.int32) & 0xFF
    s = tl.load(s_ptr + i // 16, mask=m, other=127).to(tl.int32) & 0xFF
    sc = tl.exp2((s - 127).to(tl.float32))
    lo = _e2m1(b & 0xF) * sc
    hi = _e2m1(b >> 4) * sc
    # interleave (low nibble first) in registers, so each program writes one contiguous run
    out = tl.reshape(tl.join(lo, hi), [2 * BLOCK]).to(o_ptr.dtype.element_ty)
    j = tl.program_id(0).to(tl.int64) * 2 * BLOCK + tl.arange(0, 2 * BLOCK)
    tl.store(o_ptr + j, out, mask=j < 2 * n_bytes)


def mxfp4_dequant(w: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float32, *,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton :func:`mxfp4_dequant_ref` (exact: a power-of-two scale times an e2m1 value)."""
    if w.shape[:-1] != scale.shape[:-1] or w.shape[-1] * 2 != scale.shape[-1] * GROUP:
        raise ValueError(f"mxfp4: weight {tuple(w.shape)} and scale {tuple(scale.shape)} disagree")
    wc = w.contiguous().view(torch.uint8)
    sc = scale.contiguous().view(torch.uint8)
    o = out if out is not None else torch.empty(*w.shape[:-1], w.shape[-1] * 2, dtype=out_dtype, device=w.device)
    n = wc.numel()
    block = 1024 if interpreting() else 4096
    if n:
        _dequant_kernel[(triton.cdiv(n, block),)](wc, sc, o, n, BLOCK=block)
    return o


@triton.jit
def _w4_rows(w_ptr, s_ptr, row0, rows, n_rows, x_ptr, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Σ_k W[row, k] x[k] for BLOCK_N rows of a packed MXFP4 matrix (K/2 bytes and K/32 scales per row)."""
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    rm = rows < n_rows
    for k0 in range(0, K // 2, BLOCK_K):
        kb = k0 + tl.arange(0, BLOCK_K)
        km = kb < K // 2
        b = tl.load(w_ptr + (row0 + rows[:, None]) * (K // 2) + kb[None, :], mask=rm[:, None] & km[None, :],
                    other=0).to(tl.int32) & 0xFF
        s = tl.load(s_ptr + (row0 + rows[:, None]) * (K // 32) + kb[None, :] // 16, mask=rm[:, None] & km[None, :],
                    other=127).to(tl.int32) & 0xFF
        sc = tl.exp2((s - 127).to(tl.float32))
        xe = tl.load(x_ptr + 2 * kb, mask=km, other=0.0).to(tl.float32)
        xo = tl.load(x_ptr + 2 * kb + 1, mask=km, other=0.0).to(tl.float32)
        acc += tl.sum((_e2m1(b & 0xF) * xe[None, :] + _e2m1(b >> 4) * xo[None, :]) * sc, axis=1)
    return acc


@triton.jit
def _moe_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, h_ptr, H, INTER, limit, K_TOP: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_LIMIT: tl.constexpr):
    pair = tl.program_id(0).to(tl.int64)
    tok = pair // K_TOP
    e = tl.load(ids_ptr + pair).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    base = e * 2 * INTER
    g = _w4_rows(w_ptr, s_ptr, base, rows, INTER, x_ptr + tok * H, H, BLOCK_N, BLOCK_K)
    u = _w4_rows(w_ptr, s_ptr, base + INTER, rows, INTER, x_ptr + tok * H, H, BLOCK_N, BLOCK_K)
    if HAS_LIMIT:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + pair * INTER + rows, h, mask=rows < INTER)


@triton.jit
def _moe_down_kernel(h_ptr, ids_ptr, wt_ptr, w_ptr, s_ptr, y_ptr, H, INTER, K_TOP: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pair = tl.program_id(0).to(tl.int64)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    y = _w4_rows(w_ptr, s_ptr, e * H, rows, H, h_ptr + pair * INTER, INTER, BLOCK_N, BLOCK_K)
    y = y * tl.load(wt_ptr + pair)
    tl.store(y_ptr + pair * H + rows, y, mask=rows < H)


def mxfp4_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
              gate_up_scale: torch.Tensor, down: torch.Tensor, down_scale: torch.Tensor, limit: float | None, *,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton w4a16 grouped MoE with :func:`mxfp4_moe_ref`'s signature: two launches over (pair, row-block)
    (gate+up with the clamped SwiGLU, then down scaled by the routing weight), then a sum over the top-k."""
    t, h = x.shape
    e, two_i, hb = gate_up.shape
    i = two_i // 2
    if hb * 2 != h or tuple(down.shape) != (e, h, i // 2):
        raise ValueError(f"mxfp4_moe: gate_up {tuple(gate_up.shape)} / down {tuple(down.shape)} do not fit "
                         f"hidden {h}")
    k = ids.shape[1]
    xc = x.contiguous()
    idc = ids.contiguous().view(-1)
    wt = weights.float().contiguous().view(-1)
    hid = torch.empty(t * k, i, dtype=torch.float32, device=x.device)
    y = torch.empty(t * k, h, dtype=torch.float32, device=x.device)
    cap = capability(x.device)
    bn = 16 if cap is None else 32
    bk = 64 if cap is None else 128
    if t * k:
        gu, gus = gate_up.contiguous().view(torch.uint8), gate_up_scale.contiguous().view(torch.uint8)
        _moe_up_kernel[(t * k, triton.cdiv(i, bn))](xc, idc, gu, gus, hid, h, i, float(limit or 0.0), K_TOP=k,
                                                    BLOCK_N=bn, BLOCK_K=bk, HAS_LIMIT=limit is not None)
        dn, dns = down.contiguous().view(torch.uint8), down_scale.contiguous().view(torch.uint8)
        _moe_down_kernel[(t * k, triton.cdiv(h, bn))](hid, idc, wt, dn, dns, y, h, i, K_TOP=k, BLOCK_N=bn,
                                                      BLOCK_K=min(bk, next_pow2(i // 2)))
    res = y.view(t, k, h).sum(dim=1).to(x.dtype)
    if out is not None:
        out.copy_(res)
        return out
    return res


# --- parity ------------------------------------------------------------------------------------------

def _random_packed(shape, gen, device):
    n, k = shape[-2], shape[-1]
    w = torch.randint(0, 256, (*shape[:-2], n, k // 2), generator=gen, device=device, dtype=torch.int32)
    s = torch.randint(120, 134, (*shape[:-2], n, k // GROUP), generator=gen, device=device, dtype=torch.int32)
    return w.to(torch.uint8).view(torch.int8), s.to(torch.uint8).view(torch.float8_e8m0fnu)


def _dq_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    w, s = _random_packed(case.params["shape"], gen, device)
    return {"w": w, "scale": s, "out_dtype": case.dtype}


def _moe_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    t, e, h, i, k = case.params["shape"]
    gu, gus = _random_packed((e, 2 * i, h), gen, device)
    dn, dns = _random_packed((e, h, i), gen, device)
    # scales near 2^-4 keep activations O(1) so the clamp and the SiLU both matter
    gus = (gus.view(torch.uint8).to(torch.int32) - 5).to(torch.uint8).view(torch.float8_e8m0fnu)
    dns = (dns.view(torch.uint8).to(torch.int32) - 5).to(torch.uint8).view(torch.float8_e8m0fnu)
    ids = torch.stack([torch.randperm(e, generator=gen, device=device)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=gen, device=device)
    return {"x": torch.randn(t, h, generator=gen, device=device).to(case.dtype), "weights": w / w.sum(-1, True),
            "ids": ids, "gate_up": gu, "gate_up_scale": gus, "down": dn, "down_scale": dns, "limit": 7.0}


SPEC_DEQUANT = ParitySpec(
    op="mxfp4_dequant", make_inputs=_dq_inputs, reference=mxfp4_dequant_ref,
    kernel=lambda out, **i: mxfp4_dequant(**i, out=out[0]),
    cases=[Case("64x256", {"shape": (64, 256)}, dtype=torch.float32), Case("3x8x96", {"shape": (3, 8, 96)}),
           Case("flash 8 experts' gate_up 4096x4096", {"shape": (8, 4096, 4096)}, devices=("cuda",))],
    checks=[Check("bit_exact", 0, "a power-of-two scale times an e2m1 value is exact in fp32 and bf16")],
    description="MXFP4 dequant: e2m1 nibbles (low first) times UE8M0 per 32",
)
SPEC_MOE = ParitySpec(
    op="mxfp4_moe", make_inputs=_moe_inputs, reference=mxfp4_moe_ref, kernel=lambda out, **i: mxfp4_moe(**i, out=out[0]),
    cases=[Case("4tok 8e h64 i32 top2", {"shape": (4, 8, 64, 32, 2)}, dtype=torch.float32),
           Case("3tok 4e h96 i64 top2 bf16", {"shape": (3, 4, 96, 64, 2)}),
           Case("flash decode 32tok 256e h4096 i2048 top6", {"shape": (32, 256, 4096, 2048, 6)}, devices=("cuda",))],
    checks=[Check("gemm_diff", 1e-5, "fp32 accumulation over K in a different order; activations rounded once",
                  dtypes=(torch.float32,)),
            Check("gemm_diff", 1e-5, "fp32 math on both sides from the same bf16 activations",
                  dtypes=(torch.bfloat16,))],
    description="grouped MXFP4 MoE (w4a16) with V4's clamped SwiGLU",
)
SPEC = SPEC_DEQUANT
