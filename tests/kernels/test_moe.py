"""Grouped expert GEMM: parity (bf16 and fp8-block weights), the expert alignment, weighting, bad input."""

import pytest
import torch

from kernels.harness import format_table, run_spec
from kernels.metrics import gemm_diff
from kernels.moe import SPEC, align_by_expert, moe_config, moe_experts, moe_experts_ref, moe_inputs
from tests.kernels.interpreter import DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_moe_spec_passes(device):
    rows = run_spec(SPEC, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


@pytest.mark.parametrize("method", ["torch", "triton"])
def test_align_groups_pairs_by_expert_in_padded_tiles(method, device):
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [2, 3]], device=device)
    sorted_ids, block_expert = align_by_expert(ids, num_experts=5, block_m=4, method=method)
    n = ids.numel()
    tiles = sorted_ids.view(-1, 4)
    seen = []
    for tile, e in zip(tiles.tolist(), block_expert.tolist()):
        real = [p for p in tile if p < n]
        if e < 0:
            assert not real
            continue
        assert all(ids.view(-1)[p] == e for p in real)
        seen += real
    assert sorted(seen) == list(range(n))  # every pair exactly once
    assert block_expert.tolist()[:4] == [0, 1, 2, 3] and 4 not in block_expert.tolist()  # expert 4 is empty


# past one chunk of pairs (b=128 of the small config: 768 pairs × 64 experts; V3's 256 experts at b=300)
@pytest.mark.parametrize("t, e, k, bm", [(1, 64, 6, 16), (16, 64, 6, 16), (5, 256, 8, 16), (40, 8, 2, 4),
                                         (128, 64, 6, 16), (300, 256, 8, 16)])
def test_single_program_alignment_equals_the_torch_one(t, e, k, bm, device):
    g = torch.Generator().manual_seed(t)
    ids = torch.rand(t, e, generator=g).argsort(dim=1)[:, :k]
    if t == 40:
        ids[:30] = torch.tensor([1, 2])  # one long run and empty experts
    ids = ids.to(device)
    a, b = align_by_expert(ids, e, bm, "torch"), align_by_expert(ids, e, bm, "triton")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_shared_output_is_added_after_rounding_the_routed_sum(device):
    inp = moe_inputs(5, 64, 32, 4, 2, device, torch.Generator(device).manual_seed(2))
    shared = torch.randn(5, 64, generator=torch.Generator(device).manual_seed(3), device=device).bfloat16()
    got = moe_experts(**inp, add=shared)
    assert torch.equal(got, moe_experts(**inp) + shared)  # the fused add rounds as a separate one would
    assert torch.equal(moe_experts_ref(**inp, add=shared), moe_experts_ref(**inp) + shared)


def test_routing_weights_scale_each_expert_output(device):
    inp = moe_inputs(3, 64, 32, 4, 2, device, torch.Generator(device).manual_seed(0))
    base = moe_experts(**inp).float()
    inp2 = dict(inp, topk_weights=inp["topk_weights"] * torch.tensor([[2.0, 0.0]], device=device))
    only_first = moe_experts(**inp2).float()
    assert gemm_diff(only_first, moe_experts_ref(**inp2)).value < 1e-5
    assert not torch.allclose(base, only_first)


def test_fp8_weights_use_their_block_scales(device):
    inp = moe_inputs(4, 160, 96, 4, 2, device, torch.Generator(device).manual_seed(1), fp8=True)
    inp["w2_scale"] = inp["w2_scale"].clone()
    inp["w2_scale"][:, 1, 0] *= 3  # rows 128..159 of every down projection
    out = moe_experts(**inp)
    assert gemm_diff(out, moe_experts_ref(**inp)).value < 1e-5


def test_tiles_are_keyed_on_capability():
    from kernels.moe import moe_smem_per_stage
    from kernels.tiles import smem_limit

    assert moe_config(1, 6, 64, (9, 0)).block_m == 16
    assert moe_config(4096, 6, 64, (9, 0)).block_m == 128
    for cap in ((9, 0), (12, 0), (8, 9)):
        for t in (1, 64, 4096):
            for elem in (1, 2):
                c = moe_config(t, 6, 64, cap, elem)
                assert c.num_stages * moe_smem_per_stage(c, elem) <= smem_limit(cap)
    assert moe_config(64, 6, 64, (12, 0)).num_stages < moe_config(64, 6, 64, (9, 0)).num_stages


def test_bad_inputs_are_named(device):
    inp = moe_inputs(2, 64, 32, 4, 2, device, torch.Generator(device).manual_seed(2))
    with pytest.raises(ValueError, match="w2 must be"):
        moe_experts(**dict(inp, w2=inp["w2"].transpose(1, 2)))
    fp8 = moe_inputs(2, 64, 32, 4, 2, device, torch.Generator(device).manual_seed(2), fp8=True)
    with pytest.raises(ValueError, match="w3_scale of shape"):
        moe_experts(**dict(fp8, w3_scale=None))


def test_w8a8_quantises_tokens_and_intermediate_and_needs_fp8_weights(device):
    inp = moe_inputs(9, 256, 128, 4, 2, device, torch.Generator(device).manual_seed(3), fp8=True)
    a8 = moe_experts(**inp, act_fp8=True)
    assert gemm_diff(a8, moe_experts_ref(**inp, act_fp8=True)).value < 1e-5
    # the activations really went through fp8: w8a8 is off the bf16-activation result by fp8 rounding
    assert gemm_diff(a8, moe_experts_ref(**inp)).value > 1e-5
    bf16 = moe_inputs(2, 128, 128, 4, 2, device, torch.Generator(device).manual_seed(4))
    with pytest.raises(ValueError, match="needs fp8 expert weights"):
        moe_experts(**bf16, act_fp8=True)
