"""Paged absorbed-MLA decode: parity (NaN in every unused slot), split invariance, page aliasing, arch tiles."""

import pytest
import torch

from kernels.harness import format_table, run_spec
from kernels.metrics import gemm_diff
from kernels.mla_decode import (
    SPEC,
    SPEC_DENSE,
    DecodeConfig,
    decode_config,
    mla_decode,
    mla_decode_ref,
    paged_inputs,
    paged_mla_decode,
    paged_mla_decode_ref,
)
from tests.kernels.interpreter import DEVICES

# LSE bound: the interpreter's fp32 dots, or the spec's GPU bound (exp2/log2 approximations on the device)
LSE_TOL = {"cpu": 5e-6, "cuda": 1e-5}


@pytest.mark.parametrize("device", DEVICES)
def test_mla_decode_specs_pass(device):
    rows = run_spec(SPEC, device) + run_spec(SPEC_DENSE, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


def test_unused_slots_are_nan_and_never_read(device):
    inp = paged_inputs([3, 66], 4, device, torch.Generator(device).manual_seed(0))
    assert torch.isnan(inp["kv_cache"].float()).any()  # the poison is really there
    out, lse = paged_mla_decode(**inp)
    assert not torch.isnan(out.float()).any() and not torch.isnan(lse).any()


@pytest.mark.parametrize("splits", [1, 3, 8])
def test_split_count_does_not_change_the_result(splits, device):
    inp = paged_inputs([1, 130, 200], 3, device, torch.Generator(device).manual_seed(1))
    ref_o, ref_lse = paged_mla_decode_ref(**inp)
    out, lse = paged_mla_decode(**inp, config=DecodeConfig(16, 32, splits, 4, 1))
    assert gemm_diff(out, ref_o).value < 1e-5
    assert (lse - ref_lse).abs().max() < LSE_TOL[device]


@pytest.mark.parametrize("page, block_n", [(16, 32), (64, 32), (32, 16)])
def test_tiles_across_and_within_pages(page, block_n, device):
    """A 32-token tile over 16-token pages gathers rows from two pages; within a page it reads one."""
    inp = paged_inputs([45, 97], 3, device, torch.Generator(device).manual_seed(page), page=page)
    ref_o, ref_lse = paged_mla_decode_ref(**inp)
    out, lse = paged_mla_decode(**inp, config=DecodeConfig(16, block_n, 2, 4, 1))
    assert gemm_diff(out, ref_o).value < 1e-5
    assert (lse - ref_lse).abs().max() < LSE_TOL[device]


def test_shared_pages_and_a_sequence_of_one_token(device):
    """Two sequences reading the same page (prefix sharing) get the same answer for the same query."""
    inp = paged_inputs([70, 70], 2, device, torch.Generator(device).manual_seed(2))
    inp["block_table"][1] = inp["block_table"][0]
    inp["q"][1] = inp["q"][0]
    out, lse = paged_mla_decode(**inp)
    assert torch.equal(out[0], out[1]) and torch.equal(lse[0], lse[1])
    one = paged_inputs([1], 1, device, torch.Generator(device).manual_seed(3))
    o1, l1 = paged_mla_decode(**one)
    row = one["kv_cache"][one["block_table"][0, 0].long(), 0]
    torch.testing.assert_close(o1[0, 0].float(), row[:512].float(), rtol=2**-8, atol=0)  # softmax of one is 1
    s = (one["q"][0, 0].float() @ row.float()) * one["softmax_scale"]
    torch.testing.assert_close(l1[0, 0], s, rtol=1e-5, atol=1e-5)  # LSE of one score is the score


def test_tiles_are_keyed_on_capability():
    from kernels.tiles import smem_limit

    for cap in ((9, 0), (12, 0)):
        for heads in (16, 128):
            c = decode_config(32, heads, 4096, cap)
            staged = c.block_n * 576 * 2 * c.num_stages + c.block_h * 576 * 2
            assert staged <= smem_limit(cap)
    assert decode_config(32, 128, 4096, (12, 0)).num_stages < decode_config(32, 128, 4096, (9, 0)).num_stages
    assert decode_config(1, 16, 32768, (9, 0), 132).num_splits > decode_config(128, 16, 4096, (9, 0), 132).num_splits
    for b in (1, 32, 128):  # sm90, 16 heads: one page a tile, about two waves of programs
        c = decode_config(b, 16, 4096, (9, 0), 132)
        assert c.block_n == 64 and c.num_stages == 2
        assert b * c.num_splits <= 2 * 132 and (c.num_splits == 64 or b * (c.num_splits + 1) > 2 * 132)
    assert decode_config(1, 16, 100, (9, 0), 132).num_splits == 2  # never a split without a tile
    assert decode_config(32, 16, 4096, (12, 0)).block_n == 32  # two 64-token stages do not fit in ~99 KB
    assert decode_config(32, 16, 32768, (12, 0)).num_splits >= 32768 // 2048  # no split longer than 2048 tokens
    assert decode_config(128, 128, 4096, (9, 0)).block_h == 32


def test_bad_inputs_are_named(device):
    inp = paged_inputs([5], 2, device, torch.Generator(device).manual_seed(4))
    with pytest.raises(ValueError, match="kv_cache must be"):
        paged_mla_decode(**{**inp, "q": inp["q"][..., :512]})
    with pytest.raises(ValueError, match="seq_lens must be"):
        paged_mla_decode(**{**inp, "seq_lens": torch.tensor([5, 5], dtype=torch.int32)})
    with pytest.raises(ValueError, match="kv_cache is"):
        paged_mla_decode(**{**inp, "kv_cache": inp["kv_cache"].float()})


def test_engine_layout_matches_paged_layout(device):
    """The engine op over a contiguous cache and the paged op over the same rows give the same answer."""
    inp = paged_inputs([3, 100], 4, device, torch.Generator(device).manual_seed(5))
    page = inp["kv_cache"].shape[1]
    dense = torch.zeros(2, 128, 576, dtype=torch.bfloat16, device=device)
    for b, n in enumerate([3, 100]):
        pos = torch.arange(n, device=device)
        dense[b, :n] = inp["kv_cache"][inp["block_table"][b, pos // page].long(), pos % page]
    q = inp["q"]
    o1, l1 = paged_mla_decode(**inp)
    o2, l2 = mla_decode(q[..., :512], q[..., 512:], dense[..., :512], dense[..., 512:], inp["seq_lens"],
                        inp["softmax_scale"], config=DecodeConfig(16, 32, 4, 4, 1))
    ro, rl = mla_decode_ref(q[..., :512], q[..., 512:], dense[..., :512], dense[..., 512:], inp["seq_lens"],
                            inp["softmax_scale"])
    assert gemm_diff(o2, ro).value < 1e-5 and (l2 - rl).abs().max() < LSE_TOL[device]
    assert gemm_diff(o1, o2).value < 1e-5 and (l1 - l2).abs().max() < LSE_TOL[device]


@pytest.mark.parametrize("splits", [2, 5])
def test_fused_merge_equals_the_merge_kernel_and_resets_its_counters(splits, device):
    """The last split to finish merges in place of the second kernel: same result, and its arrival counters
    are back at zero, so a second call (or a graph replay) starts clean."""
    from kernels.mla_decode import _COUNTERS

    inp = paged_inputs([1, 130, 200], 20, device, torch.Generator(device).manual_seed(6))
    two = paged_mla_decode(**inp, config=DecodeConfig(16, 32, splits, 4, 1))
    for _ in range(2):
        one = paged_mla_decode(**inp, config=DecodeConfig(16, 32, splits, 4, 1, fused_merge=True))
        # the same fp32 merge, its exp2 compiled in another kernel: at most one bf16 rounding apart
        torch.testing.assert_close(one[0].float(), two[0].float(), rtol=2**-7, atol=1e-5)
        torch.testing.assert_close(one[1], two[1], rtol=1e-5, atol=LSE_TOL[device])
    assert int(_COUNTERS[torch.device(device) if device == "cpu" else one[0].device].abs().sum()) == 0


@pytest.mark.parametrize("lens, programs", [([1, 70, 150], 4), ([33], 5), ([1, 1, 1], 9), ([64, 64, 64], 2),
                                            ([5, 300, 2, 129], 7)], ids=str)
def test_balanced_wave_matches_the_reference(lens, programs, device):
    """One list of all sequences' tiles cut into equal program ranges: sequences cut anywhere (mid-page,
    one token, several sequences per program, programs with empty ranges) merge back to the reference."""
    inp = paged_inputs(lens, 16, device, torch.Generator(device).manual_seed(len(lens) + programs))
    ref_o, ref_lse = paged_mla_decode_ref(**inp)
    for block_n in (32, 64):
        cfg = DecodeConfig(16, block_n, 1, 4, 1 if device == "cpu" else 2, persistent=programs)
        out, lse = paged_mla_decode(**inp, config=cfg)
        assert not torch.isnan(out.float()).any()
        assert gemm_diff(out, ref_o).value < 1e-5
        assert float((lse - ref_lse).abs().max()) <= LSE_TOL[device]
        split = paged_mla_decode(**inp, config=DecodeConfig(16, block_n, 2, 4, 1 if device == "cpu" else 2))
        torch.testing.assert_close(out.float(), split[0].float(), rtol=2**-7, atol=2e-2)


def test_balanced_wave_on_the_engine_layout(device):
    g = torch.Generator(device).manual_seed(3)
    lens = torch.tensor([5, 77], device=device)
    kv = torch.randn(2, 80, 512, generator=g, device=device).bfloat16()
    pe = torch.randn(2, 80, 64, generator=g, device=device).bfloat16()
    ql = torch.randn(2, 16, 512, generator=g, device=device).bfloat16()
    qp = torch.randn(2, 16, 64, generator=g, device=device).bfloat16()
    ref_o, ref_lse = mla_decode_ref(ql, qp, kv[:, :77], pe[:, :77], lens, 0.07)
    out, lse = mla_decode(ql, qp, kv, pe, lens, 0.07, config=DecodeConfig(16, 32, 1, 4, 1, persistent=3))
    assert gemm_diff(out, ref_o).value < 1e-5
    assert float((lse - ref_lse).abs().max()) <= LSE_TOL[device]


@pytest.mark.parametrize("fused", [False, True])
def test_transposed_tiles_match_the_reference(fused, device):
    """Tokens on the MMA's M side (Sᵀ = K·Qᵀ, Oᵀ = Vᵀ·Pᵀ): the same attention, ragged lengths, two head
    blocks, a partial last head block."""
    for lens, heads in (([1, 70, 150], 5), ([97], 20), ([64, 128], 16)):
        inp = paged_inputs(lens, heads, device, torch.Generator(device).manual_seed(heads))
        ref_o, ref_lse = paged_mla_decode_ref(**inp)
        cfg = DecodeConfig(16, 32, 2, 4, 1 if device == "cpu" else 2, fused_merge=fused, transposed=True)
        out, lse = paged_mla_decode(**inp, config=cfg)
        assert gemm_diff(out, ref_o).value < 1e-5
        assert float((lse - ref_lse).abs().max()) <= LSE_TOL[device]
