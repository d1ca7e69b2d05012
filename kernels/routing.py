"""DeepSeek-V3 ``noaux_tc`` MoE routing: group-limited top-k over sigmoid scores with a selection-only bias.

The math follows DeepSeek's ``inference/model.py`` Gate. Two published engine bugs shape the spec and are
pinned by tests: the correction bias is used to *choose* experts but never to *weight* them (vLLM #12002),
and groups are ranked by the sum of their top-2 biased scores with masked groups set to ``-inf``, not 0,
so a negative biased score can never pull in an expert from a dropped group (vLLM #13474).
"""

from __future__ import annotations

import torch


def _topk_stable(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest values along the last dim, ties going to the lower index.

    ``torch.topk`` leaves the winner of a tie unspecified (and it differs across devices); a stable
    descending sort makes routing reproducible, which the Triton kernel must match.
    """
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def _route_shape(logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int):
    """``(tokens, experts, experts per group)``, once the routing arguments are known to fit together:
    the reference and the kernel refuse the same calls with the same words."""
    if logits.dim() != 2:
        raise ValueError(f"router logits must be [tokens, experts], got shape {tuple(logits.shape)}")
    n_tok, n_exp = logits.shape
    if bias.shape != (n_exp,):
        raise ValueError(f"e_score_correction_bias must have shape ({n_exp},), got {tuple(bias.shape)}")
    if n_group < 1 or n_exp % n_group:
        raise ValueError(f"n_group={n_group} must divide n_routed_experts={n_exp}")
    per_group = n_exp // n_group
    if not 1 <= topk_group <= n_group:
        raise ValueError(f"topk_group={topk_group} must be in 1..n_group={n_group}")
    if not 1 <= top_k <= topk_group * per_group:
        raise ValueError(f"top_k={top_k} exceeds the {topk_group * per_group} experts of the kept groups")
    return n_tok, n_exp, per_group


def noaux_tc_ref(
    logits: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    norm_topk_prob: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route ``logits[T, E]`` (router logits, any float dtype) to ``top_k`` experts per token.

    Returns ``(weights[T, top_k] fp32, ids[T, top_k] int64)``, ordered by biased score, best first.
    Steps: fp32 sigmoid scores; ``biased = scores + bias`` for selection only; each of ``n_group`` groups
    scored by the sum of its two best biased scores; all but the best ``topk_group`` groups masked to
    ``-inf``; ``top_k`` experts by biased score; weights gathered from the *unbiased* scores, divided by
    their sum when ``norm_topk_prob``, then multiplied by ``routed_scaling_factor``.
    """
    n_tok, n_exp, per_group = _route_shape(logits, bias, top_k, n_group, topk_group)

    scores = logits.float().sigmoid()
    biased = scores + bias.float()
    if n_group > 1:
        grouped = biased.view(n_tok, n_group, per_group)
        top2 = min(2, per_group)
        group_scores = grouped.sort(dim=-1, descending=True).values[..., :top2].sum(dim=-1)
        keep = _topk_stable(group_scores, topk_group)
        group_mask = torch.zeros(n_tok, n_group, dtype=torch.bool, device=logits.device)
        group_mask.scatter_(1, keep, True)
        biased = grouped.masked_fill(~group_mask.unsqueeze(-1), float("-inf")).view(n_tok, n_exp)
    ids = _topk_stable(biased, top_k)
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routed_scaling_factor, ids


# --- Triton ---------------------------------------------------------------------------------------------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.arch import interpreting  # noqa: E402


@triton.jit
def _noaux_tc_kernel(
    logits_ptr, bias_ptr, w_ptr, ids_ptr,
    n_tok, stride_lt, scaling,
    N_GROUP: tl.constexpr, PER_GROUP: tl.constexpr, G_P2: tl.constexpr, PG_P2: tl.constexpr,
    TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr, K_P2: tl.constexpr, NORM: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    # [tokens, groups, experts-in-group] tiles; every selection is an arg-max taking the lowest index
    # among equal values, which is the reference's stable descending sort order
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < n_tok
    g = tl.arange(0, G_P2)
    j = tl.arange(0, PG_P2)
    e3 = g[None, :, None] * PER_GROUP + j[None, None, :]
    ok = (g[None, :, None] < N_GROUP) & (j[None, None, :] < PER_GROUP)
    logit = tl.load(logits_ptr + t[:, None, None].to(tl.int64) * stride_lt + e3, mask=ok & t_ok[:, None, None],
                    other=0.0).to(tl.float32)
    scores = tl.sigmoid(logit)
    bias = tl.load(bias_ptr + e3, mask=ok, other=0.0).to(tl.float32)
    biased = tl.where(ok, scores + bias, float("-inf"))
    BIG: tl.constexpr = 1 << 30
    if N_GROUP > 1:
        # group score = sum of its two best biased scores (one of each, so equal maxima count twice)
        top1 = tl.max(biased, 2)
        if PER_GROUP > 1:
            first = tl.min(tl.where(biased == top1[:, :, None], j[None, None, :], BIG), 2)
            rest = tl.where(j[None, None, :] == first[:, :, None], float("-inf"), biased)
            gscore = top1 + tl.max(rest, 2)
        else:
            gscore = top1
        g2 = g[None, :]
        gscore = tl.where(g2 < N_GROUP, gscore, float("-inf"))
        keep = gscore < float("-inf")  # all False, [BLOCK_T, G_P2]
        for _ in tl.static_range(TOPK_GROUP):
            pick = tl.min(tl.where(gscore == tl.max(gscore, 1)[:, None], g2, BIG), 1)
            keep = keep | (g2 == pick[:, None])
            gscore = tl.where(g2 == pick[:, None], float("-inf"), gscore)
        biased = tl.where(keep[:, :, None], biased, float("-inf"))
    kk = tl.arange(0, K_P2)[None, :]
    out_ids = tl.zeros((BLOCK_T, K_P2), dtype=tl.int64)
    out_w = tl.zeros((BLOCK_T, K_P2), dtype=tl.float32)
    for i in tl.static_range(TOP_K):
        best = tl.max(tl.max(biased, 2), 1)
        pick = tl.min(tl.min(tl.where(biased == best[:, None, None], e3, BIG), 2), 1)
        hit = e3 == pick[:, None, None]
        w = tl.sum(tl.sum(tl.where(hit, scores, 0.0), 2), 1)
        out_ids = tl.where(kk == i, pick[:, None].to(tl.int64), out_ids)
        out_w = tl.where(kk == i, w[:, None], out_w)
        biased = tl.where(hit, float("-inf"), biased)
    if NORM:
        out_w = out_w / tl.sum(out_w, 1)[:, None]
    dst = t[:, None].to(tl.int64) * TOP_K + kk
    st_ok = t_ok[:, None] & (kk < TOP_K)
    tl.store(ids_ptr + dst, out_ids, mask=st_ok)
    tl.store(w_ptr + dst, out_w * scaling, mask=st_ok)


def noaux_tc(
    logits: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    norm_topk_prob: bool = True,
    routed_scaling_factor: float = 1.0,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of :func:`noaux_tc_ref` (into ``out=(weights, ids)`` when given): each program holds a
    few tokens' whole rows of experts in registers.

    Each selection is an arg-max that takes the lowest index among equal values, which is exactly the
    reference's stable descending sort, so ties resolve the same way on every device.
    """
    n_tok, _, per_group = _route_shape(logits, bias, top_k, n_group, topk_group)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if out is None:
        weights = torch.empty(n_tok, top_k, dtype=torch.float32, device=logits.device)
        ids = torch.empty(n_tok, top_k, dtype=torch.int64, device=logits.device)
    else:
        weights, ids = out
        if weights.shape != (n_tok, top_k) or ids.shape != (n_tok, top_k) or ids.dtype != torch.int64:
            raise ValueError(f"noaux_tc: out must be ([{n_tok}, {top_k}] float32, [{n_tok}, {top_k}] int64)")
        if not (weights.is_contiguous() and ids.is_contiguous()):
            raise ValueError("noaux_tc: out tensors must be contiguous")
    if n_tok == 0:
        return weights, ids
    width = triton.next_power_of_2(n_group) * triton.next_power_of_2(per_group)
    # the interpreter pays per operation, not per element: many tokens per program there
    block_t = 16 if interpreting() else max(1, min(16, 512 // width))
    _noaux_tc_kernel[(triton.cdiv(n_tok, block_t),)](
        logits, bias.contiguous(), weights, ids,
        n_tok, logits.stride(0), float(routed_scaling_factor),
        N_GROUP=n_group, PER_GROUP=per_group,
        G_P2=triton.next_power_of_2(n_group), PG_P2=triton.next_power_of_2(per_group),
        TOPK_GROUP=topk_group, TOP_K=top_k, K_P2=triton.next_power_of_2(top_k), NORM=bool(norm_topk_prob),
        BLOCK_T=block_t, num_warps=4 if block_t * width >= 512 else 2,
    )
    return weights, ids



# --- parity (Triton kernel vs reference) --------------------------------------------------------------

from kernels.harness import Case as _Case  # noqa: E402
from kernels.harness import Check as _Check  # noqa: E402
from kernels.harness import ParitySpec as _ParitySpec  # noqa: E402


def _route_inputs(case: _Case, device: torch.device, gen: torch.Generator) -> dict:
    p = case.params
    t, e = p["te"]
    logits = torch.randn(t, e, generator=gen, device=device)
    bias = 0.1 * torch.randn(e, generator=gen, device=device)
    if p.get("ties"):  # few distinct values: many exact ties among scores, groups and experts
        logits = (logits * 2).round() / 2
        bias = torch.zeros(e, device=device)
    return {"logits": logits.to(case.dtype), "bias": bias, "top_k": p["k"], "n_group": p["groups"],
            "topk_group": p["keep"], "norm_topk_prob": p.get("norm", True),
            "routed_scaling_factor": p.get("scale", 2.5)}


SPEC_TRITON = _ParitySpec(
    op="noaux_tc",
    make_inputs=_route_inputs,
    reference=noaux_tc_ref,
    kernel=lambda out, **inp: noaux_tc(**inp, out=out),
    cases=[
        _Case("t9 v3 e256 g8/4 k8", {"te": (9, 256), "k": 8, "groups": 8, "keep": 4}, dtype=torch.float32),
        _Case("t5 small e64 g8/3 k6 bf16", {"te": (5, 64), "k": 6, "groups": 8, "keep": 3}),
        _Case("t6 e48 g3/2 k6 ties", {"te": (6, 48), "k": 6, "groups": 3, "keep": 2, "ties": True},
              dtype=torch.float32),
        _Case("t4 e12 g1 k2 no-norm", {"te": (4, 12), "k": 2, "groups": 1, "keep": 1, "norm": False, "scale": 1.0},
              dtype=torch.float32),
        _Case("t4096 v3", {"te": (4096, 256), "k": 8, "groups": 8, "keep": 4}, dtype=torch.float32,
              devices=("cuda",)),
    ],
    checks=[
        _Check("allclose", 1.0, "fp32 sigmoid and a sum of ≤ 8 terms: only evaluation order differs",
               output=0, name="weights", opts={"atol": 1e-6, "rtol": 1e-5}),
        _Check("bit_exact", 0, "selection is exact: equal ids, ties to the lower index as the stable sort",
               output=1, name="ids"),
    ],
    description="noaux_tc MoE gate: sigmoid, selection-only bias, group top-2, -inf masking, renorm, scale",
)
