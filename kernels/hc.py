"""Manifold-constrained hyper-connections (mHC): the pre mix (weights + Sinkhorn + collapse), the post mix,
and the hyper head that collapses the streams before the final norm.

``hc_pre`` mixes the ``n_hc`` residual streams ``x[T, N, D]``: an unweighted RMSNorm over the flattened
``N·D`` row, one small projection to ``(2+N)·N`` mixing logits, sigmoid pre/post weights, a softmax comb
matrix projected onto the doubly stochastic matrices by Sinkhorn-Knopp, and the collapse ``Σ_j pre_j x_j``.
Its kernels take two passes over x (the logits over K slices, then the collapse once the weights are known),
since every one-pass design needs programs to wait on each other. ``hc_post`` writes
``post_i · out + Σ_j comb[j, i] · x_j`` reading each stream row once. Both are memory bound and keep the ``N×N``
matrices in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import next_pow2
from kernels.arch import interpreting
from kernels.harness import Case, Check, ParitySpec


def _mix_logits(x: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    flat = x.reshape(*x.shape[:-2], -1).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    return flat @ fn.float().t()


def hc_pre_ref(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
               eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The oracle: ``x[..., N, D]`` → ``(collapsed[..., D] in x.dtype, post[..., N] fp32, comb[..., N, N] fp32)``.

    ``comb`` is row-softmaxed, then columns and rows are normalised in turn (columns first, ``iters``
    column passes in all), each with ``eps`` in the denominator as the checkpoint was trained."""
    n = x.shape[-2]
    mix = _mix_logits(x, fn, norm_eps)
    pre_w, post_w, comb_w = mix.split([n, n, n * n], dim=-1)
    b = base.float()
    s = scale.float()
    pre = torch.sigmoid(pre_w * s[0] + b[:n]) + eps
    post = 2 * torch.sigmoid(post_w * s[1] + b[n:2 * n])
    comb = torch.softmax(comb_w.view(*comb_w.shape[:-1], n, n) * s[2] + b[2 * n:].view(n, n), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    collapsed = (pre.unsqueeze(-1) * x.float()).sum(dim=-2).to(x.dtype)
    return collapsed, post, comb


def hc_post_ref(o: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """``new[..., i, :] = post_i · o + Σ_j comb[j, i] · x[..., j, :]`` for the block output ``o``, in ``x.dtype``
    (the mixing weights are cast to it first, as the model does)."""
    dt = x.dtype
    return post.to(dt).unsqueeze(-1) * o.unsqueeze(-2) + torch.matmul(comb.to(dt).transpose(-1, -2), x)


def hc_head_ref(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, eps: float,
                norm_eps: float) -> torch.Tensor:
    """The hyper head: sigmoid weights from the normalised streams, then the collapse ``Σ_j w_j x_j``."""
    mix = _mix_logits(x, fn, norm_eps)
    pre = torch.sigmoid(mix * scale.float() + base.float()) + eps
    return (pre.unsqueeze(-1) * x.float()).sum(dim=-2).to(x.dtype)


# --- Triton ------------------------------------------------------------------------------------------

@triton.jit
def _hc_weights(acc, ss, base_ptr, scale_ptr, K, iters, eps, norm_eps, N: tl.constexpr, NMIX: tl.constexpr,
                BLOCK_T: tl.constexpr):
    """Per-token mixing weights from the raw logits ``acc[BT, NMIX]`` (``x·fnᵀ``, not yet normalised) and the
    sums of squares ``ss[BT]`` over the ``K = N·D`` flattened row: ``(pre[BT, N], post[BT, N], comb[BT, N, N])``
    with ``comb`` projected by Sinkhorn-Knopp exactly as :func:`hc_pre_ref` does (columns first)."""
    G: tl.constexpr = NMIX // N  # the logits as G groups of N columns: pre, post, the N comb rows, padding
    gi = tl.arange(0, G)
    jn = tl.arange(0, N)
    n_mix = (2 + N) * N
    rstd = 1.0 / tl.sqrt_rn(ss / K + norm_eps)
    z = tl.reshape(acc * rstd[:, None], [BLOCK_T, G, N])
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)
    col = gi[:, None] * N + jn[None, :]
    b = tl.load(base_ptr + col, mask=col < n_mix, other=0.0)
    z = z * tl.where(gi == 0, s0, tl.where(gi == 1, s1, s2))[None, :, None] + b[None, :, :]
    pre = tl.sigmoid(tl.sum(tl.where(gi[None, :, None] == 0, z, 0.0), axis=1)) + eps
    post = 2.0 * tl.sigmoid(tl.sum(tl.where(gi[None, :, None] == 1, z, 0.0), axis=1))
    cl = tl.sum(tl.where(gi[None, None, :, None] == 2 + jn[None, :, None, None], z[:, None, :, :], 0.0), axis=2)
    cl = cl - tl.max(cl, axis=2)[:, :, None]
    ce = tl.exp(cl)
    comb = ce / tl.sum(ce, axis=2)[:, :, None] + eps
    comb = comb / (tl.sum(comb, axis=1)[:, None, :] + eps)
    for _ in range(iters - 1):
        comb = comb / (tl.sum(comb, axis=2)[:, :, None] + eps)
        comb = comb / (tl.sum(comb, axis=1)[:, None, :] + eps)
    return pre, post, comb


@triton.jit
def _fn_dot(xv, fn_ptr, kk, km, K, acc, N: tl.constexpr, NMIX: tl.constexpr, SPLIT3: tl.constexpr,
            PREC: tl.constexpr, PARTS: tl.constexpr = 3):
    """``acc += xv[BT, BK] · fn[:, kk]ᵀ``. With ``SPLIT3`` (bf16 ``xv``, exact in bf16) fn is split in registers
    into ``PARTS`` bf16 parts (hi + mid + lo carry fp32's 24 bits; hi + mid 16 of them, a relative error of
    2^-17 per weight), so two or three bf16 MMAs give the fp32 product; else one dot at ``PREC`` (fp32 ``xv``)."""
    mix_i = tl.arange(0, NMIX)
    w = tl.load(fn_ptr + mix_i[None, :] * K + kk[:, None], mask=(mix_i[None, :] < (2 + N) * N) & km[:, None],
                other=0.0)
    if SPLIT3:
        hi = w.to(tl.bfloat16)
        r = w - hi.to(tl.float32)
        mid = r.to(tl.bfloat16)
        lo = (r - mid.to(tl.float32)).to(tl.bfloat16)
        acc = tl.dot(xv, hi, acc)
        acc = tl.dot(xv, mid, acc)
        if PARTS > 2:
            acc = tl.dot(xv, lo, acc)
    else:
        acc = tl.dot(xv, w, acc, input_precision=PREC)
    return acc


@triton.jit
def _hc_logits_kernel(x_ptr, fn_ptr, part_ptr, T, K, K_SPLIT, N: tl.constexpr, NMIX: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT3: tl.constexpr, PREC: tl.constexpr,
                      PARTS: tl.constexpr = 3):
    """Split design, pass 1: raw logits and sums of squares of BLOCK_T tokens over one K slice (x read once,
    fully parallel); ``part[s, t, :NMIX]`` logits, ``part[s, t, NMIX]`` the sum of squares."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = t < T
    ks = tl.program_id(1)
    acc = tl.zeros([BLOCK_T, NMIX], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k0 in range(ks * K_SPLIT, ks * K_SPLIT + K_SPLIT, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        km = kk < K
        xv = tl.load(x_ptr + t[:, None] * K + kk[None, :], mask=tm[:, None] & km[None, :], other=0.0)
        xf = xv.to(tl.float32)
        ss += tl.sum(xf * xf, axis=1)
        if SPLIT3:
            acc = _fn_dot(xv, fn_ptr, kk, km, K, acc, N, NMIX, SPLIT3, PREC, PARTS)
        else:
            acc = _fn_dot(xf, fn_ptr, kk, km, K, acc, N, NMIX, SPLIT3, PREC, PARTS)
    mix_i = tl.arange(0, NMIX)
    row = part_ptr + (ks * T + t[:, None]) * (NMIX + 1)
    tl.store(row + mix_i[None, :], acc, mask=tm[:, None])
    tl.store(part_ptr + (ks * T + t) * (NMIX + 1) + NMIX, ss, mask=tm)


@triton.jit
def _hc_collapse_kernel(x_ptr, part_ptr, base_ptr, scale_ptr, col_ptr, post_ptr, comb_ptr, T, D, S, D_SPLIT, iters,
                        eps, norm_eps, N: tl.constexpr, NMIX: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK_D: tl.constexpr, REV: tl.constexpr = False):
    """Split design, pass 2: sum the K-slice partials, the weights and Sinkhorn (every D slice recomputes
    them: a few hundred flops per token), then the collapse of this D slice; slice 0 writes post and comb.
    ``REV``: token blocks in reverse launch order, so the first programs re-read the rows pass 1 loaded
    last, which are still in L2."""
    tb = tl.program_id(0)
    if REV:
        tb = tl.num_programs(0) - 1 - tb
    t = tb.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = t < T
    ds = tl.program_id(1)
    mix_i = tl.arange(0, NMIX)
    acc = tl.zeros([BLOCK_T, NMIX], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    for s in range(0, S):
        acc += tl.load(part_ptr + (s * T + t[:, None]) * (NMIX + 1) + mix_i[None, :], mask=tm[:, None], other=0.0)
        ss += tl.load(part_ptr + (s * T + t) * (NMIX + 1) + NMIX, mask=tm, other=0.0)
    pre, post, comb = _hc_weights(acc, ss, base_ptr, scale_ptr, N * D, iters, eps, norm_eps, N, NMIX, BLOCK_T)
    jn = tl.arange(0, N)
    nn = tl.arange(0, N * N)
    if ds == 0:
        tl.store(post_ptr + t[:, None] * N + jn[None, :], post, mask=tm[:, None])
        tl.store(comb_ptr + t[:, None] * (N * N) + nn[None, :], tl.reshape(comb, [BLOCK_T, N * N]), mask=tm[:, None])
    for d0 in range(ds * D_SPLIT, ds * D_SPLIT + D_SPLIT, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < D
        xv = tl.load(x_ptr + (t[:, None, None] * N + jn[None, :, None]) * D + d[None, None, :],
                     mask=tm[:, None, None] & dm[None, None, :], other=0.0).to(tl.float32)
        c = tl.sum(pre[:, :, None] * xv, axis=1)
        tl.store(col_ptr + t[:, None] * D + d[None, :], c.to(col_ptr.dtype.element_ty), mask=tm[:, None] & dm[None, :])


@triton.jit
def _hc_post_kernel(o_ptr, x_ptr, post_ptr, comb_ptr, y_ptr, D, N: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    jn = tl.arange(0, N)
    xv = tl.load(x_ptr + t * N * D + jn[:, None] * D + d[None, :], mask=dm[None, :], other=0.0)
    dt = xv.dtype
    o = tl.load(o_ptr + t * D + d, mask=dm, other=0.0)
    post = tl.load(post_ptr + t * N + jn).to(dt)
    comb = tl.load(comb_ptr + t * N * N + jn[:, None] * N + jn[None, :]).to(dt)  # [j, i]
    xf = xv.to(tl.float32)
    for i in tl.static_range(N):
        ci = tl.sum(tl.where(jn[None, :] == i, comb.to(tl.float32), 0.0), axis=1)  # comb[:, i] over j
        pi = tl.sum(tl.where(jn == i, post.to(tl.float32), 0.0), axis=0)
        y = pi * o.to(tl.float32) + tl.sum(ci[:, None] * xf, axis=0)
        tl.store(y_ptr + t * N * D + i * D + d, y.to(y_ptr.dtype.element_ty), mask=dm)


#: hc_pre launch choices: a logits pass over K slices, then a collapse pass that re-reads x (from L2 when it
#: fits). H200 8192x4x4096: bt 256 / 8 K slices / 8 warps / reversed collapse 198 us (bt 64 / 4 slices / 4
#: warps: 223 us); fn in two bf16 parts instead of three 182-185 us vs 193-196 us (1024 tokens, bt 64 by the
#: fill rule: 64 us vs 88 us). The one-pass designs, whose programs wait on each other, were dropped: a lagged
#: collapse ran 292-1715 us and a grouped design with its slab in shared memory 990-1345 us (about as slow with its
#: waits skipped); the fused and persistent ones had never beaten split either. Both passes run over chunks of
#: tokens in turn, so the collapse re-reads a chunk from L2, were slower at every chunk (8192 tokens graphed: one
#: pair 180 us; chunks of 4096 204 us, 2048 248 us, 1024 439 us): a chunk's logits grid no longer fills the GPU
#: at bt 256, and smaller token blocks re-read fn as often as x. Timed apart (graphed behind an L2 flush): the logits
#: pass 85.7 us (73.7 % of copy for x once), the collapse 96.2 us at 2 D slices (82.0 % for x and col) against
#: 101.7 us at 4; the pair 177.9 us against 181.1 us.
HC_PRE = {"bt": 256, "bt_min": 64, "bk": 64, "s": 8, "parts": 2, "bt2": 16, "ds": 2, "bd": 128, "warps": 8,
          "warps2": 4, "rev": True}


def hc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int, eps: float,
           norm_eps: float, *, out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, **tune):
    """Triton ``hc_pre`` with :func:`hc_pre_ref`'s signature and outputs (``tune`` overrides :data:`HC_PRE`)."""
    n, d = x.shape[-2], x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"hc_pre: hc_mult must be a power of two, got {n}")
    if tuple(fn.shape) != ((2 + n) * n, n * d):
        raise ValueError(f"hc_pre: fn must be [{(2 + n) * n}, {n * d}], got {tuple(fn.shape)}")
    unknown = set(tune) - set(HC_PRE)
    if unknown:
        raise ValueError(f"hc_pre: unknown launch choices {sorted(unknown)} (known: {sorted(HC_PRE)})")
    lead = x.shape[:-2]
    xc = x.contiguous().view(-1, n, d)
    t = xc.shape[0]
    col, post, comb = out if out is not None else (
        torch.empty(*lead, d, dtype=x.dtype, device=x.device),
        torch.empty(*lead, n, dtype=torch.float32, device=x.device),
        torch.empty(*lead, n, n, dtype=torch.float32, device=x.device))
    if not t:
        return col, post, comb
    fnc, bc, sc = fn.float().contiguous(), base.float().contiguous(), scale.float().contiguous()
    nmix = max(16, next_pow2((2 + n) * n))
    interp = interpreting()
    prec = "ieee" if interp else "tf32x3"
    split3 = x.dtype == torch.bfloat16 and not interp  # the interpreter's bf16 dot is wrong (Triton 3.9)
    k = n * d
    p = {**HC_PRE, **tune}
    bt, bk, bt2, bd = p["bt"], p["bk"], p["bt2"], p["bd"]
    if interp:
        bt, bk, bt2, bd = 16, 32, 16, 32
    bk = min(bk, max(16, next_pow2(k)))
    n_s = max(1, min(p["s"], triton.cdiv(k, bk)))
    k_split = triton.cdiv(triton.cdiv(k, n_s), bk) * bk
    n_s = triton.cdiv(k, k_split)
    if not interp and "bt" not in tune:  # fewer tokens: smaller blocks until the logits grid fills the GPU
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        while bt > p["bt_min"] and triton.cdiv(t, bt) * n_s < sms // 2:  # 4096 tokens keep 256 (127 vs 168 us)
            bt //= 2
    part = torch.empty(n_s, t, nmix + 1, dtype=torch.float32, device=x.device)
    _hc_logits_kernel[(triton.cdiv(t, bt), n_s)](xc, fnc, part, t, k, k_split, N=n, NMIX=nmix, BLOCK_T=bt,
                                                 BLOCK_K=bk, SPLIT3=split3, PREC=prec, PARTS=p["parts"],
                                                 num_warps=p["warps"])
    bd = min(bd, max(16, next_pow2(d)))
    n_d = max(1, min(p["ds"], triton.cdiv(d, bd)))
    d_split = triton.cdiv(triton.cdiv(d, n_d), bd) * bd
    n_d = triton.cdiv(d, d_split)
    _hc_collapse_kernel[(triton.cdiv(t, bt2), n_d)](xc, part, bc, sc, col, post, comb, t, d, n_s, d_split, iters,
                                                    eps, norm_eps, N=n, NMIX=nmix, BLOCK_T=bt2, BLOCK_D=bd,
                                                    REV=bool(p["rev"]), num_warps=p["warps2"])
    return col, post, comb


def hc_post(o: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, *,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton ``hc_post`` with :func:`hc_post_ref`'s signature."""
    n, d = x.shape[-2], x.shape[-1]
    xc = x.contiguous()
    y = out if out is not None else torch.empty_like(xc)
    t = xc.numel() // (n * d)
    block = min(next_pow2(d), 1024)
    if t:
        _hc_post_kernel[(t, triton.cdiv(d, block))](o.contiguous(), xc, post.float().contiguous(),
                                                     comb.float().contiguous(), y, d, N=n, BLOCK_D=block)
    return y


# --- parity ------------------------------------------------------------------------------------------

def _pre_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    t, n, d = case.params["shape"]
    x = torch.randn(t, n, d, generator=gen, device=device).to(case.dtype)
    fn = torch.randn((2 + n) * n, n * d, generator=gen, device=device) * (n * d) ** -0.5
    base = 0.5 * torch.randn((2 + n) * n, generator=gen, device=device)
    scale = 1 + 0.2 * torch.randn(3, generator=gen, device=device)
    return {"x": x, "fn": fn, "base": base, "scale": scale, "iters": 20, "eps": 1e-6, "norm_eps": 1e-6}


def _post_inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    t, n, d = case.params["shape"]
    pre = _pre_inputs(case, device, gen)
    _, post, comb = hc_pre_ref(**pre)
    return {"o": torch.randn(t, d, generator=gen, device=device).to(case.dtype), "x": pre["x"], "post": post,
            "comb": comb}


def _run_pre(out, **inp):
    hc_pre(**inp, out=out)


def _run_post(out, **inp):
    hc_post(**inp, out=out[0])


_SHAPES = [
    Case("3x4x64", {"shape": (3, 4, 64)}, dtype=torch.float32),
    Case("5x4x200", {"shape": (5, 4, 200)}),
    Case("2x2x96 fp32", {"shape": (2, 2, 96)}, dtype=torch.float32),
    Case("flash 128x4x4096", {"shape": (128, 4, 4096)}, devices=("cuda",)),
    Case("flash 8192x4x4096", {"shape": (8192, 4, 4096)}, devices=("cuda",)),
]
_F32 = (torch.float32,)
_B16 = (torch.bfloat16,)

SPEC_PRE = ParitySpec(
    op="hc_pre", make_inputs=_pre_inputs, reference=lambda **i: hc_pre_ref(**i), kernel=_run_pre, cases=_SHAPES,
    checks=[
        Check("allclose", 1.0, "fp32 math, D-chunked sums", opts={"atol": 1e-5, "rtol": 1e-5}, dtypes=_F32),
        Check("allclose", 1.0, "bf16 collapse of fp32 sums: two bf16 ulps", opts={"atol": 1 / 64, "rtol": 2**-7},
              dtypes=_B16),
        Check("allclose", 1.0, "post weights: fp32 sigmoid of a chunked dot product",
              opts={"atol": 1e-5, "rtol": 1e-4}, output=1, name="post"),
        Check("allclose", 1.0, "Sinkhorn in fp32, 20 iterations amplify logit rounding a little",
              opts={"atol": 1e-5, "rtol": 1e-4}, output=2, name="comb"),
    ],
    description="mHC pre mix: normalised projection, sigmoid pre/post, Sinkhorn comb, stream collapse",
)
SPEC_POST = ParitySpec(
    op="hc_post", make_inputs=_post_inputs, reference=lambda **i: hc_post_ref(**i), kernel=_run_post, cases=_SHAPES,
    checks=[
        Check("allclose", 1.0, "fp32 sums of N+1 products", opts={"atol": 1e-5, "rtol": 1e-5}, dtypes=_F32),
        Check("allclose", 1.0, "bf16 out of fp32 sums vs bf16 matmul", opts={"atol": 1 / 32, "rtol": 2**-6},
              dtypes=_B16),
    ],
    description="mHC post mix: post·out + combᵀ·streams",
)
SPEC = SPEC_PRE
