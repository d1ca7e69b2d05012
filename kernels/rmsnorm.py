"""RMSNorm and fused residual-add + RMSNorm: fp32 math, activations in and out in their own dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import as_rows, next_pow2, out_rows
from kernels._tl import cast_rne
from kernels.arch import capability, interpreting
from kernels.harness import Case, Check, ParitySpec


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """The oracle. With ``residual``, ``h = x + residual`` is summed in fp32 and stored in ``x.dtype``;
    the norm then reads that stored ``h`` (so the fused op equals add-then-norm on what the next layer sees)
    and ``(out, h)`` is returned."""
    if residual is not None:
        h = (x.float() + residual.float()).to(x.dtype)
        return rmsnorm_ref(h, weight, eps), h
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(var + eps) * weight.float()).to(x.dtype)


@triton.jit
def _rmsnorm_kernel(
    x_ptr, r_ptr, w_ptr, o_ptr, h_ptr,
    n_rows, n_cols, stride_x, stride_r, stride_o, stride_h, eps,
    HAS_RES: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, EXACT: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    x = tl.load(x_ptr + rows * stride_x + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + rows * stride_r + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        h = cast_rne(x + r.to(tl.float32), h_ptr.dtype.element_ty, EXACT)
        tl.store(h_ptr + rows * stride_h + cols, h, mask=mask)
        x = h.to(tl.float32)
    var = tl.sum(x * x, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt_rn(var + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_last").to(tl.float32)
    y = x * rstd[:, None] * w
    tl.store(o_ptr + rows * stride_o + cols, cast_rne(y, o_ptr.dtype.element_ty, EXACT), mask=mask)


def _config(n_rows: int, n_cols: int, cap) -> tuple[int, int, int]:
    """(rows per program, block, warps): whole rows in registers; short rows batched so a program moves
    ≥ 4K elements; warps scale with the tile."""
    block = next_pow2(n_cols)
    if block > 65536:
        raise ValueError(f"rmsnorm supports rows up to 65536 elements, got {n_cols}")
    rows = 1
    while rows * block < 4096 and rows < n_rows:
        rows *= 2
    warps = 4 if rows * block <= 2048 else 8 if rows * block <= 8192 else 16
    if cap is None:
        warps = 1  # interpreter: warps only cost time
    return rows, block, warps


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
            *, out: torch.Tensor | None = None, h_out: torch.Tensor | None = None, tune: dict | None = None):
    """Triton RMSNorm over the last dim (leading dims may be strided). With ``residual`` returns
    ``(out, h)`` like :func:`rmsnorm_ref`; ``h_out=residual`` updates the residual stream in place. ``tune`` overrides the
    launch (``rows`` per program, ``warps``) for benchmarks."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must be ({x.shape[-1]},), got {tuple(weight.shape)}")
    x2 = as_rows(x)
    out, o2 = out_rows(out, x.shape, x.dtype, x.device)
    r2 = h2 = x2
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual must match x {tuple(x.shape)}, got {tuple(residual.shape)}")
        r2 = as_rows(residual)
        h_out, h2 = out_rows(h_out, x.shape, x.dtype, x.device, "h_out")
    n_rows, n_cols = x2.shape
    rows, block, warps = _config(n_rows, n_cols, capability(x.device))
    rows, warps = (tune or {}).get("rows", rows), (tune or {}).get("warps", warps)
    _rmsnorm_kernel[(triton.cdiv(n_rows, rows),)](
        x2, r2, weight, o2, h2, n_rows, n_cols,
        x2.stride(0), r2.stride(0), o2.stride(0), h2.stride(0), eps,
        HAS_RES=residual is not None, ROWS=rows, BLOCK=block, EXACT=interpreting(), num_warps=warps,
    )
    return out if residual is None else (out, h_out)


# --- the latent of MLA: RMSNorm of the first C values, RoPE of the rest, one launch -------------------------

def rmsnorm_rope_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
                     ) -> torch.Tensor:
    """``x[..., C + R]`` (kv_a's output: the latent, then the rope key) → ``[norm(x[..., :C]) | rope(x[..., C:])]``
    in ``x.dtype``, contiguous; ``cos``/``sin`` are ``[rows, R/2]``, one row per row of ``x``."""
    from kernels.rope import rope_ref

    c = weight.shape[0]
    lat = rmsnorm_ref(x[..., :c], weight, eps)
    pe = x[..., c:]
    rot = rope_ref(pe.reshape(-1, pe.shape[-1]), cos, sin).view(pe.shape)
    return torch.cat([lat, rot], dim=-1)


@triton.jit
def _rmsnorm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, o_ptr, stride_x, stride_c, stride_s, stride_o, eps,
    C: tl.constexpr, C_P2: tl.constexpr, R: tl.constexpr, EXACT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, C_P2)
    ok = cols < C
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / C + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * stride_o + cols, cast_rne(x * rstd * w, o_ptr.dtype.element_ty, EXACT), mask=ok)
    d = tl.arange(0, R)
    pe = tl.load(x_ptr + row * stride_x + C + d).to(tl.float32)
    x0, x1 = tl.split(tl.reshape(pe, [R // 2, 2]))
    j = tl.arange(0, R // 2)
    c = tl.load(cos_ptr + row * stride_c + j)
    s = tl.load(sin_ptr + row * stride_s + j)
    y = tl.reshape(tl.join(x0 * c - x1 * s, x0 * s + x1 * c), [R])
    tl.store(o_ptr + row * stride_o + C + d, cast_rne(y, o_ptr.dtype.element_ty, EXACT))


def rmsnorm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
                 ) -> torch.Tensor:
    """Triton :func:`rmsnorm_rope_ref`: one program per row (rope width a power of two; else the reference)."""
    c = weight.shape[0]
    r = x.shape[-1] - c
    if r < 2 or r & (r - 1) or cos.shape[-1] != r // 2:
        return rmsnorm_rope_ref(x, weight, eps, cos, sin)
    x2 = as_rows(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    o2 = out.view(-1, x.shape[-1])
    cs, sn = cos.float(), sin.float()
    if cs.stride(-1) != 1 or sn.stride(-1) != 1:
        cs, sn = cs.contiguous(), sn.contiguous()
    if cs.shape[0] != x2.shape[0] or sn.shape != cs.shape:
        raise ValueError(f"rmsnorm_rope: cos/sin need one row per row of x ({x2.shape[0]}), got {tuple(cs.shape)}")
    if x2.shape[0]:
        cap = capability(x.device)
        _rmsnorm_rope_kernel[(x2.shape[0],)](
            x2, weight, cs, sn, o2, x2.stride(0), cs.stride(0), sn.stride(0), o2.stride(0), eps,
            C=c, C_P2=next_pow2(c), R=r, EXACT=interpreting(), num_warps=4 if cap is not None else 1,
        )
    return out


# --- parity ------------------------------------------------------------------------------------------

def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    p = case.params
    rows, dim = p["shape"]
    pad = p.get("row_pad", 0)  # non-contiguous rows: a view into a wider buffer
    x = torch.randn(rows, dim + pad, generator=gen, device=device).mul_(p.get("scale", 1.0)).to(case.dtype)[:, :dim]
    w = (1 + 0.1 * torch.randn(dim, generator=gen, device=device)).to(p.get("wdtype", case.dtype))
    inputs = {"x": x, "weight": w, "eps": 1e-6}
    if p.get("residual"):
        inputs["residual"] = torch.randn(rows, dim, generator=gen, device=device).to(case.dtype)
    return inputs


def _run(out, **inp):
    if "residual" in inp:
        rmsnorm(**inp, out=out[0], h_out=out[1])
    else:
        rmsnorm(**inp, out=out[0])


_CPU = ("cpu", "cuda")
_GPU = ("cuda",)
_BF16_WHY = "bf16 rounding of fp32 math plus a different reduction order can straddle one bf16 ulp"


def _cases(residual: bool) -> list[Case]:
    r = {"residual": residual}
    return [
        Case("1x7168", {"shape": (1, 7168), **r}),
        Case("3x1000", {"shape": (3, 1000), **r}),  # not a power of two
        Case("5x64+pad", {"shape": (5, 64), "row_pad": 36, **r}),  # strided rows, short rows batched
        Case("2x512 fp32", {"shape": (2, 512), **r}, dtype=torch.float32),
        Case("2x512 fp16 w32", {"shape": (2, 512), "wdtype": torch.float32, **r}, dtype=torch.float16),
        Case("4x7168 x1e3", {"shape": (4, 7168), "scale": 1e3, **r}),
        Case("64x7168", {"shape": (64, 7168), **r}, devices=_GPU),
        Case("4096x7168", {"shape": (4096, 7168), **r}, devices=_GPU),
        Case("32768x7168", {"shape": (32768, 7168), **r}, devices=_GPU),
        Case("8192x1536", {"shape": (8192, 1536), **r}, devices=_GPU),  # q_lora_rank norm
        Case("8192x512+pad", {"shape": (8192, 512), "row_pad": 64, **r}, devices=_GPU),  # kv_a norm on a slice
    ]


_CHECKS = [
    Check("allclose", 1.0, _BF16_WHY, opts={"atol": 1 / 64, "rtol": 2**-7}, dtypes=(torch.bfloat16,)),
    Check("allclose", 1.0, "two fp16 ulps, as for bf16", opts={"atol": 1e-3, "rtol": 2**-9}, dtypes=(torch.float16,)),
    Check("allclose", 1.0, "fp32 math: only summation order and rsqrt differ", opts={"atol": 1e-5, "rtol": 1e-5},
          dtypes=(torch.float32,)),
]

SPEC = ParitySpec(
    op="rmsnorm", make_inputs=_inputs, reference=rmsnorm_ref, kernel=_run, cases=_cases(False), checks=_CHECKS,
    description="RMSNorm over the last dim, fp32 math",
)
SPEC_RESIDUAL = ParitySpec(
    op="rmsnorm_residual", make_inputs=_inputs, reference=rmsnorm_ref, kernel=_run, cases=_cases(True),
    checks=_CHECKS + [Check("bit_exact", 0, "h = x + residual is one fp32 add rounded once: exact", output=1, name="h")],
    description="fused residual add + RMSNorm; returns (out, h)",
)


def _rope_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    from kernels.rope import yarn_freqs

    rows, c, r = case.params["rcr"]
    x = torch.randn(rows, c + r + 8, generator=gen, device=device).to(case.dtype)[:, : c + r]  # a strided slice
    w = (1 + 0.1 * torch.randn(c, generator=gen, device=device)).to(case.dtype)
    cos, sin = yarn_freqs(r, 4096, 10000.0, 40.0, 4096, 32, 1)
    pos = torch.randint(0, 4096, (rows,), generator=gen, device=device)
    return {"x": x, "weight": w, "eps": 1e-6, "cos": cos.to(device)[pos], "sin": sin.to(device)[pos]}


SPEC_ROPE = ParitySpec(
    op="rmsnorm_rope", make_inputs=_rope_inputs, reference=rmsnorm_rope_ref,
    kernel=lambda out, **inp: out[0].copy_(rmsnorm_rope(**inp)),
    cases=[Case("3x(32+8)", {"rcr": (3, 32, 8)}), Case("2x(512+64) fp32", {"rcr": (2, 512, 64)}, dtype=torch.float32),
           Case("5x(512+64)", {"rcr": (5, 512, 64)}), Case("128x(512+64)", {"rcr": (128, 512, 64)}, devices=_GPU)],
    checks=[Check("allclose", 1.0, _BF16_WHY, opts={"atol": 1 / 64, "rtol": 2**-7}, dtypes=(torch.bfloat16,)),
            Check("allclose", 1.0, "fp32 math: summation order, rsqrt and FMA contraction",
                  opts={"atol": 1e-5, "rtol": 1e-5}, dtypes=(torch.float32,))],
    description="MLA latent: RMSNorm of the kv_lora part and interleaved RoPE of the rope key, one launch",
)
