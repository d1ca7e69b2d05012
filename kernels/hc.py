"""Manifold-constrained hyper-connections (mHC): the pre mix (weights + Sinkhorn + collapse), the post mix,
and the hyper head that collapses the streams before the final norm.

``hc_pre`` reads the ``n_hc`` residual streams ``x[T, N, D]`` once: an unweighted RMSNorm over the
flattened ``N·D`` row, one small projection to ``(2+N)·N`` mixing logits, sigmoid pre/post weights, a
softmax comb matrix projected onto the doubly stochastic matrices by Sinkhorn-Knopp, and the collapse
``Σ_j pre_j x_j``. ``hc_post`` writes ``post_i · out + Σ_j comb[j, i] · x_j``. Both are memory bound: the
kernels read each stream row once and keep the ``N×N`` matrices in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import next_pow2
from kernels.arch import capability, interpreting
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
def _hc_pre_kernel(x_ptr, fn_ptr, base_ptr, scale_ptr, col_ptr, post_ptr, comb_ptr, T, D, iters, eps, norm_eps,
                   N: tl.constexpr, NMIX: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                   PREC: tl.constexpr):
    """BLOCK_T tokens per program: the mixing logits are a skinny GEMM ``x[BT, N·D] · fnᵀ`` (fn read once per
    program), then the per-token weights and Sinkhorn, then a second pass over x for the collapse."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = t < T
    mix_i = tl.arange(0, NMIX)
    n_mix = (2 + N) * N
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc = tl.zeros([BLOCK_T, NMIX], dtype=tl.float32)
    for j in tl.static_range(N):
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            dm = d < D
            xv = tl.load(x_ptr + (t[:, None] * N + j) * D + d[None, :], mask=tm[:, None] & dm[None, :],
                         other=0.0).to(tl.float32)
            ss += tl.sum(xv * xv, axis=1)
            w = tl.load(fn_ptr + mix_i[None, :] * (N * D) + j * D + d[:, None],
                        mask=(mix_i[None, :] < n_mix) & dm[:, None], other=0.0)
            acc = tl.dot(xv, w, acc, input_precision=PREC)
    rstd = 1.0 / tl.sqrt_rn(ss / (N * D) + norm_eps)
    acc = acc * rstd[:, None]
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)
    b = tl.load(base_ptr + mix_i, mask=mix_i < n_mix, other=0.0)
    jn = tl.arange(0, N)
    pre_l = tl.sum(tl.where(mix_i[None, None, :] == jn[None, :, None], (acc * s0 + b[None, :])[:, None, :], 0.0), axis=2)
    post_l = tl.sum(tl.where(mix_i[None, None, :] == jn[None, :, None] + N, (acc * s1 + b[None, :])[:, None, :], 0.0),
                    axis=2)
    pre = tl.sigmoid(pre_l) + eps  # [BT, N]
    post = 2.0 * tl.sigmoid(post_l)
    tl.store(post_ptr + t[:, None] * N + jn[None, :], post, mask=tm[:, None])
    nn = tl.arange(0, N * N)
    cl = tl.sum(tl.where(mix_i[None, None, :] == (2 * N + nn)[None, :, None], (acc * s2 + b[None, :])[:, None, :], 0.0),
                axis=2)  # [BT, N*N], row-major (i, j)
    cl = tl.reshape(cl, [BLOCK_T, N, N])
    cl = cl - tl.max(cl, axis=2)[:, :, None]
    ce = tl.exp(cl)
    comb = ce / tl.sum(ce, axis=2)[:, :, None] + eps
    comb = comb / (tl.sum(comb, axis=1)[:, None, :] + eps)
    for _ in range(iters - 1):
        comb = comb / (tl.sum(comb, axis=2)[:, :, None] + eps)
        comb = comb / (tl.sum(comb, axis=1)[:, None, :] + eps)
    tl.store(comb_ptr + t[:, None] * (N * N) + nn[None, :], tl.reshape(comb, [BLOCK_T, N * N]), mask=tm[:, None])
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < D
        c = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for j in tl.static_range(N):
            xv = tl.load(x_ptr + (t[:, None] * N + j) * D + d[None, :], mask=tm[:, None] & dm[None, :],
                         other=0.0).to(tl.float32)
            pj = tl.sum(tl.where(jn[None, :] == j, pre, 0.0), axis=1)
            c += pj[:, None] * xv
        tl.store(col_ptr + t[:, None] * D + d[None, :], c.to(col_ptr.dtype.element_ty), mask=tm[:, None] & dm[None, :])


@triton.jit
def _hc_weights(acc, ss, base_ptr, scale_ptr, K, iters, eps, norm_eps, N: tl.constexpr, NMIX: tl.constexpr,
                BLOCK_T: tl.constexpr, ITERS: tl.constexpr = 0):
    """Per-token mixing weights from the raw logits ``acc[BT, NMIX]`` (``x·fnᵀ``, not yet normalised) and the
    sums of squares ``ss[BT]`` over the ``K = N·D`` flattened row: ``(pre[BT, N], post[BT, N], comb[BT, N, N])``
    with ``comb`` projected by Sinkhorn-Knopp exactly as :func:`hc_pre_ref` does (columns first); ``ITERS`` > 0
    unrolls the iterations (it must equal ``iters``)."""
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
    if ITERS > 0:  # unrolled (``ITERS`` = iters): no loop inside the caller's loop, which the pipeliner needs
        for _ in tl.static_range(ITERS - 1):
            comb = comb / (tl.sum(comb, axis=2)[:, :, None] + eps)
            comb = comb / (tl.sum(comb, axis=1)[:, None, :] + eps)
    else:
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
def _fence_gpu(v):
    """``fence.acq_rel.gpu`` in every thread (returns ``v``): a thread's atomics and stores are performed
    before the CTA barrier that follows, so the one thread that then signals other programs publishes them
    all (a barrier alone does not wait for another thread's outstanding writes)."""
    return tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.b32 $0, $1;", "=r,r", [v], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _hc_fused_kernel(x_ptr, fn_ptr, base_ptr, scale_ptr, col_ptr, post_ptr, comb_ptr, acc_ptr, sync_ptr, pre_ptr,
                     T, D, S, iters, eps, norm_eps, N: tl.constexpr, NMIX: tl.constexpr, BLOCK_T: tl.constexpr,
                     BLOCK_D: tl.constexpr, SPLIT3: tl.constexpr, PREC: tl.constexpr):
    """One pass over x (GPU only: programs wait on each other). Program (slice, token block) holds its
    ``x[BT, N, BLOCK_D]`` slab in registers, adds its partial logits and sums of squares into ``acc`` with
    atomics, and counts itself in; the block's last arrival computes the weights and Sinkhorn, publishes
    ``pre`` and raises the block's flag; every program then collapses the slab it holds. The slices of a
    block are consecutive program ids (slice is axis 0), so a waiting program only waits on programs that
    were dispatched before any later block's."""
    ks = tl.program_id(0)
    tb = tl.program_id(1)
    t = tb.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = t < T
    K = N * D
    r = tl.arange(0, N * BLOCK_D)
    kk = (r // BLOCK_D) * D + ks * BLOCK_D + r % BLOCK_D
    km = (ks * BLOCK_D + r % BLOCK_D) < D
    xv = tl.load(x_ptr + t[:, None] * K + kk[None, :], mask=tm[:, None] & km[None, :], other=0.0)
    xf = xv.to(tl.float32)
    ss = tl.sum(xf * xf, axis=1)
    acc = tl.zeros([BLOCK_T, NMIX], dtype=tl.float32)
    if SPLIT3:
        acc = _fn_dot(xv, fn_ptr, kk, km, K, acc, N, NMIX, SPLIT3, PREC)
    else:
        acc = _fn_dot(xf, fn_ptr, kk, km, K, acc, N, NMIX, SPLIT3, PREC)
    mix_i = tl.arange(0, NMIX)
    n_mix = (2 + N) * N
    jn = tl.arange(0, N)
    nn = tl.arange(0, N * N)
    tl.atomic_add(acc_ptr + t[:, None] * (NMIX + 1) + mix_i[None, :], acc, mask=tm[:, None] & (mix_i[None, :] < n_mix),
                  sem="relaxed")
    tl.atomic_add(acc_ptr + t * (NMIX + 1) + NMIX, ss, mask=tm, sem="relaxed")
    _fence_gpu(tm.to(tl.int32))
    tl.debug_barrier()
    n_in = tl.atomic_add(sync_ptr + 2 * tb, 1, sem="acq_rel")
    if n_in == S - 1:
        tot = tl.load(acc_ptr + t[:, None] * (NMIX + 1) + mix_i[None, :], mask=tm[:, None], other=0.0,
                      cache_modifier=".cg")
        tss = tl.load(acc_ptr + t * (NMIX + 1) + NMIX, mask=tm, other=0.0, cache_modifier=".cg")
        pre, post, comb = _hc_weights(tot, tss, base_ptr, scale_ptr, K, iters, eps, norm_eps, N, NMIX, BLOCK_T)
        tl.store(post_ptr + t[:, None] * N + jn[None, :], post, mask=tm[:, None])
        tl.store(comb_ptr + t[:, None] * (N * N) + nn[None, :], tl.reshape(comb, [BLOCK_T, N * N]), mask=tm[:, None])
        tl.store(pre_ptr + t[:, None] * N + jn[None, :], pre, mask=tm[:, None])
        _fence_gpu(tm.to(tl.int32))
        tl.debug_barrier()
        tl.atomic_xchg(sync_ptr + 2 * tb + 1, 1, sem="release")
    flag = tl.atomic_add(sync_ptr + 2 * tb + 1, 0, sem="acquire")
    while flag == 0:
        flag = tl.atomic_add(sync_ptr + 2 * tb + 1, 0, sem="acquire")
    tl.debug_barrier()
    pre = tl.load(pre_ptr + t[:, None] * N + jn[None, :], mask=tm[:, None], other=0.0, cache_modifier=".cg")
    # the slab stays live across the wait in x's own dtype (half the registers of fp32)
    c = tl.sum(tl.reshape(xv, [BLOCK_T, N, BLOCK_D]).to(tl.float32) * pre[:, :, None], axis=1)
    d = ks * BLOCK_D + tl.arange(0, BLOCK_D)
    tl.store(col_ptr + t[:, None] * D + d[None, :], c.to(col_ptr.dtype.element_ty), mask=tm[:, None] & (d < D)[None, :])


@triton.jit(do_not_specialize=["LAG"])
def _hc_lag_kernel(x_ptr, fn_ptr, base_ptr, scale_ptr, col_ptr, post_ptr, comb_ptr, acc_ptr, cnt_ptr, T, D,
                   K_SPLIT, D_SPLIT, n_blocks, LAG, iters, eps, norm_eps, N: tl.constexpr, NMIX: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, S: tl.constexpr,
                   DS: tl.constexpr, SPLIT3: tl.constexpr, PREC: tl.constexpr,
                   FENCE: tl.constexpr, BLOCK_T2: tl.constexpr = 16):
    """One HBM pass over x, the collapse re-reading x from L2. Program ids come in steps of ``S + DS``: step
    i holds the ``S`` K-slice logits programs of token block i (x slice → 3-way-split MMAs → atomics into
    ``acc`` → count in; they never wait) and then the ``DS`` D-slice collapse programs of block ``i - LAG``,
    which wait for that block's count (dispatched ``LAG`` steps after its producers, so the wait is short or
    none), compute the weights and Sinkhorn, and collapse their D slice while the block's x, loaded
    ``LAG`` blocks ago, is still in L2. A waiting program waits only on programs with smaller ids (in-order
    dispatch), and under the interpreter (programs run in id order) never waits."""
    pid = tl.program_id(0)
    step = pid // (S + DS)
    role = pid % (S + DS)
    K = N * D
    mix_i = tl.arange(0, NMIX)
    if role < S:
        tb = step
        if tb < n_blocks:
            t = tb.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
            tm = t < T
            acc = tl.zeros([BLOCK_T, NMIX], dtype=tl.float32)
            ss = tl.zeros([BLOCK_T], dtype=tl.float32)
            for k0 in range(role * K_SPLIT, role * K_SPLIT + K_SPLIT, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                km = kk < K
                xv = tl.load(x_ptr + t[:, None] * K + kk[None, :], mask=tm[:, None] & km[None, :], other=0.0,
                             eviction_policy="evict_last")
                xf = xv.to(tl.float32)
                ss += tl.sum(xf * xf, axis=1)
                if SPLIT3:
                    acc = _fn_dot(xv, fn_ptr, kk, km, K, acc, N, NMIX, SPLIT3, PREC)
                else:
                    acc = _fn_dot(xf, fn_ptr, kk, km, K, acc, N, NMIX, SPLIT3, PREC)
            tl.atomic_add(acc_ptr + t[:, None] * (NMIX + 1) + mix_i[None, :], acc,
                          mask=tm[:, None] & (mix_i[None, :] < (2 + N) * N), sem="relaxed")
            tl.atomic_add(acc_ptr + t * (NMIX + 1) + NMIX, ss, mask=tm, sem="relaxed")
            if FENCE:
                _fence_gpu(tm.to(tl.int32))
            tl.debug_barrier()
            tl.atomic_add(cnt_ptr + tb, 1, sem="release")
    else:
        tb = step - LAG
        if tb >= 0:
            n_in = tl.atomic_add(cnt_ptr + tb, 0, sem="acquire")
            while n_in < S:
                n_in = tl.atomic_add(cnt_ptr + tb, 0, sem="acquire")
            tl.debug_barrier()
            jn = tl.arange(0, N)
            ds = role - S
            for sub in range(0, BLOCK_T, BLOCK_T2):  # BLOCK_T2 tokens at a time: the Sinkhorn's registers stay few
                t = tb.to(tl.int64) * BLOCK_T + sub + tl.arange(0, BLOCK_T2)
                tm = t < T
                tot = tl.load(acc_ptr + t[:, None] * (NMIX + 1) + mix_i[None, :], mask=tm[:, None], other=0.0,
                              cache_modifier=".cg")
                tss = tl.load(acc_ptr + t * (NMIX + 1) + NMIX, mask=tm, other=0.0, cache_modifier=".cg")
                pre, post, comb = _hc_weights(tot, tss, base_ptr, scale_ptr, K, iters, eps, norm_eps, N, NMIX,
                                              BLOCK_T2)
                if ds == 0:
                    nn = tl.arange(0, N * N)
                    tl.store(post_ptr + t[:, None] * N + jn[None, :], post, mask=tm[:, None])
                    tl.store(comb_ptr + t[:, None] * (N * N) + nn[None, :], tl.reshape(comb, [BLOCK_T2, N * N]),
                             mask=tm[:, None])
                for d0 in range(ds * D_SPLIT, ds * D_SPLIT + D_SPLIT, BLOCK_D):
                    d = d0 + tl.arange(0, BLOCK_D)
                    dm = d < D
                    xv = tl.load(x_ptr + (t[:, None, None] * N + jn[None, :, None]) * D + d[None, None, :],
                                 mask=tm[:, None, None] & dm[None, None, :], other=0.0,
                                 eviction_policy="evict_first").to(tl.float32)
                    c = tl.sum(pre[:, :, None] * xv, axis=1)
                    tl.store(col_ptr + t[:, None] * D + d[None, :], c.to(col_ptr.dtype.element_ty),
                             mask=tm[:, None] & dm[None, :])


@triton.jit
def _hc_persist_kernel(x_ptr, fn_ptr, base_ptr, scale_ptr, col_ptr, post_ptr, comb_ptr, acc_ptr, sync_ptr, pre_ptr,
                       T, D, S, n_items, G, iters, eps, norm_eps, N: tl.constexpr, NMIX: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT3: tl.constexpr, PREC: tl.constexpr,
                       OVERLAP: tl.constexpr):
    """One HBM pass over x, nobody waiting on a critical path: G resident programs walk the items (token
    block, D slice) in order, item ``pid + j·G`` at step j. A step does the logits part of its item (slab
    load, MMAs, atomics into ``acc``, count-in; the block's last arrival runs the weights and Sinkhorn and
    raises the block's flag), then the collapse of the item it loaded a step earlier: by then that block is
    complete (every program did its step's logits part before waiting), and the slab is re-read from L2
    (G slabs ago). ``OVERLAP``: that re-read is issued with the step's HBM load. Needs all G programs
    resident (the host sizes G by the compiled kernel's occupancy) and a block's slices S ≤ G."""
    pid = tl.program_id(0)
    K = N * D
    r = tl.arange(0, N * BLOCK_D)
    mix_i = tl.arange(0, NMIX)
    n_mix = (2 + N) * N
    jn = tl.arange(0, N)
    nn = tl.arange(0, N * N)
    n_steps = tl.cdiv(n_items - pid, G)
    for j in range(0, n_steps + 1):
        cur = j < n_steps
        i = pid + tl.minimum(j, n_steps - 1) * G
        ks = i % S
        tb = i // S
        t = tb.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        tm = (t < T) & cur
        kk = (r // BLOCK_D) * D + ks * BLOCK_D + r % BLOCK_D
        km = (ks * BLOCK_D + r % BLOCK_D) < D
        ip = pid + tl.maximum(j - 1, 0) * G
        ks2 = ip % S
        tb2 = ip // S
        t2 = tb2.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        tm2 = (t2 < T) & (j > 0)
        d = ks2 * BLOCK_D + tl.arange(0, BLOCK_D)
        dm = d < D
        x2_ptrs = x_ptr + (t2[:, None, None] * N + jn[None, :, None]) * D + d[None, None, :]
        x2_mask = tm2[:, None, None] & dm[None, None, :]
        xv = tl.load(x_ptr + t[:, None] * K + kk[None, :], mask=tm[:, None] & km[None, :], other=0.0,
                     eviction_policy="evict_last")
        if OVERLAP:
            xv2 = tl.load(x2_ptrs, mask=x2_mask, other=0.0, eviction_policy="evict_first")
        xf = xv.to(tl.float32)
        ss = tl.sum(xf * xf, axis=1)
        acc = tl.zeros([BLOCK_T, NMIX], dtype=tl.float32)
        if SPLIT3:
            acc = _fn_dot(xv, fn_ptr, kk, km, K, acc, N, NMIX, SPLIT3, PREC)
        else:
            acc = _fn_dot(xf, fn_ptr, kk, km, K, acc, N, NMIX, SPLIT3, PREC)
        tl.atomic_add(acc_ptr + t[:, None] * (NMIX + 1) + mix_i[None, :], acc,
                      mask=tm[:, None] & (mix_i[None, :] < n_mix), sem="relaxed")
        tl.atomic_add(acc_ptr + t * (NMIX + 1) + NMIX, ss, mask=tm, sem="relaxed")
        if cur:
            _fence_gpu(tm.to(tl.int32))
            tl.debug_barrier()
            n_in = tl.atomic_add(sync_ptr + 2 * tb, 1, sem="acq_rel")
            if n_in == S - 1:
                tot = tl.load(acc_ptr + t[:, None] * (NMIX + 1) + mix_i[None, :], mask=tm[:, None], other=0.0,
                              cache_modifier=".cg")
                tss = tl.load(acc_ptr + t * (NMIX + 1) + NMIX, mask=tm, other=0.0, cache_modifier=".cg")
                pre, post, comb = _hc_weights(tot, tss, base_ptr, scale_ptr, K, iters, eps, norm_eps, N, NMIX,
                                              BLOCK_T)
                tl.store(post_ptr + t[:, None] * N + jn[None, :], post, mask=tm[:, None])
                tl.store(comb_ptr + t[:, None] * (N * N) + nn[None, :], tl.reshape(comb, [BLOCK_T, N * N]),
                         mask=tm[:, None])
                tl.store(pre_ptr + t[:, None] * N + jn[None, :], pre, mask=tm[:, None])
                _fence_gpu(tm.to(tl.int32))
                tl.debug_barrier()
                tl.atomic_xchg(sync_ptr + 2 * tb + 1, 1, sem="release")
        if j > 0:
            flag = tl.atomic_add(sync_ptr + 2 * tb2 + 1, 0, sem="acquire")
            while flag == 0:
                flag = tl.atomic_add(sync_ptr + 2 * tb2 + 1, 0, sem="acquire")
            tl.debug_barrier()
            pre2 = tl.load(pre_ptr + t2[:, None] * N + jn[None, :], mask=tm2[:, None], other=0.0, cache_modifier=".cg")
            if not OVERLAP:
                xv2 = tl.load(x2_ptrs, mask=x2_mask, other=0.0, eviction_policy="evict_first")
            c = tl.sum(xv2.to(tl.float32) * pre2[:, :, None], axis=1)
            tl.store(col_ptr + t2[:, None] * D + d[None, :], c.to(col_ptr.dtype.element_ty), mask=tm2[:, None] & dm[None, :])


@triton.jit
def _grp_wait(cnt_ptr, err_ptr, tb, budget, P: tl.constexpr):
    """Poll the block's count until all ``P`` members are in (``budget`` polls left in all; a program out of
    budget raises ``err`` and goes on, so a wrong launch gives wrong numbers, never a hang)."""
    c = tl.atomic_add(cnt_ptr + tb, 0, sem="acquire")
    while (c < P) & (budget > 0):
        c = tl.atomic_add(cnt_ptr + tb, 0, sem="acquire")
        budget -= 1
    if c < P:
        tl.atomic_xchg(err_ptr, 1)
    tl.debug_barrier()
    return budget


@triton.jit
def _spin_one(ptr, target, polls, sleep_ns, after):
    """Thread 0 polls the scalar ``*ptr`` (``ld.acquire.gpu``, ``nanosleep`` of ``sleep_ns`` between polls)
    until it reaches ``target`` or ``polls`` polls have passed; then a CTA barrier releases every thread.
    One poller per program and a pause keep the line the others are counting into free; a PTX loop, so the
    caller's loop has no inner loop (for the software pipeliner). ``after`` (unused by the PTX) is a data
    dependency: the pipeliner orders side effects only by data, so the wait is issued after the op that made
    ``after`` (the count-in). Returns thread 0's last value (``target`` in the other threads)."""
    return tl.inline_asm_elementwise(
        """{
        .reg .pred %p;
        .reg .u32 %n, %t;
        mov.u32 $0, $2;
        mov.u32 %t, %tid.x;
        setp.ne.u32 %p, %t, 0;
        @%p bra LAB_DONE;
        mov.u32 %n, 0;
        LAB_WAIT:
        ld.acquire.gpu.global.u32 $0, [$1];
        setp.ge.s32 %p, $0, $2;
        @%p bra LAB_DONE;
        nanosleep.u32 $4;
        add.u32 %n, %n, 1;
        setp.lt.s32 %p, %n, $3;
        @%p bra LAB_WAIT;
        LAB_DONE:
        bar.sync 0;
        }
        // after: $5""", "=r,l,r,r,r,r", [ptr, target, polls, sleep_ns, after], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _bar_ptx(v, FENCE: tl.constexpr):
    """A CTA barrier (``fence.acq_rel.gpu`` first in every thread with ``FENCE``) as inline PTX on the scalar
    ``v`` (returned): unlike ``tl.debug_barrier`` it leaves the loop to the software pipeliner."""
    if FENCE:
        return tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tbar.sync 0;\n\tmov.b32 $0, $1;", "=r,r", [v],
                                         dtype=tl.int32, is_pure=False, pack=1)
    else:
        return tl.inline_asm_elementwise("bar.sync 0;\n\tmov.b32 $0, $1;", "=r,r", [v], dtype=tl.int32,
                                         is_pure=False, pack=1)


@triton.jit
def _ld_cg(ptrs, after):
    """``ld.global.cg`` of fp32 words as inline PTX, after the op that made ``after`` (a data dependency,
    unused by the PTX: the wait's result): a load the software pipeliner neither pipelines nor moves ahead
    of the wait."""
    return tl.inline_asm_elementwise("ld.global.cg.b32 $0, [$1]; // after: $2", "=r,l,r", [ptrs, after],
                                     dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def _stamp(ptr, after):
    """Store ``%globaltimer`` (ns) at ``ptr``, read once ``after`` is computed (a diagnostic)."""
    ts = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [after.to(tl.float32).to(tl.int32,
                                   bitcast=True)], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(ptr, ts)


@triton.jit(do_not_specialize=["T", "n_tb", "SPIN"])
def _hc_groupp_kernel(x_ptr, fn_ptr, base_ptr, scale_ptr, col_ptr, post_ptr, comb_ptr, acc_ptr, cnt_ptr, err_ptr,
                      T, D, n_tb, iters, eps, norm_eps, SPIN, flag_ptr, pre_ptr, N: tl.constexpr, NMIX: tl.constexpr,
                      BLOCK_T: tl.constexpr, DW: tl.constexpr, P: tl.constexpr, STAGES: tl.constexpr,
                      ITERS: tl.constexpr, GPU: tl.constexpr, FENCE: tl.constexpr, LEADER: tl.constexpr,
                      LAG: tl.constexpr = 0, times_ptr=None, TIMES: tl.constexpr = False, SLEEP=0,
                      XSTORE: tl.constexpr = False):
    """One HBM pass over x by groups of ``P`` co-resident programs (the host launches no more programs than
    fit at once, so a program only waits on programs that are running). Member ``m`` of a group owns the
    columns ``[m·DW, (m+1)·DW)`` of all ``N`` streams. Its slab of a token block is loaded transposed,
    ``xᵀ[N·DW, BT]``, as the MMA's B operand; fn's matching columns are split once into bf16 hi and lo parts
    (16 mantissa bits; x is exactly bf16, so the products are exact) stacked as one ``[2·NMIX, N·DW]`` A
    operand: one MMA of M = 2·NMIX per step. The group walks its token blocks ``g, g + groups, …``; a step
    adds the slab's partial logits and sums of squares into ``acc`` with atomics, counts in, and once the
    block is complete collapses the member's columns from the slab still in shared memory: x is read once.
    The loop is one the software pipeliner takes (the waits are PTX loops, the Sinkhorn is unrolled to
    ``ITERS``, the barrier and the loads after a wait are PTX), so the slabs of the next ``STAGES - 1``
    blocks stream in while a step exchanges, waits and collapses. ``LEADER``: the block's last member to
    count in (the count's old value says which) alone runs the weights and Sinkhorn, writes ``pre`` (and
    post, comb) and raises the block's flag, which the others wait for; ``LAG`` 1 collapses the block of
    the step before (the leader's work off the others' path; its slab is kept in registers); ``XSTORE``: the
    members store their partials to rows of their own (``acc[P, T, NMIX+1]``) and the leader sums them,
    instead of atomics into one row per token. Else every
    member waits for the count and runs them for the whole block. ``GPU`` False (the interpreter): the waits
    are Triton loops and the dot is fp32. The waits poll at most ``SPIN`` times (``err`` is raised instead
    of hanging). ``TIMES`` (a diagnostic): ``%globaltimer`` at the start of each step, after counting in,
    after the wait and at the end, into ``times[pid, step, 4]`` (``[programs, n_tb, 4]`` int64)."""
    pid = tl.program_id(0)
    n_groups = tl.num_programs(0) // P
    g = pid // P
    m = pid % P
    K = N * D
    n_mix = (2 + N) * N
    r = tl.arange(0, N * DW)  # slab row: stream r // DW, column m·DW + r % DW
    dcol = m * DW + r % DW
    km = dcol < D
    kk = (r // DW) * D + dcol
    mix_i = tl.arange(0, NMIX)
    jn = tl.arange(0, N)
    w = tl.load(fn_ptr + mix_i[:, None] * K + kk[None, :], mask=(mix_i[:, None] < n_mix) & km[None, :], other=0.0)
    hi = w.to(tl.bfloat16)
    lo = (w - hi.to(tl.float32)).to(tl.bfloat16)
    wa = tl.reshape(tl.permute(tl.join(hi, lo), (2, 0, 1)), [2 * NMIX, N * DW])  # hi rows, then lo rows
    tt = tl.arange(0, BLOCK_T)
    n_steps = tl.cdiv(n_tb - g, n_groups)
    budget = SPIN
    xprev = tl.zeros([N * DW, BLOCK_T], dtype=x_ptr.dtype.element_ty)
    for j in tl.range(0, n_steps + LAG, num_stages=STAGES):
        if TIMES:
            _stamp(times_ptr + (pid * n_tb + j) * 4, j)
        tb = g + j * n_groups
        t = tb.to(tl.int64) * BLOCK_T + tt
        tm = t < T  # past the last block (j = n_steps with LAG) every row is masked
        xt = tl.load(x_ptr + t[None, :] * K + kk[:, None], mask=km[:, None] & tm[None, :], other=0.0)
        if GPU:
            a2 = tl.dot(wa, xt)  # [2·NMIX, BT]
        else:
            a2 = tl.dot(wa.to(tl.float32), xt.to(tl.float32), input_precision="ieee")
        lt = tl.sum(tl.reshape(a2, [2, NMIX, BLOCK_T]), axis=0)  # hi + lo products: [NMIX, BT]
        ss = tl.sum(xt.to(tl.float32) * xt.to(tl.float32), axis=0)
        if XSTORE:  # this member's partials to its own rows: plain stores, the leader sums them
            tl.store(acc_ptr + (m * T + t[None, :]) * (NMIX + 1) + mix_i[:, None], lt, mask=tm[None, :])
            tl.store(acc_ptr + (m * T + t) * (NMIX + 1) + NMIX, ss, mask=tm)
        else:
            tl.atomic_add(acc_ptr + t[None, :] * (NMIX + 1) + mix_i[:, None], lt,
                          mask=tm[None, :] & (mix_i[:, None] < n_mix), sem="relaxed")
            tl.atomic_add(acc_ptr + t * (NMIX + 1) + NMIX, ss, mask=tm, sem="relaxed")
        if GPU:
            tb = _bar_ptx(tb, FENCE)
        else:
            tl.debug_barrier()
        if TIMES:
            _stamp(times_ptr + (pid * n_tb + j) * 4 + 1, j)
        if LEADER:
            tok = tb
            if j < n_steps:
                tok = _gp_lead(acc_ptr, cnt_ptr, flag_ptr, base_ptr, scale_ptr, post_ptr, comb_ptr, pre_ptr, t, tm, tb,
                               K, T, iters, eps, norm_eps, N, NMIX, BLOCK_T, P, ITERS, GPU, XSTORE)
            tbc = tb - LAG * n_groups
            tc = tbc.to(tl.int64) * BLOCK_T + tt
            tcm = tc < T
            if LAG == 0:
                xc = xt
            else:
                xc = xprev
            if j >= LAG:
                if GPU:
                    c = _spin_one(flag_ptr + tbc * 32, 1, SPIN, SLEEP, tok)
                    tl.atomic_xchg(err_ptr, 1, mask=c < 1)
                    tr = tl.where(tcm, tc, 0)  # masked rows read row 0 (in bounds), then are dropped
                    pre = tl.where(tcm[:, None], _ld_cg(pre_ptr + tr[:, None] * N + jn[None, :], c), 0.0)
                else:
                    budget = _grp_wait(flag_ptr, err_ptr, tbc * 32, budget, 1)
                    pre = tl.load(pre_ptr + tc[:, None] * N + jn[None, :], mask=tcm[:, None], other=0.0)
                if TIMES:
                    _stamp(times_ptr + (pid * n_tb + j) * 4 + 2, tl.sum(pre))
                _gp_collapse(xc, pre, col_ptr, tc, tcm, m, D, N, BLOCK_T, DW)
        else:
            pre = _grp_pre(acc_ptr, cnt_ptr, err_ptr, base_ptr, scale_ptr, post_ptr, comb_ptr, t, tm, tb, m, K, iters,
                           eps, norm_eps, SPIN, SLEEP, N, NMIX, BLOCK_T, P, ITERS, GPU)
            if TIMES:
                _stamp(times_ptr + (pid * n_tb + j) * 4 + 2, tl.sum(pre))
            _gp_collapse(xt, pre, col_ptr, t, tm, m, D, N, BLOCK_T, DW)
        if TIMES:
            _stamp(times_ptr + (pid * n_tb + j) * 4 + 3, j)
        xprev = xt


@triton.jit
def _gp_collapse(xt, pre, col_ptr, t, tm, m, D, N: tl.constexpr, BLOCK_T: tl.constexpr, DW: tl.constexpr):
    """This member's columns of the collapse of one block from its transposed slab ``xt[N·DW, BT]``."""
    x3 = tl.reshape(xt, [N, DW, BLOCK_T]).to(tl.float32)
    cv = tl.sum(x3 * tl.trans(pre)[:, None, :], axis=0)  # [DW, BT]
    d = m * DW + tl.arange(0, DW)
    tl.store(col_ptr + t[None, :] * D + d[:, None], cv.to(col_ptr.dtype.element_ty), mask=(d < D)[:, None] & tm[None, :])


@triton.jit
def _gp_lead(acc_ptr, cnt_ptr, flag_ptr, base_ptr, scale_ptr, post_ptr, comb_ptr, pre_ptr, t, tm, tb, K, T, iters,
             eps, norm_eps, N: tl.constexpr, NMIX: tl.constexpr, BLOCK_T: tl.constexpr, P: tl.constexpr,
             ITERS: tl.constexpr, GPU: tl.constexpr, XSTORE: tl.constexpr):
    """Count in; the block's last member to do so runs the weights and Sinkhorn, writes post, comb and
    ``pre`` and raises the block's flag. Returns a token made after all that (for the wait's data
    dependency)."""
    mix_i = tl.arange(0, NMIX)
    jn = tl.arange(0, N)
    nn = tl.arange(0, N * N)
    old = tl.atomic_add(cnt_ptr + tb * 32, 1, sem="acq_rel")
    tok = old
    if old == P - 1:
        tr = tl.where(tm, t, 0)  # masked rows read row 0 (in bounds), then are dropped
        if XSTORE:  # sum the members' partial rows
            tot = tl.zeros([BLOCK_T, NMIX], dtype=tl.float32)
            tss = tl.zeros([BLOCK_T], dtype=tl.float32)
            for mm in tl.static_range(P):
                if GPU:
                    tot += _ld_cg(acc_ptr + (mm * T + tr[:, None]) * (NMIX + 1) + mix_i[None, :], old)
                    tss += _ld_cg(acc_ptr + (mm * T + tr) * (NMIX + 1) + NMIX, old)
                else:
                    tot += tl.load(acc_ptr + (mm * T + tr[:, None]) * (NMIX + 1) + mix_i[None, :])
                    tss += tl.load(acc_ptr + (mm * T + tr) * (NMIX + 1) + NMIX)
            tot = tl.where(tm[:, None] & (mix_i[None, :] < (2 + N) * N), tot, 0.0)
            tss = tl.where(tm, tss, 0.0)
        elif GPU:
            tot = tl.where(tm[:, None], _ld_cg(acc_ptr + tr[:, None] * (NMIX + 1) + mix_i[None, :], old), 0.0)
            tss = tl.where(tm, _ld_cg(acc_ptr + tr * (NMIX + 1) + NMIX, old), 0.0)
        else:
            tot = tl.load(acc_ptr + t[:, None] * (NMIX + 1) + mix_i[None, :], mask=tm[:, None], other=0.0)
            tss = tl.load(acc_ptr + t * (NMIX + 1) + NMIX, mask=tm, other=0.0)
        pre, post, comb = _hc_weights(tot, tss, base_ptr, scale_ptr, K, iters, eps, norm_eps, N, NMIX, BLOCK_T, ITERS)
        tl.store(post_ptr + t[:, None] * N + jn[None, :], post, mask=tm[:, None])
        tl.store(comb_ptr + t[:, None] * (N * N) + nn[None, :], tl.reshape(comb, [BLOCK_T, N * N]), mask=tm[:, None])
        tl.store(pre_ptr + t[:, None] * N + jn[None, :], pre, mask=tm[:, None])
        if GPU:
            tok = _bar_ptx(tb, True)  # tok = tb, after the stores
        else:
            tl.debug_barrier()
            tok = tb
        tl.atomic_xchg(flag_ptr + tok * 32, 1, sem="release")
    return tok


@triton.jit
def _grp_pre(acc_ptr, cnt_ptr, err_ptr, base_ptr, scale_ptr, post_ptr, comb_ptr, t, tm, tb, m, K, iters, eps, norm_eps,
             SPIN, SLEEP, N: tl.constexpr, NMIX: tl.constexpr, BLOCK_T: tl.constexpr, P: tl.constexpr, ITERS: tl.constexpr,
             GPU: tl.constexpr):
    """Every member: count in, wait for the block's count, and run the weights and Sinkhorn for the whole block
    (member 0 writes post and comb); returns ``pre``."""
    mix_i = tl.arange(0, NMIX)
    jn = tl.arange(0, N)
    nn = tl.arange(0, N * N)
    old = tl.atomic_add(cnt_ptr + tb * 32, 1, sem="release")
    if GPU:
        c = _spin_one(cnt_ptr + tb * 32, P, SPIN, SLEEP, old)
        tl.atomic_xchg(err_ptr, 1, mask=c < P)
        tr = tl.where(tm, t, 0)  # masked rows read row 0 (in bounds), then are dropped
        tot = tl.where(tm[:, None], _ld_cg(acc_ptr + tr[:, None] * (NMIX + 1) + mix_i[None, :], c), 0.0)
        tss = tl.where(tm, _ld_cg(acc_ptr + tr * (NMIX + 1) + NMIX, c), 0.0)
    else:
        _grp_wait(cnt_ptr, err_ptr, tb * 32, SPIN, P)
        tot = tl.load(acc_ptr + t[:, None] * (NMIX + 1) + mix_i[None, :], mask=tm[:, None], other=0.0,
                      cache_modifier=".cg")
        tss = tl.load(acc_ptr + t * (NMIX + 1) + NMIX, mask=tm, other=0.0, cache_modifier=".cg")
    pre, post, comb = _hc_weights(tot, tss, base_ptr, scale_ptr, K, iters, eps, norm_eps, N, NMIX, BLOCK_T, ITERS)
    if m == 0:
        tl.store(post_ptr + t[:, None] * N + jn[None, :], post, mask=tm[:, None])
        tl.store(comb_ptr + t[:, None] * (N * N) + nn[None, :], tl.reshape(comb, [BLOCK_T, N * N]), mask=tm[:, None])
    return pre


#: the group kernel's timeout flag of its last launch (non-zero: a program gave up waiting; results are wrong)
GROUP_ERR: list[torch.Tensor | None] = [None]

_OCCUPANCY: dict[tuple, int] = {}


def _resident_programs(kernel, args: tuple, kw: dict, device: torch.device) -> int:
    """How many programs of ``kernel`` (compiled for ``kw``) fit on the GPU at once: SMs × blocks per SM by
    registers, shared memory and warps (cached per configuration)."""
    key = (kernel.fn.__name__ if hasattr(kernel, "fn") else id(kernel), device.index,
           tuple(sorted((k, v) for k, v in kw.items())))
    if key not in _OCCUPANCY:
        props = torch.cuda.get_device_properties(device)
        warps = kw["num_warps"]
        try:
            compiled = kernel.warmup(*args, grid=(1,), **kw)
            if getattr(compiled, "n_regs", None) is None:
                compiled._init_handles()
            regs = -(-int(compiled.n_regs) * 32 // 256) * 256 * warps  # per-warp allocation granularity 256
            smem = max(1, int(compiled.metadata.shared))
            per_sm = min(getattr(props, "regs_per_multiprocessor", 65536) // max(regs, 1),
                         getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps),
                         getattr(props, "shared_memory_per_multiprocessor", 233472) // smem, 32)
        except Exception:  # no occupancy data: one program per SM always fits
            per_sm = 1
        _OCCUPANCY[key] = max(1, per_sm) * props.multi_processor_count
    return _OCCUPANCY[key]


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


#: hc_pre launch choices; the benchmark round picks them (``variant``: groupp | lag | fused | persist | split | v1 |
#: auto). H200 8192x4x4096: split bt 256 / 8 K slices / 8 warps / reversed collapse 198 us (bt 64 / 4 slices / 4
#: warps: 223 us), with fn in two bf16 parts instead of three 182-185 us vs 193-196 us (1024 tokens, bt 64 by the
#: fill rule: 64 us vs 88 us); lag 292-1715 us; groupp 990-1345 us (about as slow with its waits skipped)
HC_PRE = {"variant": "split", "split": {"bt": 256, "bt_min": 64, "bk": 64, "s": 8, "parts": 2, "bt2": 16, "ds": 4,
                                        "bd": 128, "warps": 8, "warps2": 4, "rev": True},
          "lag": {"bt": 64, "bk": 64, "s": 16, "ds": 16, "bd": 64, "bt2": 16, "lag": 12, "warps": 4},
          "groupp": {"bt": 32, "dw": 128, "stages": 3, "fence": True, "leader": False, "lag": 1, "sleep": 32,
                     "xstore": False, "warps": 8, "per_sm": 1},
          "fused": {"bt": 64, "bd": 64, "warps": 8}, "persist": {"bt": 64, "bd": 64, "warps": 8, "per_sm": 2,
                                                                          "overlap": True}}


#: ``variant="auto"``: the one-pass design and where it runs. Its programs wait on each other (all resident
#: at once: the host sizes the grid by occupancy) and it holds fn's parts and slabs in ~160 KB of shared
#: memory, which sm90 (H100/H200: 227 KB per block) has and sm120 (~100 KB) has not; below ``min_tokens`` a
#: group has too few blocks to stream.
HC_PRE_AUTO = {"one_pass": "groupp", "caps": ((9, 0),), "min_tokens": 256}


def hc_pre_variant(cap: tuple[int, int] | None, dtype: torch.dtype = torch.bfloat16, tokens: int | None = None) -> str:
    """Which hc_pre design runs. The interpreter (``cap`` None) runs programs one after another, so the
    designs whose programs wait on each other fall back to the two-pass ``split`` design, which runs
    everywhere. ``auto``: the one-pass design of :data:`HC_PRE_AUTO` for bf16 streams on the capabilities it
    is built for and at least ``min_tokens`` tokens, else ``split``."""
    v = HC_PRE["variant"]
    if v == "auto":
        one = HC_PRE_AUTO["one_pass"]
        fits = cap in HC_PRE_AUTO["caps"] and dtype == torch.bfloat16
        return one if fits and (tokens is None or tokens >= HC_PRE_AUTO["min_tokens"]) else "split"
    return "split" if cap is None and v in ("fused", "persist", "groupp") else v


def hc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int, eps: float,
           norm_eps: float, *, out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
           variant: str | None = None, **tune):
    """Triton ``hc_pre`` with :func:`hc_pre_ref`'s signature and outputs (``variant``/``tune``: see
    :data:`HC_PRE`)."""
    n, d = x.shape[-2], x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"hc_pre: hc_mult must be a power of two, got {n}")
    if tuple(fn.shape) != ((2 + n) * n, n * d):
        raise ValueError(f"hc_pre: fn must be [{(2 + n) * n}, {n * d}], got {tuple(fn.shape)}")
    lead = x.shape[:-2]
    xc = x.contiguous().view(-1, n, d)
    t = xc.shape[0]
    col, post, comb = out if out is not None else (
        torch.empty(*lead, d, dtype=x.dtype, device=x.device),
        torch.empty(*lead, n, dtype=torch.float32, device=x.device),
        torch.empty(*lead, n, n, dtype=torch.float32, device=x.device))
    if not t:
        return col, post, comb
    v = variant or hc_pre_variant(capability(x.device), x.dtype, t)
    fnc, bc, sc = fn.float().contiguous(), base.float().contiguous(), scale.float().contiguous()
    nmix = max(16, next_pow2((2 + n) * n))
    interp = interpreting()
    prec = "ieee" if interp else "tf32x3"
    split3 = x.dtype == torch.bfloat16 and not interp  # the interpreter's bf16 dot is wrong (Triton 3.9)
    k = n * d
    if v == "v1":
        bt = 16 if interp else 32
        _hc_pre_kernel[(triton.cdiv(t, bt),)](xc, fnc, bc, sc, col, post, comb, t, d, iters, eps, norm_eps,
                                              N=n, NMIX=nmix, BLOCK_T=bt, BLOCK_D=max(16, min(next_pow2(d), 64)),
                                              PREC=prec, num_warps=4)
    elif v == "split":
        p = {**HC_PRE["split"], **tune}
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
                                                     BLOCK_K=bk, SPLIT3=split3, PREC=prec, PARTS=p.get("parts", 3),
                                                     num_warps=p["warps"])
        bd = min(bd, max(16, next_pow2(d)))
        n_d = max(1, min(p["ds"], triton.cdiv(d, bd)))
        d_split = triton.cdiv(triton.cdiv(d, n_d), bd) * bd
        n_d = triton.cdiv(d, d_split)
        _hc_collapse_kernel[(triton.cdiv(t, bt2), n_d)](xc, part, bc, sc, col, post, comb, t, d, n_s, d_split, iters,
                                                        eps, norm_eps, N=n, NMIX=nmix, BLOCK_T=bt2, BLOCK_D=bd,
                                                        REV=bool(p["rev"]), num_warps=p["warps2"])
    elif v == "lag":
        p = {**HC_PRE["lag"], **tune}
        bt, bk, bd = p["bt"], min(p["bk"], max(16, next_pow2(k))), min(p["bd"], max(16, next_pow2(d)))
        bt2 = min(p["bt2"], bt)
        if interp:
            bt, bk, bd, bt2 = 16, 32, 32, 8
        n_s = max(1, min(p["s"], triton.cdiv(k, bk)))
        k_split = triton.cdiv(triton.cdiv(k, n_s), bk) * bk
        n_s = triton.cdiv(k, k_split)
        n_d = max(1, min(p["ds"], triton.cdiv(d, bd)))
        d_split = triton.cdiv(triton.cdiv(d, n_d), bd) * bd
        n_d = triton.cdiv(d, d_split)
        n_tb = triton.cdiv(t, bt)
        lag = max(0, min(p["lag"], n_tb - 1))  # no trailing steps of idle programs for a short T
        scratch = torch.zeros(t * (nmix + 1) + n_tb, dtype=torch.float32, device=x.device)
        _hc_lag_kernel[((n_tb + lag) * (n_s + n_d),)](
            xc, fnc, bc, sc, col, post, comb, scratch[:t * (nmix + 1)], scratch[t * (nmix + 1):].view(torch.int32),
            t, d, k_split, d_split, n_tb, lag, iters, eps, norm_eps, N=n, NMIX=nmix, BLOCK_T=bt, BLOCK_K=bk,
            BLOCK_D=bd, S=n_s, DS=n_d, SPLIT3=split3, PREC=prec, FENCE=not interp, BLOCK_T2=bt2, num_warps=p["warps"])
    elif v == "groupp":
        if not interp and x.dtype != torch.bfloat16:
            raise ValueError("hc_pre: the groupp variant takes bf16 streams (its MMA operands are bf16)")
        p = {**HC_PRE["groupp"], **tune}
        bt, dw = p["bt"], min(p["dw"], max(16, next_pow2(d)))
        if interp:  # one program per group: programs run one after another
            bt, dw = 16, max(16, next_pow2(d))
        n_p, n_tb = triton.cdiv(d, dw), triton.cdiv(t, bt)
        # counters and flags 128 bytes apart (32 words): a block's pollers never share a line with another's
        if p["leader"] and not p["lag"] and not interp:
            # the pipeliner interleaves the count-in, the leader's sums and the wait of consecutive blocks so
            # that a leader can read a block before every member's partials are in (wrong on the H200)
            raise ValueError("hc_pre: groupp's leader mode needs lag 1 on a GPU")
        xstore = bool(p["leader"]) and bool(p["xstore"])
        n_acc = (n_p if xstore else 1) * t * (nmix + 1)
        scratch = torch.zeros(n_acc + 64 * n_tb + 1, dtype=torch.float32, device=x.device)
        sync = scratch[n_acc:].view(torch.int32)
        pre_w = torch.empty(t, n, dtype=torch.float32, device=x.device)
        pkw = dict(N=n, NMIX=nmix, BLOCK_T=bt, DW=dw, P=n_p, STAGES=p["stages"], ITERS=iters, GPU=not interp,
                   FENCE=bool(p["fence"]), LEADER=bool(p["leader"]), LAG=int(p["lag"]) if p["leader"] else 0,
                   num_warps=p["warps"])
        pargs = (xc, fnc, bc, sc, col, post, comb, scratch[:n_acc], sync[:32 * n_tb], sync[64 * n_tb:], t, d,
                 n_tb, iters, eps, norm_eps, p.get("spin", 1 << 16), sync[32 * n_tb:64 * n_tb], pre_w)
        resident = p.get("groups", 2) if interp else min(
            _resident_programs(_hc_groupp_kernel, pargs, pkw, x.device),
            p["per_sm"] * torch.cuda.get_device_properties(x.device).multi_processor_count)
        if n_p > resident:
            raise ValueError(f"hc_pre: a group of {n_p} programs exceeds the {resident} resident ones; raise dw")
        if p.get("times") is not None:  # diagnostic: [programs, steps, 4] int64 timestamps
            pkw.update(times_ptr=p["times"], TIMES=True)
        _hc_groupp_kernel[(min(n_tb, resident // n_p) * n_p,)](*pargs, **pkw, SLEEP=int(p["sleep"]), XSTORE=xstore)
        GROUP_ERR[0] = sync[64 * n_tb:]
    elif v == "fused":
        if interp:
            raise ValueError("hc_pre: the fused variant needs a GPU (its programs wait on each other)")
        p = {**HC_PRE["fused"], **tune}
        bt, bd = p["bt"], min(p["bd"], max(16, next_pow2(d)))
        n_tb, n_s = triton.cdiv(t, bt), triton.cdiv(d, bd)
        scratch = torch.zeros(t * (nmix + 1) + 2 * n_tb, dtype=torch.float32, device=x.device)
        acc = scratch[:t * (nmix + 1)]
        sync = scratch[t * (nmix + 1):].view(torch.int32)
        pre = torch.empty(t, n, dtype=torch.float32, device=x.device)
        _hc_fused_kernel[(n_s, n_tb)](xc, fnc, bc, sc, col, post, comb, acc, sync, pre, t, d, n_s, iters, eps,
                                      norm_eps, N=n, NMIX=nmix, BLOCK_T=bt, BLOCK_D=bd, SPLIT3=split3, PREC=prec,
                                      num_warps=p["warps"])
    elif v == "persist":
        if interp:
            raise ValueError("hc_pre: the persist variant needs a GPU (its programs wait on each other)")
        p = {**HC_PRE["persist"], **tune}
        bt, bd = p["bt"], min(p["bd"], max(16, next_pow2(d)))
        n_tb, n_s = triton.cdiv(t, bt), triton.cdiv(d, bd)
        n_items = n_tb * n_s
        scratch = torch.zeros(t * (nmix + 1) + 2 * n_tb, dtype=torch.float32, device=x.device)
        acc = scratch[:t * (nmix + 1)]
        sync = scratch[t * (nmix + 1):].view(torch.int32)
        pre = torch.empty(t, n, dtype=torch.float32, device=x.device)
        kw = dict(N=n, NMIX=nmix, BLOCK_T=bt, BLOCK_D=bd, SPLIT3=split3, PREC=prec, OVERLAP=bool(p["overlap"]),
                   num_warps=p["warps"])
        args = (xc, fnc, bc, sc, col, post, comb, acc, sync, pre, t, d, n_s, n_items, 3, iters, eps, norm_eps)
        resident = _resident_programs(_hc_persist_kernel, args, kw, x.device)
        g = min(n_items, resident, p["per_sm"] * torch.cuda.get_device_properties(x.device).multi_processor_count)
        if n_s > g:
            raise ValueError(f"hc_pre: {n_s} slices per token block exceed the {g} resident programs; raise bd")
        _hc_persist_kernel[(g,)](*args[:14], g, *args[15:], **kw)
    else:
        raise ValueError(f"hc_pre: unknown variant {v!r}")
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
