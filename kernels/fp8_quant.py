"""Block FP8 (e4m3) activation quantisation, its inverse, and 128×128 block weight dequantisation."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import as_rows, next_pow2, out_rows
from kernels._tl import cast_rne, div_rn_by, e4m3_bits, e4m3_to_f32
from kernels.arch import capability, fp8_hw_cast, interpreting
from kernels.harness import Case, Check, ParitySpec

FP8_MAX = 448.0  # largest finite float8_e4m3fn
AMAX_FLOOR = 1e-4  # keeps an all-zero block from producing a zero scale


def _blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """View the last dim as ``[n_blocks, block]``, zero-padding a partial last block."""
    k = x.shape[-1]
    nb = -(-k // block)
    pad = nb * block - k
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], nb, block), k


def ue8m0_ref(scale: torch.Tensor) -> torch.Tensor:
    """Round fp32 scales up to a power of two, exactly (frexp, not ``exp2(ceil(log2 s))``, whose rounded
    log can land a scale just above a power of two on that power, i.e. round it down)."""
    m, e = torch.frexp(scale)
    return torch.ldexp(torch.ones_like(scale), torch.where(m == 0.5, e - 1, e))


def act_quant_ref(x: torch.Tensor, block: int = 128, ue8m0: bool = False):
    """Per-(1×block) e4m3 quantisation of the last dim: ``scale = max(amax, 1e-4) / 448`` (rounded up to a
    power of two with ``ue8m0``), ``q = x / scale``. Returns ``(q, scale)`` with ``scale`` fp32
    ``[..., ceil(K/block)]``; a partial last block takes its amax over its own elements only."""
    xb, k = _blocks(x.float(), block)
    amax = xb.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    # a tensor divisor: CUDA torch turns division by a Python scalar into a multiply by its reciprocal
    # (672/448 gives 1.5000001), so the oracle would differ between CPU and GPU
    scale = amax / torch.full_like(amax, FP8_MAX)
    if ue8m0:
        scale = ue8m0_ref(scale)
    q = (xb / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    q = q.reshape(*x.shape[:-1], -1)[..., :k].to(torch.float8_e4m3fn)
    return q, scale


def act_dequant_ref(q: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float32,
                    block: int = 128) -> torch.Tensor:
    """Inverse of :func:`act_quant_ref` (``scale`` is ``[..., ceil(K/block)]``)."""
    k = q.shape[-1]
    s = scale.float().repeat_interleave(block, dim=-1)[..., :k]
    return (q.float() * s).to(out_dtype)


def weight_dequant_ref(
    w: torch.Tensor, scale_inv: torch.Tensor, block: int = 128, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``w[N, K]`` (fp8) times its ``weight_scale_inv[ceil(N/block), ceil(K/block)]``, block by block.
    Edge blocks may be partial (shapes need not be multiples of ``block``)."""
    n, k = w.shape
    s = scale_inv.float().repeat_interleave(block, dim=0)[:n].repeat_interleave(block, dim=1)[:, :k]
    return (w.float() * s).to(out_dtype)


# --- Triton ------------------------------------------------------------------------------------------

@triton.jit
def quant_block_e4m3(x, q_ptrs, mask, UE8M0: tl.constexpr, HW_CAST: tl.constexpr):
    """Quantise a ``[G, QBLOCK]`` fp32 tile, one scale per row of the tile; stores q, returns the scales.
    Bit-exact with the reference: amax, ``amax/448`` and ``1/s`` are IEEE divides (once per block), ``x/s``
    is correctly rounded by ``div_rn_by``, and the e4m3 rounding is RNE (sm89+ ``cvt.rn.satfinite``, which
    also saturates at ±448, or the integer encoder)."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
    s = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    if UE8M0:
        b = s.to(tl.int32, bitcast=True)
        up = tl.where((b & 0x7FFFFF) != 0, 1, 0)
        s = ((((b >> 23) & 0xFF) + up) << 23).to(tl.float32, bitcast=True)
    r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    y = div_rn_by(x, s[:, None], r[:, None])
    if HW_CAST:
        tl.store(q_ptrs, y.to(tl.float8e4nv), mask=mask)
    else:
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        tl.store(q_ptrs, e4m3_bits(y).to(tl.uint8), mask=mask)
    return s


@triton.jit
def _act_quant_kernel(
    x_ptr, q_ptr, s_ptr, n_cols, n_groups, n_tiles, stride_x, stride_q, stride_s,
    QBLOCK: tl.constexpr, G: tl.constexpr, UE8M0: tl.constexpr, HW_CAST: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // n_tiles).to(tl.int64)  # tiles of one row are neighbours: the row streams in order
    g = (pid % n_tiles) * G + tl.arange(0, G)
    cols = g[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    s = quant_block_e4m3(x, q_ptr + row * stride_q + cols, mask, UE8M0, HW_CAST)
    tl.store(s_ptr + row * stride_s + g, s, mask=g < n_groups)


@triton.jit
def _act_quant_rows_kernel(
    x_ptr, q_ptr, s_ptr, n_rows, n_cols, n_groups, n_tiles, stride_x, stride_q, stride_s,
    QBLOCK: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr, UE8M0: tl.constexpr, HW_CAST: tl.constexpr,
    STREAM: tl.constexpr,
):
    """``ROWS`` rows × ``G`` blocks per program (one ``[ROWS·G, QBLOCK]`` tile); ``STREAM``: the q and scale
    stores are marked streaming (``.cs``: written once, not re-read by this kernel)."""
    pid = tl.program_id(0)
    i = tl.arange(0, ROWS * G)
    row = (pid // n_tiles) * ROWS + i // G
    g = (pid % n_tiles) * G + i % G
    cols = g[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]
    ok = (row < n_rows) & (g < n_groups)
    mask = ok[:, None] & (cols < n_cols)
    r64 = row.to(tl.int64)
    x = tl.load(x_ptr + (r64 * stride_x)[:, None] + cols, mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
    s = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    if UE8M0:
        b = s.to(tl.int32, bitcast=True)
        up = tl.where((b & 0x7FFFFF) != 0, 1, 0)
        s = ((((b >> 23) & 0xFF) + up) << 23).to(tl.float32, bitcast=True)
    r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    y = div_rn_by(x, s[:, None], r[:, None])
    q_ptrs = q_ptr + (r64 * stride_q)[:, None] + cols
    if HW_CAST:
        yq = y.to(tl.float8e4nv)
    else:
        yq = e4m3_bits(tl.minimum(tl.maximum(y, -448.0), 448.0)).to(tl.uint8)
    if STREAM:
        tl.store(q_ptrs, yq, mask=mask, cache_modifier=".cs")
        tl.store(s_ptr + r64 * stride_s + g, s, mask=ok, cache_modifier=".cs")
    else:
        tl.store(q_ptrs, yq, mask=mask)
        tl.store(s_ptr + r64 * stride_s + g, s, mask=ok)


@triton.jit
def _act_dequant_kernel(
    q_ptr, s_ptr, o_ptr, n_cols, stride_q, stride_s, stride_o,
    QBLOCK: tl.constexpr, G: tl.constexpr, HW_CAST: tl.constexpr, EXACT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * G + tl.arange(0, G)
    cols = g[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]
    mask = cols < n_cols
    q = tl.load(q_ptr + row * stride_q + cols, mask=mask)  # masked lanes: never stored
    q = q.to(tl.float32) if HW_CAST else e4m3_to_f32(q)
    s = tl.load(s_ptr + row * stride_s + g, mask=(g * QBLOCK) < n_cols, other=0.0)
    tl.store(o_ptr + row * stride_o + cols, cast_rne(q * s[:, None], o_ptr.dtype.element_ty, EXACT), mask=mask)


@triton.jit
def _weight_dequant_kernel(
    w_ptr, s_ptr, o_ptr, n_rows, n_cols, n_kb, stride_w, stride_s, stride_o,
    BLOCK: tl.constexpr, TILE_N: tl.constexpr, HW_CAST: tl.constexpr, EXACT: tl.constexpr,
):
    # 1-D grid, column blocks fastest: neighbouring programs cover neighbouring columns of the same rows,
    # so reads and writes stream whole rows; TILE_N divides BLOCK, so one scale serves the whole tile
    pid = tl.program_id(0)
    bk = pid % n_kb
    r0 = (pid // n_kb) * TILE_N
    rows = (r0 + tl.arange(0, TILE_N)).to(tl.int64)[:, None]
    cols = bk * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    w = tl.load(w_ptr + rows * stride_w + cols, mask=mask, eviction_policy="evict_first")  # masked lanes: never stored
    w = w.to(tl.float32) if HW_CAST else e4m3_to_f32(w)
    s = tl.load(s_ptr + (r0 // BLOCK) * stride_s + bk)
    tl.store(o_ptr + rows * stride_o + cols, cast_rne(w * s, o_ptr.dtype.element_ty, EXACT), mask=mask)


def _groups_per_program(n_groups: int, on_gpu: bool) -> int:
    """Blocks per program: 8 on the GPU (1024 elements), so a 7168-wide row is 7 programs with no idle lanes;
    the interpreter prefers the biggest tile. One warp per 1024 elements (32 per thread): on an H200 at
    32768×7168, 88 % of the copy ceiling against 86 % with two warps, and 90.9 % with two rows per program
    (``act_quant``'s GPU default); 16-block tiles and streaming stores were slower
    (benchmarks/results/tune_heavy_h200_2026-12-01b.txt)."""
    return min(next_pow2(n_groups), 8 if on_gpu else 256)


def act_quant(x: torch.Tensor, block: int = 128, ue8m0: bool = False, *, out=None, tune: dict | None = None):
    """Triton :func:`act_quant_ref`; ``out=(q, scale)`` to write into preallocated (e.g. poisoned) tensors.
    ``block`` must be a power of two; leading dims may be strided. ``tune``: ``groups`` (blocks per
    program), ``rows`` (rows per program), ``warps``, ``stream`` (streaming stores)."""
    if block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    k = x.shape[-1]
    nb = -(-k // block)
    q, s = out if out is not None else (None, None)
    q, q2 = out_rows(q, x.shape, torch.float8_e4m3fn, x.device, "q")
    s, s2 = out_rows(s, (*x.shape[:-1], nb), torch.float32, x.device, "scale")
    x2 = as_rows(x)
    cap = capability(x.device)
    hw = fp8_hw_cast(cap)
    tune = tune or {}
    g = tune.get("groups") or _groups_per_program(nb, cap is not None)
    # GPU: two rows per program (H200 32768×7168: 90.9 % of copy against 88.3 % for one row, same run)
    rows = tune.get("rows", 2 if cap is not None and x2.shape[0] >= 2 else 1)
    warps = tune.get("warps") or max(1, min(8, rows * g * block // 1024))
    n_tiles = triton.cdiv(nb, g)
    qv = q2 if hw else q2.view(torch.uint8)
    if rows == 1 and not tune.get("stream"):
        _act_quant_kernel[(x2.shape[0] * n_tiles,)](
            x2, qv, s2, k, nb, n_tiles, x2.stride(0), q2.stride(0), s2.stride(0),
            QBLOCK=block, G=g, UE8M0=ue8m0, HW_CAST=hw, num_warps=warps,
        )
    else:
        _act_quant_rows_kernel[(triton.cdiv(x2.shape[0], rows) * n_tiles,)](
            x2, qv, s2, x2.shape[0], k, nb, n_tiles, x2.stride(0), q2.stride(0), s2.stride(0),
            QBLOCK=block, G=g, ROWS=rows, UE8M0=ue8m0, HW_CAST=hw, STREAM=bool(tune.get("stream")),
            num_warps=warps,
        )
    return q, s


def act_dequant(q: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float32, block: int = 128,
                *, out=None):
    """Triton :func:`act_dequant_ref`."""
    k = q.shape[-1]
    nb = scale.shape[-1]
    if block & (block - 1) or scale.shape[:-1] != q.shape[:-1] or nb != -(-k // block):
        raise ValueError(f"scale {tuple(scale.shape)} does not tile q {tuple(q.shape)} in blocks of {block} "
                         f"(want {(*q.shape[:-1], -(-k // block))}, block a power of two)")
    out, o2 = out_rows(out, q.shape, out_dtype, q.device)
    q2, s2 = as_rows(q), as_rows(scale)
    cap = capability(q.device)
    hw = fp8_hw_cast(cap)
    g = _groups_per_program(nb, cap is not None)
    _act_dequant_kernel[(q2.shape[0], triton.cdiv(nb, g))](
        q2 if hw else q2.view(torch.uint8), s2, o2, k, q2.stride(0), s2.stride(0), o2.stride(0),
        QBLOCK=block, G=g, HW_CAST=hw, EXACT=interpreting(), num_warps=8 if g * block >= 4096 else 4,
    )
    return out


def weight_dequant(w: torch.Tensor, scale_inv: torch.Tensor, block: int = 128,
                   out_dtype: torch.dtype = torch.float32, *, out=None, tune: dict | None = None):
    """Triton :func:`weight_dequant_ref`: one program per ``TILE_N × block`` slice of a scale block;
    ``tune``: ``tile_n`` (a divisor of ``block``), ``warps``."""
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D, got {tuple(w.shape)}")
    n, k = w.shape
    want = (-(-n // block), -(-k // block))
    if tuple(scale_inv.shape) != want:
        raise ValueError(f"scale_inv must be {want} for weight {tuple(w.shape)} and block {block}, got {tuple(scale_inv.shape)}")
    out, _ = out_rows(out, w.shape, out_dtype, w.device)
    w2 = as_rows(w)
    cap = capability(w.device)
    on_gpu, hw = cap is not None, fp8_hw_cast(cap)
    tile_n = (tune or {}).get("tile_n") or (32 if on_gpu else block)
    if block % tile_n:
        raise ValueError(f"tile_n {tile_n} must divide block {block}")
    _weight_dequant_kernel[(triton.cdiv(n, tile_n) * want[1],)](
        w2 if hw else w2.view(torch.uint8), scale_inv, out, n, k, want[1], w2.stride(0), scale_inv.stride(0),
        out.stride(0), BLOCK=block, TILE_N=tile_n, HW_CAST=hw, EXACT=interpreting(), num_warps=(tune or {}).get("warps", 4),
    )
    return out


# --- parity ------------------------------------------------------------------------------------------

_GPU = ("cuda",)


def _act_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    p = case.params
    rows, k = p["shape"]
    pad = p.get("row_pad", 0)
    x = torch.randn(rows, k + pad, generator=gen, device=device)
    if p.get("outliers"):  # a few large values per row: most of each block sits far below its amax
        x[:, ::97] *= 300.0
    if p.get("zeros"):  # an all-zero block: the 1e-4 amax floor
        x[:, :128] = 0.0
    if p.get("edges"):  # values that land on e4m3 rounding ties and binade edges after scaling
        x[:, 1:128] = torch.tensor([124.9, 127.9, 1.0625, 0.9999, 239.9, 15.9, 3.1, -124.9, 447.9],
                                   device=device).repeat(15)[:127]
        x[:, 0] = 448.0  # amax 448: scale 1, so the values above reach the cast unchanged
    x = x.to(case.dtype)[:, :k]
    return {"x": x, "block": 128, "ue8m0": bool(p.get("ue8m0"))}


def _act_cases(ue8m0: bool) -> list[Case]:
    u = {"ue8m0": ue8m0}
    return [
        Case("1x7168", {"shape": (1, 7168), **u}),
        Case("3x300", {"shape": (3, 300), **u}),  # partial last block
        Case("4x512 zeros", {"shape": (4, 512), "zeros": True, **u}),
        Case("2x1024 outliers", {"shape": (2, 1024), "outliers": True, **u}),
        Case("2x256 edges fp32", {"shape": (2, 256), "edges": True, **u}, dtype=torch.float32),
        Case("5x384+pad", {"shape": (5, 384), "row_pad": 64, **u}),
        Case("16x2048 fp32", {"shape": (16, 2048), **u}, dtype=torch.float32),
        Case("64x7168", {"shape": (64, 7168), **u}, devices=_GPU),
        Case("4096x7168", {"shape": (4096, 7168), **u}, devices=_GPU),
        Case("16384x7168", {"shape": (16384, 7168), **u}, devices=_GPU),
        Case("4096x18432", {"shape": (4096, 18432), **u}, devices=_GPU),
        Case("8192x2000+pad", {"shape": (8192, 2000), "row_pad": 48, **u}, devices=_GPU),
    ]


_EXACT_Q = "amax, amax/448, x/s (round-to-nearest divide) and RNE to e4m3 are the reference's IEEE steps: exact"
_EXACT_S = "scale is amax/448 (or its power-of-two ceiling): one IEEE op, exact"
_QUANT_CHECKS = [
    Check("bit_exact", 0, _EXACT_Q, output=0, name="q"),
    Check("bit_exact", 0, _EXACT_S, output=1, name="scale"),
]

SPEC = ParitySpec(
    op="act_quant", make_inputs=_act_inputs, reference=act_quant_ref,
    kernel=lambda out, **inp: act_quant(**inp, out=out), cases=_act_cases(False), checks=_QUANT_CHECKS,
    description="1×128 block e4m3 activation quantisation",
)
SPEC_UE8M0 = ParitySpec(
    op="act_quant_ue8m0", make_inputs=_act_inputs, reference=act_quant_ref,
    kernel=lambda out, **inp: act_quant(**inp, out=out), cases=_act_cases(True), checks=_QUANT_CHECKS,
    description="1×128 block e4m3 quantisation with power-of-two (UE8M0) scales",
)


def _dequant_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    inp = _act_inputs(case, device, gen)
    q, s = act_quant_ref(inp["x"], 128)
    return {"q": q, "scale": s, "out_dtype": case.params.get("out_dtype", torch.float32)}


SPEC_DEQUANT = ParitySpec(
    op="act_dequant", make_inputs=_dequant_inputs, reference=act_dequant_ref,
    kernel=lambda out, **inp: act_dequant(**inp, out=out[0]),
    cases=[
        Case("3x300", {"shape": (3, 300)}),
        Case("4x512 bf16-out", {"shape": (4, 512), "out_dtype": torch.bfloat16}),
        Case("2x1024 outliers", {"shape": (2, 1024), "outliers": True}),
        Case("4096x7168", {"shape": (4096, 7168)}, devices=_GPU),
        Case("16384x7168 bf16-out", {"shape": (16384, 7168), "out_dtype": torch.bfloat16}, devices=_GPU),
    ],
    checks=[Check("bit_exact", 0, "one fp32 multiply (then one RNE cast), as in the reference: exact")],
    description="inverse of act_quant",
)


def _weight_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    n, k = case.params["shape"]
    w = (torch.randn(n, k, generator=gen, device=device) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(-(-n // 128), -(-k // 128), generator=gen, device=device) * 1e-3 + 1e-5
    return {"w": w, "scale_inv": s, "block": 128, "out_dtype": case.dtype}


SPEC_WEIGHT_DEQUANT = ParitySpec(
    op="weight_dequant", make_inputs=_weight_inputs, reference=weight_dequant_ref,
    kernel=lambda out, **inp: weight_dequant(**inp, out=out[0]),
    cases=[
        Case("256x384 fp32", {"shape": (256, 384)}, dtype=torch.float32),
        Case("130x257", {"shape": (130, 257)}),  # partial edge blocks both ways
        Case("1x128", {"shape": (1, 128)}),
        Case("7168x2112", {"shape": (7168, 2112)}, devices=_GPU),
        Case("7168x7168 fp32", {"shape": (7168, 7168)}, dtype=torch.float32, devices=_GPU),
        Case("18432x7168", {"shape": (18432, 7168)}, devices=_GPU),
        Case("1000x3000", {"shape": (1000, 3000)}, devices=_GPU),
    ],
    checks=[Check("bit_exact", 0, "one fp32 multiply per element (then one RNE cast): exact")],
    description="128×128 block weight_scale_inv dequantisation",
)
