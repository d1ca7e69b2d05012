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
from kernels.arch import capability, fp8_hw_cast, interpreting
from kernels.fp8_quant import quant_block_e4m3
from kernels.harness import Case, Check, ParitySpec, Skip

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
def _ue8m0_f32(sb):
    """UE8M0 bytes (int32 0..255) as fp32 ``2^(b-127)`` built from bits: byte 0 is the subnormal 2^-127 and
    255 is inf, as :func:`ue8m0_to_f32` gives (no exp2, which may flush the subnormal)."""
    return tl.where(sb == 0, 0x00400000, sb << 23).to(tl.float32, bitcast=True)


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, o_ptr, n_bytes, BLOCK: tl.constexpr):
    """The first dequant kernel (bytes as a flat run, the scale gathered per byte); kept as a baseline."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n_bytes
    b = tl.load(w_ptr + i, mask=m, other=0).to(tl.int32) & 0xFF
    sc = _ue8m0_f32(tl.load(s_ptr + i // 16, mask=m, other=127).to(tl.int32) & 0xFF)
    lo = _e2m1(b & 0xF) * sc
    hi = _e2m1(b >> 4) * sc
    # interleave (low nibble first) in registers, so each program writes one contiguous run
    out = tl.reshape(tl.join(lo, hi), [2 * BLOCK]).to(o_ptr.dtype.element_ty)
    j = tl.program_id(0).to(tl.int64) * 2 * BLOCK + tl.arange(0, 2 * BLOCK)
    tl.store(o_ptr + j, out, mask=j < 2 * n_bytes)


@triton.jit
def _e2m1_f32(code):
    """fp32 value of e2m1 codes (int32 0..15) in three integer ops and a multiply: the code's three magnitude
    bits ``e1 e0 m`` go to fp32 bits 24..22 and its sign to bit 31, which reads as ``2^(e-127)(1+m/2)`` (and,
    for e = 0, the subnormal ``m·2^-127``); times 2^126 that is exactly the e2m1 value, -0.0 for code 8."""
    bits = ((code & 8) << 28) | ((code & 7) << 22)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37  # 2^126


@triton.jit
def _dequant_tile_kernel(w_ptr, s_ptr, o_ptr, n_groups, BG: tl.constexpr, STREAM: tl.constexpr):
    """BG scale groups per program as a [BG, 16]-byte tile: one scale load per group, the two nibbles of each
    byte joined in registers, so each thread writes whole 32-value runs with 16-byte stores."""
    g = tl.program_id(0).to(tl.int64) * BG + tl.arange(0, BG)
    gm = g < n_groups
    c = tl.arange(0, 16)
    b = tl.load(w_ptr + g[:, None] * 16 + c[None, :], mask=gm[:, None], other=0).to(tl.int32) & 0xFF
    sc = _ue8m0_f32(tl.load(s_ptr + g, mask=gm, other=127).to(tl.int32) & 0xFF)
    v = tl.reshape(tl.join(_e2m1_f32(b & 0xF), _e2m1_f32(b >> 4)), [BG, 32]) * sc[:, None]
    j = tl.arange(0, 32)
    if STREAM:  # written once, never re-read here: streaming stores
        tl.store(o_ptr + g[:, None] * 32 + j[None, :], v.to(o_ptr.dtype.element_ty), mask=gm[:, None],
                 cache_modifier=".cs")
    else:
        tl.store(o_ptr + g[:, None] * 32 + j[None, :], v.to(o_ptr.dtype.element_ty), mask=gm[:, None])


@triton.jit
def _dequant_bf16x2_kernel(w_ptr, s_ptr, o_ptr, n_groups, BG: tl.constexpr, STREAM: tl.constexpr):
    """bf16 out, two values per 32-bit word (sm90: ``mul.rn.bf16x2``): each byte becomes one bf16 pair (low
    nibble in the low half) by bit placement (the magnitude bits at 8..6 read as ``2^(e-127)(1+m/2)`` or the
    subnormal ``m·2^-127``), then two exact packed multiplies: by 2^126 (the e2m1 value) and by the scale."""
    g = tl.program_id(0).to(tl.int64) * BG + tl.arange(0, BG)
    gm = g < n_groups
    c = tl.arange(0, 16)
    b = tl.load(w_ptr + g[:, None] * 16 + c[None, :], mask=gm[:, None], other=0).to(tl.int32) & 0xFF
    word = ((b & 0x08) << 12) | ((b & 0x07) << 6) | ((b & 0x80) << 24) | ((b & 0x70) << 18)
    sb = tl.load(s_ptr + g, mask=gm, other=127).to(tl.int32) & 0xFF
    sh = tl.where(sb == 0, 0x0040, sb << 7)  # bf16 bits of 2^(b-127): 0 -> subnormal 2^-127, 255 -> inf
    pair = (sh | (sh << 16))[:, None] + tl.zeros([BG, 16], dtype=tl.int32)
    k126 = tl.full([BG, 16], 0x7E807E80, tl.int32)  # 2^126 twice
    v = tl.inline_asm_elementwise("{ mul.rn.bf16x2 $0, $1, $2; mul.rn.bf16x2 $0, $0, $3; }", "=r,r,r,r",
                                  [word, k126, pair], dtype=tl.int32, is_pure=True, pack=1)
    if STREAM:
        tl.store(o_ptr + g[:, None] * 16 + c[None, :], v, mask=gm[:, None], cache_modifier=".cs")
    else:
        tl.store(o_ptr + g[:, None] * 16 + c[None, :], v, mask=gm[:, None])


#: dequant launch choices (variant, groups per program, warps); the benchmark round picks them
DQ_TILE = {"variant": "tile", "bg": 128, "warps": 4, "stream": False}


def mxfp4_dequant(w: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float32, *,
                  out: torch.Tensor | None = None, variant: str | None = None, bg: int | None = None,
                  warps: int | None = None, stream: bool | None = None) -> torch.Tensor:
    """Triton :func:`mxfp4_dequant_ref` (exact: a power-of-two scale times an e2m1 value).

    ``variant``: ``tile`` (portable: fp32 decode, one scale per 32-value group), ``bf16x2`` (bf16 out on
    sm90+: packed bf16 multiplies in PTX; not under the interpreter), ``flat`` (the first kernel)."""
    if w.shape[:-1] != scale.shape[:-1] or w.shape[-1] * 2 != scale.shape[-1] * GROUP:
        raise ValueError(f"mxfp4: weight {tuple(w.shape)} and scale {tuple(scale.shape)} disagree")
    wc = w.contiguous().view(torch.uint8)
    sc = scale.contiguous().view(torch.uint8)
    o = out if out is not None else torch.empty(*w.shape[:-1], w.shape[-1] * 2, dtype=out_dtype, device=w.device)
    n = wc.numel()
    if not n:
        return o
    v = variant or dequant_variant(capability(w.device), o.dtype)
    bg = bg or DQ_TILE["bg"]
    nw = warps or DQ_TILE["warps"]
    st = bool(DQ_TILE["stream"] if stream is None else stream)
    if interpreting():
        bg = min(bg, 32)
    groups = n // 16
    if v == "flat":
        block = 1024 if interpreting() else 4096
        _dequant_kernel[(triton.cdiv(n, block),)](wc, sc, o, n, BLOCK=block)
    elif v == "bf16x2":
        if o.dtype != torch.bfloat16 or not o.is_contiguous():
            raise ValueError("mxfp4_dequant: the bf16x2 variant writes a contiguous bf16 output")
        _dequant_bf16x2_kernel[(triton.cdiv(groups, bg),)](wc, sc, o.view(torch.int32), groups, BG=bg, STREAM=st,
                                                               num_warps=nw)
    elif v == "tile":
        _dequant_tile_kernel[(triton.cdiv(groups, bg),)](wc, sc, o, groups, BG=bg, STREAM=st, num_warps=nw)
    else:
        raise ValueError(f"mxfp4_dequant: unknown variant {v!r}")
    return o


def dequant_variant(cap: tuple[int, int] | None, out_dtype: torch.dtype) -> str:
    """Which dequant kernel a part runs: packed bf16 multiplies (``mul.rn.bf16x2`` is sm90+) for bf16 out on a
    GPU, else the portable tile kernel (the interpreter, fp32/fp16 out, older parts)."""
    if cap is not None and cap >= (9, 0) and out_dtype == torch.bfloat16 and DQ_TILE["variant"] == "bf16x2":
        return "bf16x2"
    return "tile"


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


# --- w4a8: fp8 activations times e4m3-decoded MXFP4 weights on fp8 tensor cores ---------------------

W4A8_NATIVE_FP4 = ("native FP4 MMA (sm100 tcgen05 / sm120 block-scaled mma) would apply here but is not built: "
                   "these parts take the fp8 MMA path on e4m3-decoded weights")


class _NoW4A8(Skip, RuntimeError):
    """This part has no path for w4a8 (no fp8 MMA)."""


def w4a8_select(cap: tuple[int, int] | None) -> tuple[str | None, str]:
    """``(path, why)`` for the w4a8 MoE on a part of compute capability ``cap`` (None: the CPU interpreter).

    ``fp8-mma``: packed e2m1 decoded to e4m3 in registers (exact: every e2m1 value is an e4m3 value) and fp8
    ``tl.dot`` with fp8 activations, on sm89+ (Ada, Hopper, and Blackwell, where the native FP4 MMA is not
    built); ``interpreter``: the same kernel under the Triton CPU interpreter (its fp8 dot is exact fp32 math);
    ``None``: the part has no fp8 MMA (pre-sm89), and ``why`` says so."""
    if cap is None:
        return "interpreter", "CPU interpreter: the fp8 kernel with fp32 dot semantics"
    if cap < (8, 9):
        return None, f"sm{cap[0]}{cap[1]} has no fp8 MMA (sm89+); run w4a16 (mxfp4_moe) there"
    if fp4_hw(cap):
        return "fp8-mma", W4A8_NATIVE_FP4
    return "fp8-mma", f"sm{cap[0]}{cap[1]}: fp8 MMA (no FP4 tensor cores on this part)"


def mxfp4_moe_w4a8_ref(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                       gate_up_scale: torch.Tensor, down: torch.Tensor, down_scale: torch.Tensor, limit: float | None,
                       block: int = 128) -> torch.Tensor:
    """QAT-faithful :func:`mxfp4_moe_ref`: the activations entering each expert GEMM (``x``, then the SwiGLU
    output) are block-quantised to fp8 e4m3 first (``act_quant_ref``, one fp32 scale per token per ``block``),
    then multiplied in fp32 by the exactly dequantised MXFP4 weights."""
    from kernels.fp8_quant import act_dequant_ref, act_quant_ref

    xd = act_dequant_ref(*act_quant_ref(x, block), block=block)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        wgu = mxfp4_dequant_ref(gate_up[e], gate_up_scale[e], torch.float32)
        wd = mxfp4_dequant_ref(down[e], down_scale[e], torch.float32)
        h = _swiglu(F.linear(xd[tok], wgu), limit)
        hd = act_dequant_ref(*act_quant_ref(h, block), block=block)
        out.index_add_(0, tok, F.linear(hd, wd) * weights[tok, slot, None].float())
    return out.to(x.dtype)


@triton.jit
def _e2m1_as_e4m3(b, R: tl.constexpr, C: tl.constexpr):
    """Packed bytes ``b[R, C]`` (int32) → ``[R, 2C]`` float8e4nv, low nibble first: code bits ``s e1 e0 m``
    go to e4m3 bits 7 and 4..2, which read as exactly ``e2m1 · 2^-6`` (code 1 lands on the e4m3 subnormal
    2^-7); the 2^6 goes into the weight scale."""
    lo = ((b & 0x08) << 4) | ((b & 0x07) << 2)
    hi = (b & 0x80) | ((b & 0x70) >> 2)
    v = tl.reshape(tl.join(lo, hi), [R, 2 * C])
    return v.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _e2m1_as_e4m3_ptx(b, R: tl.constexpr, C: tl.constexpr):
    """:func:`_e2m1_as_e4m3` four bytes per 32-bit register (PTX, GPU only): the low and the high nibbles of
    four packed bytes become four e4m3 bytes each in a shift and a masked or, about one instruction a value."""
    lo = tl.inline_asm_elementwise(
        "{ .reg .b32 t1, t2; shl.b32 t1, $1, 4; shl.b32 t2, $1, 2; and.b32 t1, t1, 0x80808080; "
        "and.b32 t2, t2, 0x1C1C1C1C; or.b32 $0, t1, t2; }", "=r,r", [b], dtype=tl.uint8, is_pure=True, pack=4)
    hi = tl.inline_asm_elementwise(
        "{ .reg .b32 t1, t2; and.b32 t1, $1, 0x80808080; shr.b32 t2, $1, 2; and.b32 t2, t2, 0x1C1C1C1C; "
        "or.b32 $0, t1, t2; }", "=r,r", [b], dtype=tl.uint8, is_pure=True, pack=4)
    return tl.reshape(tl.join(lo, hi), [R, 2 * C]).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _w4a8_gemm(a_ptr, as_ptr, a_rows, a_stride, as_stride, rm, w_ptr, ws_ptr, wrow0, n, nm, K,
               BM: tl.constexpr, BN: tl.constexpr, ABLOCK: tl.constexpr, PTX: tl.constexpr):
    """``acc[BM, BN] = Σ_g dot(a[:, g], w[n, g]ᵀ) · sa · sw`` over 32-wide K groups: fp8 activations
    ``a[row, K]`` with one fp32 scale per ``ABLOCK``, packed MXFP4 weight rows ``wrow0 + n`` (K/2 bytes, K/32
    UE8M0 scales). Every group's fp8 product is exact in the MMA; the scales apply in fp32 per group."""
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    c32 = tl.arange(0, 32)
    c16 = tl.arange(0, 16)
    wrow = (wrow0 + n).to(tl.int64)
    for k0 in range(0, K, 32):
        a = tl.load(a_ptr + a_rows[:, None] * a_stride + k0 + c32[None, :], mask=rm[:, None], other=0.0)
        sa = tl.load(as_ptr + a_rows * as_stride + k0 // ABLOCK, mask=rm, other=0.0)
        b = tl.load(w_ptr + wrow[:, None] * (K // 2) + k0 // 2 + c16[None, :], mask=nm[:, None], other=0)
        sb = tl.load(ws_ptr + wrow * (K // 32) + k0 // 32, mask=nm, other=0).to(tl.int32) & 0xFF
        if PTX:
            w = _e2m1_as_e4m3_ptx(b, BN, 16)  # [BN, 32]
        else:
            w = _e2m1_as_e4m3(b.to(tl.int32) & 0xFF, BN, 16)
        d = tl.dot(a, tl.trans(w))
        acc += d * (sa[:, None] * (_ue8m0_f32(sb) * 64.0)[None, :])
    return acc


@triton.jit
def _w4a8_up_kernel(xq_ptr, xs_ptr, order_ptr, meta_ptr, w_ptr, s_ptr, hq_ptr, hs_ptr, H, INTER, limit,
                    K_TOP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, ABLOCK: tl.constexpr,
                    QG: tl.constexpr, HAS_LIMIT: tl.constexpr, HW_CAST: tl.constexpr, PTX: tl.constexpr):
    """Tile (BM pairs of one expert, BN intermediate columns): gate and up GEMMs, the clamped SwiGLU, then
    the output quantised per pair per ABLOCK columns (fp8 + fp32 scale) for the down GEMM."""
    tile = tl.program_id(0)
    e = tl.load(meta_ptr + 3 * tile)
    start = tl.load(meta_ptr + 3 * tile + 1)
    stop = tl.load(meta_ptr + 3 * tile + 2)
    if start < stop:
        r = start + tl.arange(0, BM)
        rm = r < stop
        pair = tl.load(order_ptr + r, mask=rm, other=0).to(tl.int64)
        tok = pair // K_TOP
        n = tl.program_id(1) * BN + tl.arange(0, BN)
        nm = n < INTER
        base = e.to(tl.int64) * 2 * INTER
        g = _w4a8_gemm(xq_ptr, xs_ptr, tok, H, tl.cdiv(H, ABLOCK), rm, w_ptr, s_ptr, base, n, nm, H, BM, BN, ABLOCK,
                       PTX)
        u = _w4a8_gemm(xq_ptr, xs_ptr, tok, H, tl.cdiv(H, ABLOCK), rm, w_ptr, s_ptr, base + INTER, n, nm, H, BM, BN,
                       ABLOCK, PTX)
        if HAS_LIMIT:
            g = tl.minimum(g, limit)
            u = tl.minimum(tl.maximum(u, -limit), limit)
        h = g / (1.0 + tl.exp(-g)) * u
        h = tl.where(nm[None, :], h, 0.0)
        cols = n[None, :] + 0 * pair[:, None]
        q_ptrs = tl.reshape(hq_ptr + pair[:, None] * INTER + cols, [BM * QG, ABLOCK])
        mask = tl.reshape(rm[:, None] & nm[None, :], [BM * QG, ABLOCK])
        sc = quant_block_e4m3(tl.reshape(h, [BM * QG, ABLOCK]), q_ptrs, mask, False, HW_CAST)
        blk = tl.program_id(1) * QG + tl.arange(0, QG)
        s_ptrs = tl.reshape(hs_ptr + pair[:, None] * tl.cdiv(INTER, ABLOCK) + blk[None, :], [BM * QG])
        s_mask = tl.reshape(rm[:, None] & (blk * ABLOCK < INTER)[None, :], [BM * QG])
        tl.store(s_ptrs, sc, mask=s_mask)


@triton.jit
def _w4a8_down_kernel(hq_ptr, hs_ptr, order_ptr, meta_ptr, wt_ptr, w_ptr, s_ptr, y_ptr, H, INTER,
                      BM: tl.constexpr, BN: tl.constexpr, ABLOCK: tl.constexpr, PTX: tl.constexpr):
    tile = tl.program_id(0)
    e = tl.load(meta_ptr + 3 * tile)
    start = tl.load(meta_ptr + 3 * tile + 1)
    stop = tl.load(meta_ptr + 3 * tile + 2)
    if start < stop:
        r = start + tl.arange(0, BM)
        rm = r < stop
        pair = tl.load(order_ptr + r, mask=rm, other=0).to(tl.int64)
        n = tl.program_id(1) * BN + tl.arange(0, BN)
        nm = n < H
        y = _w4a8_gemm(hq_ptr, hs_ptr, pair, INTER, tl.cdiv(INTER, ABLOCK), rm, w_ptr, s_ptr, e.to(tl.int64) * H,
                       n, nm, INTER, BM, BN, ABLOCK, PTX)
        y = y * tl.load(wt_ptr + pair, mask=rm, other=0.0)[:, None]
        tl.store(y_ptr + pair[:, None] * H + n[None, :], y, mask=rm[:, None] & nm[None, :])


def _expert_tiles(ids: torch.Tensor, n_experts: int, bm: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs sorted by expert and a tile table ``[n_tiles, 3]`` = (expert, first, end) over the sorted order,
    at most ``bm`` pairs per tile, in device ops only (no host sync: the table has its worst-case length,
    unused tiles are empty)."""
    flat = ids.reshape(-1)
    p = flat.numel()
    order = torch.argsort(flat, stable=True).to(torch.int32)
    counts = torch.bincount(flat, minlength=n_experts)
    ends = counts.cumsum(0)
    tiles = (counts + bm - 1) // bm
    tend = tiles.cumsum(0)
    n_tiles = triton.cdiv(p, bm) + min(n_experts, p)
    ix = torch.arange(n_tiles, device=ids.device)
    te = torch.searchsorted(tend, ix, right=True)
    valid = te < n_experts
    tc = te.clamp(max=n_experts - 1)
    first = (ends - counts)[tc] + (ix - (tend - tiles)[tc]) * bm
    meta = torch.stack([tc, torch.where(valid, first, 0), torch.where(valid, ends[tc], 0)], dim=1)
    return order, meta.to(torch.int32).contiguous()


@triton.jit
def _align_kernel(ids_ptr, order_ptr, meta_ptr, cursor_ptr, P, E, n_tiles, BM: tl.constexpr, E_PAD: tl.constexpr,
                  CH: tl.constexpr, TCH: tl.constexpr):
    """:func:`_expert_tiles` in one program: a histogram of the experts, their starts and tile counts by
    prefix sums, the tile table, then each pair's slot in its expert's run by an atomic cursor (the order
    within an expert is arbitrary, which no result depends on: every row of a tile is computed alone)."""
    ex = tl.arange(0, E_PAD)
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for c0 in range(0, P, CH):
        i = c0 + tl.arange(0, CH)
        e = tl.load(ids_ptr + i, mask=i < P, other=E_PAD - 1).to(tl.int32)  # the tail counts in a spare bin
        counts += tl.histogram(e, E_PAD)
    counts = tl.where(ex < E, counts, 0)
    ends = tl.cumsum(counts, 0)
    starts = ends - counts
    tiles = (counts + BM - 1) // BM
    tend = tl.cumsum(tiles, 0)
    tfirst = tend - tiles
    tl.atomic_xchg(cursor_ptr + ex, starts)
    for t0 in range(0, n_tiles, TCH):
        ti = t0 + tl.arange(0, TCH)
        e_of = tl.sum((tend[None, :] <= ti[:, None]).to(tl.int32), axis=1)  # experts whose tiles end by ti
        sel = ex[None, :] == e_of[:, None]
        first = tl.sum(tl.where(sel, starts[None, :], 0), axis=1) + (ti - tl.sum(tl.where(sel, tfirst[None, :], 0), axis=1)) * BM
        stop = tl.sum(tl.where(sel, ends[None, :], 0), axis=1)
        valid = e_of < E
        tm = ti < n_tiles
        tl.store(meta_ptr + 3 * ti, tl.minimum(e_of, E - 1), mask=tm)
        tl.store(meta_ptr + 3 * ti + 1, tl.where(valid, first, 0), mask=tm)
        tl.store(meta_ptr + 3 * ti + 2, tl.where(valid, stop, 0), mask=tm)
    tl.debug_barrier()
    for c0 in range(0, P, CH):
        i = c0 + tl.arange(0, CH)
        m = i < P
        e = tl.load(ids_ptr + i, mask=m, other=0).to(tl.int32)
        pos = tl.atomic_add(cursor_ptr + e, 1, mask=m)
        tl.store(order_ptr + pos, i, mask=m)


def _expert_tiles_triton(ids: torch.Tensor, n_experts: int, bm: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_expert_tiles` as one launch (decode batches otherwise pay a dozen small torch kernels)."""
    flat = ids.reshape(-1).contiguous()
    p = flat.numel()
    n_tiles = triton.cdiv(p, bm) + min(n_experts, p)
    order = torch.empty(p, dtype=torch.int32, device=ids.device)
    meta = torch.empty(n_tiles, 3, dtype=torch.int32, device=ids.device)
    cursor = torch.empty(next_pow2(n_experts + 1), dtype=torch.int32, device=ids.device)
    _align_kernel[(1,)](flat, order, meta, cursor, p, n_experts, n_tiles, BM=bm, E_PAD=next_pow2(n_experts + 1),
                        CH=256 if interpreting() else 1024, TCH=16 if interpreting() else 32, num_warps=4)
    return order, meta


#: w4a8 launch choices (pairs per tile, columns per program, warps); block is the activation block
W4A8_TILE = {"bm": 16, "bn": 128, "warps": 4, "align": "triton", "decode": "ptx"}


def mxfp4_moe_w4a8(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   gate_up_scale: torch.Tensor, down: torch.Tensor, down_scale: torch.Tensor, limit: float | None,
                   block: int = 128, *, out: torch.Tensor | None = None, bm: int | None = None,
                   bn: int | None = None, warps: int | None = None, decode: str | None = None) -> torch.Tensor:
    """Triton w4a8 grouped MoE with :func:`mxfp4_moe_w4a8_ref`'s signature: ``x`` quantised to fp8 per token
    per ``block`` (``act_quant``), pairs grouped by expert, then per tile of one expert's pairs the gate+up
    fp8 GEMMs with the clamped SwiGLU and the fp8 quantisation of its output, then the down GEMM scaled by
    the routing weight, and a sum over the top-k. Raises where :func:`w4a8_select` gives no path."""
    from kernels.fp8_quant import act_quant

    path, why = w4a8_select(capability(x.device))
    if path is None:  # a Skip is a RuntimeError too: callers see the reason; the parity harness reports a skip
        raise _NoW4A8(f"mxfp4_moe_w4a8: {why}")
    t, h = x.shape
    e, two_i, hb = gate_up.shape
    i = two_i // 2
    if hb * 2 != h or tuple(down.shape) != (e, h, i // 2):
        raise ValueError(f"mxfp4_moe_w4a8: gate_up {tuple(gate_up.shape)} / down {tuple(down.shape)} do not fit "
                         f"hidden {h}")
    if block not in (32, 64, 128) or h % 32 or i % 32:
        raise ValueError(f"mxfp4_moe_w4a8: block must be 32, 64 or 128 and H, I multiples of 32 (got {block}, {h}, "
                         f"{i})")
    k = ids.shape[1]
    bm = bm or W4A8_TILE["bm"]
    bn = max(bn or W4A8_TILE["bn"], block)
    nw = warps or W4A8_TILE["warps"]
    y = torch.empty(t * k, h, dtype=torch.float32, device=x.device)  # every pair's row is written
    if t * k:
        xq, xs = act_quant(x.contiguous(), block)
        order, meta = (_expert_tiles_triton if W4A8_TILE["align"] == "triton" else _expert_tiles)(ids, e, bm)
        hq = torch.empty(t * k, i, dtype=torch.float8_e4m3fn, device=x.device)
        hs = torch.empty(t * k, triton.cdiv(i, block), dtype=torch.float32, device=x.device)
        hw = fp8_hw_cast(capability(x.device))
        ptx = (decode or W4A8_TILE["decode"]) == "ptx" and not interpreting()  # no inline PTX in the interpreter
        u8 = torch.uint8
        gu, gus = gate_up.contiguous().view(u8), gate_up_scale.contiguous().view(u8)
        dn, dns = down.contiguous().view(u8), down_scale.contiguous().view(u8)
        _w4a8_up_kernel[(meta.shape[0], triton.cdiv(i, bn))](
            xq, xs, order, meta, gu, gus, hq if hw else hq.view(u8), hs, h, i, float(limit or 0.0), K_TOP=k, BM=bm,
            BN=bn, ABLOCK=block, QG=bn // block, HAS_LIMIT=limit is not None, HW_CAST=hw, PTX=ptx, num_warps=nw)
        _w4a8_down_kernel[(meta.shape[0], triton.cdiv(h, bn))](
            hq, hs, order, meta, weights.float().contiguous().view(-1), dn, dns, y, h, i, BM=bm, BN=bn, ABLOCK=block,
            PTX=ptx, num_warps=nw)
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
SPEC_W4A8 = ParitySpec(
    op="mxfp4_moe_w4a8", make_inputs=_moe_inputs, reference=mxfp4_moe_w4a8_ref,
    kernel=lambda out, **i: mxfp4_moe_w4a8(**i, out=out[0]),
    cases=[Case("4tok 8e h64 i32 top2", {"shape": (4, 8, 64, 32, 2)}, dtype=torch.float32),
           Case("3tok 4e h96 i64 top2 bf16", {"shape": (3, 4, 96, 64, 2)}),
           Case("flash decode 32tok 256e h4096 i2048 top6", {"shape": (32, 256, 4096, 2048, 6)}, devices=("cuda",)),
           Case("flash prefill 512tok 256e h4096 i2048 top6", {"shape": (512, 256, 4096, 2048, 6)},
                devices=("cuda",))],
    checks=[Check("gemm_diff", 1e-5, "the same fp8 activations and exact e4m3 weights; fp32 sums per 32-K group "
                  "in another order, so a SwiGLU output on a rounding edge may quantise one e4m3 step apart")],
    description="grouped MXFP4 MoE (w4a8: fp8 activations per token per 128, e4m3-decoded weights, fp8 MMA)",
)
SPEC = SPEC_DEQUANT
