"""Dense (16/32-bit) projection ``y = x Wᵀ`` at decode sizes: one weight stream, no library GEMM.

At one row of ``x`` a projection is a read of its weight. :func:`linear` serves it with a kernel that needs no
tensor cores: each program multiplies ``BLOCK_N`` weight rows by the row of ``x`` in ``BLOCK_K``-wide steps
and sums along K at the end (fp32), output in ``out_dtype`` (default ``x.dtype``). Measured on H200 (graph
replay, weights rotated past L2; ``benchmarks/engine_decode.py --sections linear``), 4 rows × 512 per step
beat cuBLAS at M=1 on the small config's q|kv_a (5.9 vs 6.6 µs), o_proj (4.6 vs 6.1), shared down (6.1 vs
7.3) and the dense gate|up (26.0 vs 26.8), and the fp32 router at M ≤ 16 (3.7–3.9 vs 6–10 µs); cuBLAS stays
ahead above one row, so those calls go to ``F.linear``. A 16-row ``tl.dot`` variant (``config`` with
``BLOCK_N`` ≥ 16) is kept for the sweep: it was slower than cuBLAS at M = 1–16 in every shape, and slower
still inside the engine's step (32 calls 619 µs against ~290 µs predicted), so no default uses it.

An fp32 weight (the router's) multiplies in full fp32; a bf16 ``x`` against it is widened in registers, so
``linear(x, w_fp32)`` equals ``F.linear(x.float(), w)`` up to summation order without the widened copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._tl import cast_rne
from kernels.arch import capability, interpreting
from kernels.harness import Case, Check, ParitySpec
from kernels.tiles import dot_precision

GEMV_MAX_M = 16  # most rows of x any weight-streaming variant takes (the dot variant's one 16-row tile)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x[..., K] @ weight[N, K]ᵀ`` in the weight's dtype (``x`` cast to it), returned in ``out_dtype``
    (default ``x.dtype``)."""
    y = F.linear(x.to(weight.dtype), weight)
    return y if out_dtype is None or y.dtype == out_dtype else y.to(out_dtype)


@triton.jit
def _load_x(x_ptrs, mask, K, SILU: tl.constexpr, EXACT: tl.constexpr):
    """A tile of the GEMM's input: ``x`` itself, or with ``SILU`` ``silu(gate)·up`` of ``x = [gate | up]``
    (``K`` columns each), rounded to ``x``'s dtype as the separate SiLU·mul op stores it."""
    if SILU:
        g = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptrs + K, mask=mask, other=0.0).to(tl.float32)
        h = g / (1.0 + tl.exp2(g * -1.4426950408889634)) * u
        return cast_rne(h, x_ptrs.dtype.element_ty, EXACT)
    return tl.load(x_ptrs, mask=mask, other=0.0)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    SILU: tl.constexpr, F32_DOT: tl.constexpr, PREC: tl.constexpr, EXACT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    rn_c = tl.where(n_ok, rn, 0).to(tl.int64)  # edge columns re-read row 0: no mask on the weight stream
    x_ptrs = x_ptr + tl.where(m_ok, rm, 0).to(tl.int64)[:, None] * stride_xm + rk[None, :]
    w_ptrs = w_ptr + rn_c[None, :] * stride_wn + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            xa = _load_x(x_ptrs, m_ok[:, None], K, SILU, EXACT)
            wb = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            k_ok = k0 + rk < K
            xa = _load_x(x_ptrs, m_ok[:, None] & k_ok[None, :], K, SILU, EXACT)
            wb = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0, eviction_policy="evict_first")
        if F32_DOT:  # the interpreter: dots in fp32 (products of 16-bit values are exact there)
            acc = tl.dot(xa.to(tl.float32), wb.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(xa.to(wb.dtype), wb, acc, input_precision=PREC)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    y_ptrs = y_ptr + tl.where(m_ok, rm, 0).to(tl.int64)[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, cast_rne(acc, y_ptr.dtype.element_ty, EXACT), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _gemv_vec_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, SILU: tl.constexpr, EXACT: tl.constexpr,
):
    # no tensor cores: BLOCK_N weight rows × BLOCK_K, multiplied by one row of x and summed along K at the end
    # (for narrow outputs, e.g. the router's 64 logits, where 16-column dot tiles leave most SMs idle)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.program_id(1).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    rn_c = tl.where(n_ok, rn, 0).to(tl.int64)
    x_ptrs = x_ptr + row * stride_xm + rk
    w_ptrs = w_ptr + rn_c[:, None] * stride_wn + rk[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            xa = _load_x(x_ptrs, rk < BLOCK_K, K, SILU, EXACT)
            wb = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            k_ok = k0 + rk < K
            xa = _load_x(x_ptrs, k_ok, K, SILU, EXACT)
            wb = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0, eviction_policy="evict_first")
        acc += wb.to(tl.float32) * xa.to(tl.float32)[None, :]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    y = tl.sum(acc, 1)
    tl.store(y_ptr + row * stride_ym + rn, cast_rne(y, y_ptr.dtype.element_ty, EXACT), mask=n_ok)


def gemv_config(m: int, n: int, k: int, elem: int, cap: tuple[int, int] | None
                ) -> tuple[int, int, int, int] | None:
    """``(BLOCK_N, BLOCK_K, warps, stages)`` for ``m`` rows, or None for cuBLAS (see the module docstring).
    ``BLOCK_N`` < 16 is the tensor-core-free kernel (one row of ``x`` per program). Under the interpreter
    every call of at most 16 rows takes a kernel, so the CPU suite runs both variants."""
    if cap is None:
        if m > GEMV_MAX_M:
            return None
        return (16, 32, 1, 1) if n >= 16 and m > 1 else (4, 32, 1, 1)
    if elem == 4:  # the fp32 router: 64 logits, 0.5 MB of weight
        return (4, 256, 4, 1) if m <= GEMV_MAX_M else None
    return (4, 512, 4, 1) if m == 1 else None


def _gemv(x2: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, silu: bool,
          config: tuple[int, int, int, int]) -> None:
    m, (n, k) = x2.shape[0], weight.shape
    cap = capability(x2.device)
    block_n, block_k, warps, stages = config
    if block_n < 16:
        _gemv_vec_kernel[(triton.cdiv(n, block_n), m)](
            x2, weight, y, m, n, k, x2.stride(0), weight.stride(0), y.stride(0),
            BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0, SILU=silu, EXACT=interpreting(),
            num_warps=warps, num_stages=stages,
        )
        return
    _gemv_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, 16))](
        x2, weight, y, m, n, k, x2.stride(0), weight.stride(0), y.stride(0),
        BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0, SILU=silu,
        F32_DOT=cap is None, PREC=dot_precision(weight.dtype), EXACT=interpreting(), num_warps=warps,
        num_stages=stages,
    )


def _pick(config, m: int, n: int, k: int, weight: torch.Tensor) -> tuple[int, int, int, int] | None:
    if m == 0 or weight.stride(1) != 1:
        return None
    if config is None:
        return gemv_config(m, n, k, weight.element_size(), capability(weight.device))
    return config if config[0] < 16 or m <= GEMV_MAX_M else None


def _prepare(x: torch.Tensor, k: int, out_dtype, out: torch.Tensor | None, n: int):
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if out is None:
        y = torch.empty(m, n, dtype=out_dtype, device=x.device)
    else:
        if tuple(out.shape) != (*lead, n) or out.dtype != out_dtype or not out.is_contiguous():
            raise ValueError(f"linear: out must be contiguous {(*lead, n)} {out_dtype}, got {tuple(out.shape)}")
        y = out.view(m, n)
    return lead, x2, y


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None, *,
           out: torch.Tensor | None = None, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Triton twin of :func:`linear_ref`: a weight-streaming kernel where :func:`gemv_config` picks one
    (``config`` = ``(BLOCK_N, BLOCK_K, warps, stages)`` forces it; the dot variant takes at most
    :data:`GEMV_MAX_M` rows), else ``F.linear``."""
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: x [..., {weight.shape[-1] if weight.dim() == 2 else '?'}] against weight "
                         f"[N, K] expected, got {tuple(x.shape)} and {tuple(weight.shape)}")
    out_dtype = out_dtype or x.dtype
    n, k = weight.shape
    m = x.numel() // max(k, 1)
    config = _pick(config, m, n, k, weight)
    if config is None:
        y = linear_ref(x, weight, out_dtype)
        return y if out is None else out.copy_(y)
    lead, x2, y = _prepare(x, k, out_dtype, out, n)
    _gemv(x2, weight, y, False, config)
    return y.view(*lead, n) if out is None else out


def silu_mul_linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``silu(gate)·up`` of ``x = [gate | up]`` (rounded to ``x.dtype``), then ``@ weightᵀ``: an MLP's down
    projection after its SwiGLU."""
    from kernels.silu_mul import silu_mul_ref

    return linear_ref(silu_mul_ref(x), weight)


def silu_mul_linear(x: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor | None = None,
                    config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Triton :func:`silu_mul_linear_ref`: where :func:`gemv_config` picks the weight-streaming kernel (one
    row), the SiLU·mul is computed as it loads its input (no intermediate tensor, one launch); otherwise the
    SiLU·mul kernel, then ``F.linear``."""
    n, k = weight.shape
    if weight.dim() != 2 or x.shape[-1] != 2 * k:
        raise ValueError(f"silu_mul_linear: x [..., 2·{k}] against weight [N, {k}] expected, got {tuple(x.shape)}")
    m = x.numel() // max(2 * k, 1)
    config = _pick(config, m, n, k, weight)
    if config is None:
        from kernels.silu_mul import silu_mul

        y = linear_ref(silu_mul(x), weight)
        return y if out is None else out.copy_(y)
    lead, x2, y = _prepare(x, k, x.dtype, out, n)
    _gemv(x2, weight, y, True, config)
    return y.view(*lead, n) if out is None else out


# --- parity ------------------------------------------------------------------------------------------

def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    p = case.params
    m, n, k = p["mnk"]
    wdtype = p.get("wdtype", case.dtype)
    x = torch.randn(m, k, generator=gen, device=device).to(case.dtype)
    w = (torch.randn(n, k, generator=gen, device=device) / k ** 0.5).to(wdtype)
    return {"x": x, "weight": w, "out_dtype": p.get("out_dtype")}


def _oracle(x, weight, out_dtype=None):
    """The product in fp32, rounded once to the output dtype (a CPU bf16 matmul rounds along the way)."""
    return F.linear(x.float(), weight.float()).to(out_dtype or x.dtype)


_GPU = ("cuda",)
SPEC = ParitySpec(
    op="linear",
    make_inputs=_inputs,
    reference=_oracle,
    kernel=lambda out, **inp: linear(**inp, out=out[0]),
    cases=[
        Case("m1 n96 k160", {"mnk": (1, 96, 160)}),
        Case("m3 n40 k64 fp32", {"mnk": (3, 40, 64)}, dtype=torch.float32),
        Case("m2 n8 k64 router", {"mnk": (2, 8, 64), "wdtype": torch.float32, "out_dtype": torch.float32}),
        Case("m20 n32 k32 cuBLAS", {"mnk": (20, 32, 32)}),
        Case("m1 q+kv 3648x2048", {"mnk": (1, 3648, 2048)}, devices=_GPU),
        Case("m8 gate/up 5632x2048", {"mnk": (8, 5632, 2048)}, devices=_GPU),
        Case("m16 down 2048x2816", {"mnk": (16, 2048, 2816)}, devices=_GPU),
        Case("m1 dense down 2048x10944", {"mnk": (1, 2048, 10944)}, devices=_GPU),
        Case("m4 router 64x2048", {"mnk": (4, 64, 2048), "wdtype": torch.float32, "out_dtype": torch.float32},
             devices=_GPU),
        Case("m1 router 64x2048", {"mnk": (1, 64, 2048), "wdtype": torch.float32, "out_dtype": torch.float32},
             devices=_GPU),
    ],
    checks=[Check("gemm_diff", 1e-5, "fp32 accumulation, one rounding to the output dtype; bf16 GEMM bound",
                  dtypes=(torch.bfloat16,)),
            Check("gemm_diff", 1e-10, "fp32 operands multiply in full fp32 (not tf32): only summation order",
                  dtypes=(torch.float32,))],
    description="decode-sized dense projection y = x Wᵀ (weight streamed through 16-row dots)",
)



def _silu_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    m, n, k = case.params["mnk"]
    x = (2 * torch.randn(m, 2 * k, generator=gen, device=device)).to(case.dtype)
    w = (torch.randn(n, k, generator=gen, device=device) / k ** 0.5).to(case.dtype)
    return {"x": x, "weight": w}


def _silu_oracle(x, weight):
    from kernels.silu_mul import silu_mul_ref

    return F.linear(silu_mul_ref(x).float(), weight.float()).to(x.dtype)


SPEC_SILU = ParitySpec(
    op="silu_mul_linear",
    make_inputs=_silu_inputs,
    reference=_silu_oracle,
    kernel=lambda out, **inp: silu_mul_linear(**inp, out=out[0]),
    cases=[
        Case("m1 n64 k96", {"mnk": (1, 64, 96)}),
        Case("m3 n40 k64 fp32", {"mnk": (3, 40, 64)}, dtype=torch.float32),
        Case("m20 n32 k32 unfused", {"mnk": (20, 32, 32)}),
        Case("m1 shared down 2048x2816", {"mnk": (1, 2048, 2816)}, devices=_GPU),
        Case("m8 dense down 2048x10944", {"mnk": (8, 2048, 10944)}, devices=_GPU),
    ],
    checks=[Check("gemm_diff", 2e-5, "the SiLU·mul intermediate may round one bf16 ulp apart (exp differs by "
                  "ulps), then an fp32-accumulated GEMM", dtypes=(torch.bfloat16,)),
            Check("gemm_diff", 1e-10, "fp32: exp and summation order only", dtypes=(torch.float32,))],
    description="SwiGLU then the down projection in one weight-streaming kernel (decode sizes)",
)
