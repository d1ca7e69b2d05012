"""Our V4 engine against HF transformers' DeepseekV4ForCausalLM on the same random tiny checkpoint (fp32, CPU).

The tiny preset is built so each part is exercised within these prompts: CSA layers emit entries every 4
tokens and keep only 3 of them (index_topk), the HCA layer every 8, the window (8) is shorter than the
prompts, two layers route by hash, and the SwiGLU limit (1.5) clamps."""

from __future__ import annotations

import torch

from engine.v4.generate import generate, prefill_logits

# fp32 on both sides; measured max |Δlogit| ~1e-5 on logits of magnitude ~16. A real bug (a wrong rope
# base, a sink dropped, a window off by one, Sinkhorn's order) moves logits by > 1e-1.
ATOL = 1e-4
STEPS = 32


def hf_agrees_greedily(hf, prompt: list[int], tokens: list[int]) -> list[int]:
    """Steps where HF's argmax, given the prompt and our tokens so far, is not our next token. One forward
    over the whole sequence checks every step, and no mismatch at any step means HF's own greedy decode
    produces exactly ``tokens`` (by induction on the prefix)."""
    seq = torch.tensor([prompt + tokens])
    with torch.no_grad():
        pred = hf(seq, use_cache=False).logits[0, len(prompt) - 1: -1].float().argmax(-1).tolist()
    return [i for i, (a, b) in enumerate(zip(pred, tokens, strict=True)) if a != b]


def test_prefill_logits_match_hf(v4_model, hf_v4):
    tokens = torch.randint(2, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    ours = prefill_logits(v4_model, tokens)
    with torch.no_grad():
        ref = hf_v4(tokens, use_cache=False).logits.float()
    assert ours.shape == ref.shape == (2, 40, 256)
    err = (ours - ref).abs().max().item()
    assert err < ATOL, f"max |logit diff| {err:.3g} vs HF (tolerance {ATOL})"
    assert ref.abs().max() > 1.0


def test_greedy_ragged_batch_of_three_matches_hf_for_32_steps(v4_model, hf_v4, v4_prompts):
    ours = generate(v4_model, v4_prompts, STEPS)  # one ragged batch: prefill, then one token per step
    for g, p in zip(ours, v4_prompts, strict=True):
        assert len(g.tokens) == STEPS
        bad = hf_agrees_greedily(hf_v4, p, g.tokens)
        assert not bad, f"prompt {p}: HF's greedy choice differs at steps {bad}"
    assert all(len(set(g.tokens)) > 8 for g in ours)  # not a trivially repetitive decode


def test_incremental_decode_logits_match_full_recompute(v4_model, hf_v4, v4_prompts):
    """Each decode step's logits (caches only) equal HF's on the whole sequence: the caches lose nothing."""
    p = v4_prompts[1]
    g = generate(v4_model, [p], 24)[0]
    seq = torch.tensor([p + g.tokens])
    with torch.no_grad():
        ref = hf_v4(seq, use_cache=False).logits[0].float()
    ours = prefill_logits(v4_model, seq)[0]
    assert (ours - ref).abs().max().item() < ATOL
    margins = torch.tensor(g.margins)
    ref_top2 = ref[len(p) - 1: len(p) - 1 + 24].topk(2, dim=-1).values
    assert (margins - (ref_top2[:, 0] - ref_top2[:, 1])).abs().max().item() < ATOL


def test_router_choices_match_hf_including_hash_layers(v4_model, hf_v4):
    tokens = torch.randint(2, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    captured: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda mod, args, out: captured.append(out[2].detach().clone()))
             for layer in hf_v4.model.layers]
    with torch.no_grad():
        hf_v4(tokens, use_cache=False)
    for h in hooks:
        h.remove()
    routes: list[torch.Tensor] = []
    v4_model.setup_cache(2, 20)
    with torch.no_grad():
        v4_model.hidden(tokens, torch.arange(20).expand(2, 20), routes=routes)
    assert len(routes) == len(captured) == v4_model.cfg.num_hidden_layers
    kinds = v4_model.cfg.mlp_layer_types
    assert "hash_moe" in kinds and "moe" in kinds
    for i, (ours, ref) in enumerate(zip(routes, captured, strict=True)):
        ours = ours.reshape(-1, ours.shape[-1]).sort(dim=-1).values
        ref = ref.reshape(-1, ref.shape[-1]).sort(dim=-1).values
        assert torch.equal(ours, ref), f"layer {i} ({kinds[i]}): routed experts differ from HF"


def test_every_part_is_exercised(v4_model, v4_prompts):
    """The parity above means something only if the indexer drops entries, the window truncates and the
    clamp fires on these prompts."""
    c = v4_model.cfg
    longest = max(len(p) for p in v4_prompts) + STEPS
    assert longest > c.sliding_window
    assert longest // c.compress_rates["compressed_sparse_attention"] > c.index_topk
    assert longest // c.compress_rates["heavily_compressed_attention"] >= 2
    seen = {}
    mlp = v4_model.model.layers[2].mlp.shared_experts
    hook = mlp.register_forward_pre_hook(lambda m, a: seen.update(g=mlp.gate_proj(a[0]).detach().amax().item()))
    generate(v4_model, v4_prompts[:1], 4)
    hook.remove()
    assert seen["g"] > c.swiglu_limit
