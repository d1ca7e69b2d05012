"""Rotary position embedding on INTERLEAVED pairs, with YaRN frequencies (DeepSeek-V3 layout).

Layout: the rope part of q/k is rotated as pairs ``(x[..., 2i], x[..., 2i+1])`` by angle ``pos * freq[i]``, and
the rotated pair is written back in place — DeepSeek's ``inference/model.py`` (``view_as_complex`` on adjacent
pairs). HF's ``modeling_deepseek_v3`` rotates the same pairs but returns them de-interleaved
(``[rotated evens | rotated odds]``; older remote code permuted first and then used ``rotate_half``). The two
agree exactly up to that permutation of the rope dims, which both q and k undergo, so every q·k is equal.
``rope_ref`` implements the DeepSeek (interleaved-out) form.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._launch import next_pow2
from kernels._tl import cast_rne
from kernels.arch import capability, interpreting
from kernels.harness import Case, Check, ParitySpec


def yarn_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN attention-magnitude factor ``0.1·mscale·ln(scale) + 1`` (1 when not extending)."""
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    return dim * math.log(max_pos / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_freqs(
    dim: int,
    max_pos: int,
    theta: float,
    factor: float = 1.0,
    original_max_position_embeddings: int = 4096,
    beta_fast: float = 32,
    beta_slow: float = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` tables ``[max_pos, dim/2]`` fp32 for positions ``0..max_pos-1``.

    Frequencies above ``beta_fast`` rotations over the original context are kept, those below ``beta_slow``
    are divided by ``factor``, and a linear ramp blends between (DeepSeek's ``precompute_freqs_cis`` and
    HF's yarn). The blend applies whenever ``factor != 1``, as HF does from ``rope_scaling``; DeepSeek's
    script applies it only when ``max_seq_len > original_seq_len`` — pass ``factor=1`` to get that.
    Attention magnitude (``yarn_mscale``) is applied to the softmax scale by the caller, not folded in here.
    """
    if dim % 2:
        raise ValueError(f"rope dim must be even, got {dim}")
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if factor != 1.0:
        low = max(math.floor(_correction_dim(beta_fast, dim, theta, original_max_position_embeddings)), 0)
        high = min(math.ceil(_correction_dim(beta_slow, dim, theta, original_max_position_embeddings)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float32), freqs)
    return torch.cos(angles), torch.sin(angles)


def _broadcast_table(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A ``[seq, dim/2]`` table against ``x`` of ``[..., seq, heads, dim]`` (or ``[seq, dim]``)."""
    if t.dim() == 2 and x.dim() >= 3:
        return t.view(t.shape[0], 1, t.shape[1])
    return t


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, out: torch.Tensor | None = None
             ) -> torch.Tensor:
    """Rotate interleaved pairs of ``x``'s last dim; fp32 math, output in ``x.dtype`` (copied into ``out``,
    which may be a strided slice, when given: the Triton op writes it directly).

    ``x`` is ``[..., seq, heads, dim]`` (DeepSeek's q_pe ``[b, s, h, 64]``; k_pe with ``heads=1``) or
    ``[seq, dim]``; ``cos``/``sin`` are ``[seq, dim/2]`` rows for those positions (slice the table by
    position first), or any shape already broadcastable to ``x[..., :dim/2]``.
    """
    c = _broadcast_table(cos.float(), x)
    s = _broadcast_table(sin.float(), x)
    xf = x.float()
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    y = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2).to(x.dtype)
    return y if out is None else out.copy_(y)


# --- Triton ------------------------------------------------------------------------------------------

@triton.jit
def _rope_kernel(
    x_ptr, o_ptr, cos_ptr, sin_ptr, pos_ptr,
    n_rows, n_heads, cos_rows, stride_xr, stride_xh, stride_or, stride_oh, stride_c, stride_s,
    DIM: tl.constexpr, HALF: tl.constexpr, DIM_P2: tl.constexpr, HB: tl.constexpr, BLOCK: tl.constexpr,
    HAS_POS: tl.constexpr, WRAP: tl.constexpr, EXACT: tl.constexpr,
):
    # one "vector" = one (row, head) pair of DIM contiguous values, numbered row·HB + head with HB a power
    # of two, so splitting the number is a shift and a mask; a program rotates BLOCK vectors. Rows load
    # whole (wide loads) and split into (even, odd) in registers.
    v = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row = v // HB
    head = v % HB
    live = ((row < n_rows) & (head < n_heads))[:, None]  # [BLOCK, 1]
    if HAS_POS:
        p = tl.load(pos_ptr + row, mask=row < n_rows, other=0).to(tl.int64)
    elif WRAP:
        p = (row % cos_rows).to(tl.int64)
    else:
        p = row.to(tl.int64)
    j = tl.arange(0, DIM_P2 // 2)[None, :]  # a power-of-two tile; DIM itself only needs to be even
    cmask = live & (j < HALF)
    c = tl.load(cos_ptr + p[:, None] * stride_c + j, mask=cmask, other=0.0)
    s = tl.load(sin_ptr + p[:, None] * stride_s + j, mask=cmask, other=0.0)
    d = tl.arange(0, DIM_P2)[None, :]
    xmask = live & (d < DIM)
    r64 = row.to(tl.int64)
    x = tl.load(x_ptr + (r64 * stride_xr + head * stride_xh)[:, None] + d, mask=xmask, other=0.0)
    x0, x1 = tl.split(tl.reshape(x.to(tl.float32), [BLOCK, DIM_P2 // 2, 2]))
    y = tl.reshape(tl.join(x0 * c - x1 * s, x0 * s + x1 * c), [BLOCK, DIM_P2])
    tl.store(o_ptr + (r64 * stride_or + head * stride_oh)[:, None] + d, cast_rne(y, o_ptr.dtype.element_ty, EXACT),
             mask=xmask)


def _per_row_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Tables given the way :func:`rope_ref` broadcasts them (e.g. ``cos[pos].unsqueeze(2)`` of
    ``[B, S, 1, dim/2]``) as one ``[B·S, dim/2]`` row per (batch, position); they must not vary by head."""
    lead, half = x.shape[:-2], x.shape[-1] // 2
    if cos.dim() != x.dim() or cos.shape[-2] != 1:
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} must be [rows, {half}] or broadcast as "
                         f"{(*lead, 1, half)} against x {tuple(x.shape)}")
    want = (*lead, 1, half)
    return (cos.expand(want).reshape(-1, half).float().contiguous(),
            sin.expand(want).reshape(-1, half).float().contiguous())


def _as_vectors(t: torch.Tensor, name: str, must_view: bool) -> torch.Tensor:
    """``t`` as ``[rows, heads, dim]`` with unit last-dim stride; ``[seq, dim]`` gets ``heads = 1``."""
    if t.stride(-1) != 1:
        if must_view:
            raise ValueError(f"{name} needs a unit last-dim stride for in-place RoPE, got strides {t.stride()}")
        t = t.contiguous()
    if t.dim() == 2:
        return t.unsqueeze(1)
    try:
        return t.view(-1, t.shape[-2], t.shape[-1])
    except RuntimeError:
        if must_view:
            raise ValueError(f"{name} leading dims cannot be flattened without a copy (strides {t.stride()})") from None
        return t.reshape(-1, t.shape[-2], t.shape[-1])


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, positions: torch.Tensor | None = None,
         out: torch.Tensor | None = None, inplace: bool = False, tune: dict | None = None) -> torch.Tensor:
    """Triton :func:`rope_ref`. ``x`` is ``[..., seq, heads, dim]`` or ``[seq, dim]`` and may be a strided
    slice (q_pe = ``q[..., nope:]``). Without ``positions``, row ``s`` of ``cos``/``sin`` ``[seq, dim/2]``
    serves sequence index ``s``; with ``positions`` (``x.shape[:-2]``, or ``[seq]`` for 2-D ``x``) row
    ``positions[...]`` of a full table does. ``inplace=True`` rotates ``x`` itself.
    ``tune``: ``block`` (head vectors per program), ``warps``."""
    dim = x.shape[-1]
    half = dim // 2
    per_row = cos.dim() > 2 and x.dim() >= 3 and positions is None
    if per_row:
        cos, sin = _per_row_tables(x, cos, sin)
    if dim % 2 or cos.shape[-1] != half or sin.shape != cos.shape or cos.dim() != 2:
        raise ValueError(f"cos/sin must be [rows, {half}] for rope dim {dim}, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    if inplace:
        if out is not None and out is not x:
            raise ValueError("pass either inplace=True or out=, not both")
        out = x
    elif out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    elif out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out must be {tuple(x.shape)} {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    x3 = _as_vectors(x, "x", inplace)
    o3 = _as_vectors(out, "out", True)
    rows, heads = x3.shape[0], x3.shape[1]
    seq = x.shape[0] if x.dim() == 2 else x.shape[-3]
    if per_row:
        seq = rows  # one table row per (batch, position): a table already gathered by position
    if positions is not None:
        want = tuple(x.shape[:1] if x.dim() == 2 else x.shape[:-2])
        if tuple(positions.shape) != want:
            raise ValueError(f"positions must be {want} for x {tuple(x.shape)}, got {tuple(positions.shape)}")
        positions = positions.reshape(-1).contiguous()
    elif cos.shape[0] < seq:
        raise ValueError(f"cos/sin have {cos.shape[0]} rows for a sequence of {seq}; slice the table or pass positions")
    hb = next_pow2(heads)
    n_vec = rows * hb
    if n_vec >= 2**31:
        raise ValueError(f"{rows} rows × {hb} head slots is past the kernel's 2^31 vector index; split the call")
    on_gpu = capability(x.device) is not None
    block = (tune or {}).get("block") or max(1, min(next_pow2(n_vec), (2048 if on_gpu else 16384) // next_pow2(dim)))
    _rope_kernel[(triton.cdiv(n_vec, block),)](
        x3, o3, cos, sin, positions if positions is not None else cos,
        rows, heads, seq, x3.stride(0), x3.stride(1), o3.stride(0), o3.stride(1), cos.stride(0), sin.stride(0),
        DIM=dim, HALF=half, DIM_P2=next_pow2(dim), HB=hb, BLOCK=block, HAS_POS=positions is not None, WRAP=rows > seq,
        EXACT=interpreting(),
        num_warps=(tune or {}).get("warps") or (4 if on_gpu else 1),
    )
    return out


# --- parity ------------------------------------------------------------------------------------------

def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    p = case.params
    shape = p["shape"]
    dim = shape[-1]
    nope = p.get("nope", 0)  # x is the rope slice of a wider [.., nope + dim] head, like q_pe
    full = torch.randn(*shape[:-1], nope + dim, generator=gen, device=device).to(case.dtype)
    x = full[..., nope:]
    max_pos = p.get("max_pos", shape[0] if len(shape) == 2 else shape[-3])
    cos, sin = yarn_freqs(dim, max_pos, 10000.0, p.get("factor", 40.0), 4096, 32, 1)
    inputs = {"x": x, "cos": cos.to(device), "sin": sin.to(device), "inplace": bool(p.get("inplace"))}
    if p.get("positions"):
        lead = shape[:1] if len(shape) == 2 else shape[:-2]
        inputs["positions"] = torch.randint(0, max_pos, lead, generator=gen, device=device)
    return inputs


def _reference(x, cos, sin, positions=None, inplace=False):
    if positions is not None:
        cos, sin = cos[positions], sin[positions]
        if x.dim() >= 3:
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return rope_ref(x, cos, sin)


def _run(out, x, cos, sin, positions=None, inplace=False):
    if inplace:
        out[0].copy_(x)
        rope(out[0], cos, sin, positions=positions, inplace=True)
    else:
        rope(x, cos, sin, positions=positions, out=out[0])


_GPU = ("cuda",)
SPEC = ParitySpec(
    op="rope", make_inputs=_inputs, reference=_reference, kernel=_run,
    cases=[
        Case("q_pe 2x5x4x64 of 192", {"shape": (2, 5, 4, 64), "nope": 128}),
        Case("k_pe 2x5x1x64", {"shape": (2, 5, 1, 64)}),
        Case("7x64 2-D", {"shape": (7, 64)}),
        Case("decode 3x1x16x64 positions", {"shape": (3, 1, 16, 64), "positions": True, "max_pos": 8192}),
        Case("1x9x3x64 fp32", {"shape": (1, 9, 3, 64)}, dtype=torch.float32),
        Case("1x4x2x48 in-place", {"shape": (1, 4, 2, 48), "inplace": True, "factor": 1.0}),  # not a power of two
        Case("tiny 2x3x4x8", {"shape": (2, 3, 4, 8)}),
        Case("q_pe 1x4096x128x64 of 192", {"shape": (1, 4096, 128, 64), "nope": 128}, devices=_GPU),
        Case("k_pe 1x32768x1x64", {"shape": (1, 32768, 1, 64)}, devices=_GPU),
        Case("decode 64x1x128x64 positions", {"shape": (64, 1, 128, 64), "positions": True, "max_pos": 163840},
             devices=_GPU),
        Case("q_pe 4x2048x16x64 in-place", {"shape": (4, 2048, 16, 64), "inplace": True}, devices=_GPU),
    ],
    checks=[
        Check("allclose", 1.0, "bf16 rounding of fp32 math; FMA contraction on the GPU can straddle one ulp",
              opts={"atol": 2**-10, "rtol": 2**-7}, dtypes=(torch.bfloat16,)),
        Check("allclose", 1.0, "fp32: only FMA contraction differs", opts={"atol": 1e-6, "rtol": 1e-5},
              dtypes=(torch.float32,)),
    ],
    description="interleaved-pair RoPE with YaRN tables, out of place and in place",
)
