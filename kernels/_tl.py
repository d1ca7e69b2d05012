"""Triton helpers shared by the kernels: exact rounding that the CPU interpreter gets wrong.

The interpreter truncates fp32→bf16 and misrounds fp32→e4m3 (ties, and binade edges: 124.9 → 64), while
GPUs round to nearest even. Kernels pass ``EXACT=kernels.arch.interpreting()`` so the interpreter rounds in
integer arithmetic (bit-identical to the GPU's convert) and the GPU keeps its single convert instruction.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def cast_rne(y, dtype: tl.constexpr, EXACT: tl.constexpr):
    """``y`` (fp32) to ``dtype`` rounding to nearest even, also under the interpreter."""
    if EXACT:
        if dtype == tl.bfloat16:
            b = y.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            y = b.to(tl.float32, bitcast=True)
    return y.to(dtype)


@triton.jit
def round_e4m3(y):
    """``y`` (fp32, |y| ≤ 448) rounded to the nearest-even float8_e4m3fn value, still in fp32.

    Adding ``1.5·2^(e+20)`` puts the e4m3 ulp (2^(e−3), exponent floored at −6 for subnormals) at the fp32
    ulp, so the fp32 add itself rounds to nearest even; a carry into the next binade comes out right."""
    a = tl.abs(y)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    c = ((e + 20 + 127) << 23).to(tl.float32, bitcast=True) * 1.5
    r = (a + c) - c
    sign = (y.to(tl.int32, bitcast=True) >> 31) << 31  # copy the sign bit: -0.0 stays -0.0
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def div_rn_by(x, s, r):
    """``x / s`` correctly rounded, given ``r = 1/s`` correctly rounded: a product and two Markstein
    corrections (each residual ``x − y·s`` is exact in an FMA) — five FMA-pipe ops per element instead of a
    full IEEE divide, which keeps quantisation under the memory roofline. Zeros keep their sign. Exact for
    ``|x| ≥ 2^-102``; below that the residual is subnormal and the quotient may be off by ulps, which no
    e4m3 value (smallest step 2^-9) can see."""
    y = x * r
    y = tl.fma(tl.fma(-y, s, x), r, y)
    y = tl.fma(tl.fma(-y, s, x), r, y)
    return tl.where(x == 0, x, y)


@triton.jit
def e4m3_bits(y):
    """The float8_e4m3fn byte (as int32) of ``y`` (fp32, |y| ≤ 448), rounded to nearest even, in integer
    arithmetic: for the interpreter and for parts without an e4m3 convert (< sm89)."""
    r = tl.abs(round_e4m3(y))
    rb = r.to(tl.int32, bitcast=True)
    e = ((rb >> 23) & 0xFF) - 127
    normal = ((e + 7) << 3) | ((rb >> 20) & 7)
    sub = (r * 512.0).to(tl.int32)  # r is k·2^-9, k < 8
    code = tl.where(e >= -6, normal, sub)
    sign = (y.to(tl.int32, bitcast=True) >> 24) & 0x80
    return code | sign


@triton.jit
def e4m3_to_f32(b):
    """The fp32 value of float8_e4m3fn bytes ``b`` (any integer type), decoded in integer arithmetic: for
    parts without e4m3 support (< sm89). Exact; 0x7F/0xFF decode to NaN as in e4m3fn."""
    b = b.to(tl.int32) & 0xFF
    e = (b >> 3) & 0xF
    m = b & 7
    u = b.to(tl.uint32)  # the sign lands in bit 31: unsigned, so the shift cannot overflow a signed int
    sign = (u & 0x80) << 24
    normal = (sign | ((u >> 3 & 0xF) + 120 << 23) | ((u & 7) << 20)).to(tl.float32, bitcast=True)
    # m · 2^-9 with the sign OR-ed into its bits: compiled, ``-x`` is ``0 - x``, which turns -0.0 into +0.0
    sub = (sign | (m.to(tl.float32) * 0.001953125).to(tl.uint32, bitcast=True)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, sub, normal)
    return tl.where((b & 0x7F) == 0x7F, float("nan"), v)
