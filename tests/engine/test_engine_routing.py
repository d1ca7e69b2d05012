"""noaux_tc routing reference (kernels/routing.py): the DeepSeek-V3 gate math and the slips engines made.

Pinned: bias selects but does not weight (vLLM #12002, and HF's regression fixed in transformers #41647);
groups ranked by top-2 sum and masked to -inf, not 0 (vLLM #13474); ties resolved to the lower expert id;
HF's router (fp32, unsorted top-k) agrees. The fp32 bias of a bf16 model (transformers #42580) is pinned in
test_engine_checkpoints.
"""

from __future__ import annotations

import pytest
import torch

from kernels.routing import noaux_tc_ref


def _logit(p: torch.Tensor) -> torch.Tensor:
    """Router logits whose sigmoid is exactly ``p`` (to within fp32)."""
    return torch.log(p) - torch.log1p(-p)


def test_bias_selects_but_does_not_weight():
    scores = torch.tensor([[0.9, 0.8, 0.3, 0.2]])
    bias = torch.tensor([0.0, 0.0, 1.0, 0.0])  # lifts expert 2 into the top-2 by selection
    w, ids = noaux_tc_ref(_logit(scores), bias, top_k=2, n_group=1, topk_group=1, norm_topk_prob=False)
    assert ids.tolist() == [[2, 0]]
    torch.testing.assert_close(w, torch.tensor([[0.3, 0.9]]))  # unbiased sigmoid scores, not 1.3 / 0.9


def test_renormalised_then_scaled():
    scores = torch.tensor([[0.9, 0.8, 0.3, 0.2]])
    w, ids = noaux_tc_ref(_logit(scores), torch.zeros(4), top_k=2, n_group=1, topk_group=1,
                          norm_topk_prob=True, routed_scaling_factor=2.5)
    assert ids.tolist() == [[0, 1]]
    torch.testing.assert_close(w, torch.tensor([[0.9 / 1.7 * 2.5, 0.8 / 1.7 * 2.5]]))


def test_groups_ranked_by_top2_sum_not_max():
    # group 0 = experts 0,1 has the single best expert (0.95) but a weak second (0.05): top-2 sum 1.00;
    # group 1 = experts 2,3 sums to 1.3. With topk_group=1 only group 1 survives.
    scores = torch.tensor([[0.95, 0.05, 0.65, 0.65]])
    _, ids = noaux_tc_ref(_logit(scores), torch.zeros(4), top_k=2, n_group=2, topk_group=1)
    assert sorted(ids[0].tolist()) == [2, 3]


def test_masked_groups_are_minus_inf_not_zero():
    # Negative biases push every biased score of the kept group below 0. Masking dropped groups with 0
    # (the vLLM bug) would then pick an expert from a dropped group; -inf never does.
    scores = torch.tensor([[0.5, 0.5, 0.4, 0.4, 0.1, 0.1, 0.1, 0.1]])
    bias = torch.tensor([-0.9, -0.9, -0.95, -0.95, -1.0, -1.0, -1.0, -1.0])
    _, ids = noaux_tc_ref(_logit(scores), bias, top_k=3, n_group=4, topk_group=2)
    assert set(ids[0].tolist()) <= {0, 1, 2, 3}
    # the zero-masking variant would have chosen from the masked groups: show the case discriminates
    biased = scores + bias
    zero_masked = torch.cat([biased[:, :4], torch.zeros(1, 4)], dim=1)
    assert not set(zero_masked.topk(3).indices[0].tolist()) <= {0, 1, 2, 3}


def test_ties_go_to_the_lower_expert_id():
    logits = torch.zeros(3, 8)  # every score equal
    _, ids = noaux_tc_ref(logits, torch.zeros(8), top_k=3, n_group=4, topk_group=2)
    assert ids.tolist() == [[0, 1, 2]] * 3


def test_agrees_with_hf_router_on_random_inputs():
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = transformers.DeepseekV3Config(hidden_size=32, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
                                        topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)
    router = DeepseekV3TopkRouter(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(16, 32, generator=g) / 32 ** 0.5)
        router.e_score_correction_bias.copy_(torch.randn(16, generator=g) * 0.1)
    x = torch.randn(64, 32, generator=g)
    with torch.no_grad():
        logits, hf_w, hf_ids = router(x)
    w, ids = noaux_tc_ref(logits, router.e_score_correction_bias, 4, 4, 2, True, 2.5)
    hf_sorted, hf_order = hf_ids.sort(-1)
    ours_sorted, our_order = ids.sort(-1)
    assert torch.equal(hf_sorted, ours_sorted)
    torch.testing.assert_close(w.gather(1, our_order), hf_w.gather(1, hf_order), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_k=2, n_group=3, topk_group=1), "n_group=3 must divide"),
    (dict(top_k=2, n_group=2, topk_group=3), "topk_group=3"),
    (dict(top_k=5, n_group=2, topk_group=1), "top_k=5 exceeds"),
])
def test_bad_routing_parameters_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        noaux_tc_ref(torch.zeros(2, 8), torch.zeros(8), **kwargs)
