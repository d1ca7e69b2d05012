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
