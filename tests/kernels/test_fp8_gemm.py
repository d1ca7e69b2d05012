"""FP8 block GEMM: parity through the harness on CPU (interpreter), split-K, tile choice per arch, bad input."""

import pytest
import torch

from kernels.fp8_gemm import (
    SPEC,
    GemmConfig,
    fp8_gemm,
    fp8_gemm_ref,
    gemm_config,
    quant_weight_blocks,
)
from kernels.fp8_quant import act_quant_ref
from kernels.harness import format_table, run_spec
from tests.kernels.interpreter import DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_gemm_spec_passes(device):
    rows = run_spec(SPEC, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


def _operands(m, n, k, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    a, a_s = act_quant_ref(torch.randn(m, k, generator=g))
    b, b_s = quant_weight_blocks(torch.randn(n, k, generator=g))
    return a.to(device), a_s.to(device), b.to(device), b_s.to(device)


def test_split_k_matches_single_pass_and_reference(device):
    a, a_s, b, b_s = _operands(3, 48, 640, seed=1, device=device)
    one = fp8_gemm(a, a_s, b, b_s, config=GemmConfig(16, 32, 1, 1, 4, 1))
    split = fp8_gemm(a, a_s, b, b_s, config=GemmConfig(16, 32, 4, 1, 4, 1))  # 5 k-blocks over 3 splits
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    # fp32 partial sums in another order, then one bf16 rounding: at most one bf16 ulp apart
    torch.testing.assert_close(split.float(), one.float(), rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(split.float(), ref.float(), rtol=2**-7, atol=1e-2)
    assert not torch.equal(a_s, torch.ones_like(a_s))  # scales are real, so a dropped scale would show


def test_fused_split_k_reduction_matches_the_two_kernel_one(device):
    a, a_s, b, b_s = _operands(3, 72, 128 * 6, seed=9, device=device)
    two = fp8_gemm(a, a_s, b, b_s, config=GemmConfig(16, 32, 3, 1, 4, 1))
    for _ in range(2):  # the counters are reset by each call's last program, so a second call works too
        one = fp8_gemm(a, a_s, b, b_s, config=GemmConfig(16, 32, 3, 1, 4, 1, fused_reduce=True))
        assert torch.equal(one, two)
    from kernels.fp8_gemm import _COUNTERS

    assert int(_COUNTERS[a.device].abs().sum()) == 0


@pytest.mark.parametrize("kblocks, split", [(4, 1), (5, 1), (7, 2)])
def test_paired_k_steps_match_single_steps(kblocks, split, device):
    a, a_s, b, b_s = _operands(5, 40, 128 * kblocks, seed=kblocks, device=device)
    one = fp8_gemm(a, a_s, b, b_s, config=GemmConfig(16, 32, split, 1, 4, 1))
    pair = fp8_gemm(a, a_s, b, b_s, config=GemmConfig(16, 32, split, 1, 4, 1, k_pair=True))
    torch.testing.assert_close(pair.float(), one.float(), rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(pair.float(), fp8_gemm_ref(a, a_s, b, b_s).float(), rtol=2**-7, atol=1e-2)


def test_scales_are_applied_per_block(device):
    a, a_s, b, b_s = _operands(2, 256, 256, seed=2, device=device)
    b_s2 = b_s.clone()
    b_s2[1, 0] *= 4  # one 128x128 weight block: only columns 128..255 change
    out1 = fp8_gemm(a, a_s, b, b_s).float()
    out2 = fp8_gemm(a, a_s, b, b_s2).float()
    assert torch.equal(out1[:, :128], out2[:, :128])
    assert not torch.allclose(out1[:, 128:], out2[:, 128:])
    torch.testing.assert_close(out2, fp8_gemm_ref(a, a_s, b, b_s2).float(), rtol=2**-7, atol=1e-2)


def test_tile_choice_is_keyed_on_capability():
    from kernels.tiles import smem_limit

    for cap in ((9, 0), (12, 0), (8, 9)):
        for m in (1, 16, 64, 4096):
            c = gemm_config(m, 7168, 7168, cap)
            assert c.num_stages * (c.block_m + c.block_n) * 128 <= smem_limit(cap)  # fp8 A and B tiles fit
    pre = gemm_config(4096, 7168, 7168, (9, 0))
    assert (pre.block_m, pre.block_n, pre.num_warps, pre.split_k, pre.plain) == (128, 128, 8, 1, True)
    assert pre.tma and pre.warp_spec  # Hopper prefill: the persistent TMA kernel
    assert not gemm_config(4096, 7168, 7168, (12, 0)).tma and not gemm_config(1, 7168, 7168, (9, 0)).tma
    assert gemm_config(4096, 7168, 7168, (12, 0)).num_stages < pre.num_stages  # sm120's ~99 KB holds fewer
    short = gemm_config(128, 7168, 7168, (9, 0), num_sms=132)  # 56 tiles of 128x128 would leave SMs idle
    assert short.block_m == 64
    wide = GemmConfig(128, 256, 1, 8, 8, 4)  # would need 192 KB: fine on sm90, not on sm120's ~99 KB
    from kernels.tiles import fit_stages

    assert fit_stages(wide.num_stages, (128 + 256) * 128, (9, 0)) == 4
    assert fit_stages(wide.num_stages, (128 + 256) * 128, (12, 0)) == 1
    dec = gemm_config(1, 7168, 7168, (9, 0), num_sms=132)
    assert dec.block_m == 16 and dec.split_k > 1
    assert 132 <= (7168 // dec.block_n) * dec.split_k <= 2 * 132  # one to two waves stream the weight
    mid = gemm_config(64, 7168, 7168, (9, 0), num_sms=132)
    assert mid.block_m == 64 and mid.split_k == 2  # all rows share one read of each weight tile
    assert dec.pdl and mid.pdl and not pre.pdl and pre.tma_store  # PDL for decode shapes, TMA stores for prefill
    assert not gemm_config(1, 7168, 7168, (8, 9)).pdl  # programmatic dependent launch is sm90+


def test_general_kernel_config_is_still_honoured():
    assert not GemmConfig(16, 32, 1, 1, 4, 1).plain


@pytest.mark.parametrize(
    "mnk, cfg",
    [
        ((5, 96, 200), GemmConfig(16, 32, 1, 0, 4, 1, plain=True)),  # ragged N and K: wrapped rows, masked K
        ((33, 130, 384), GemmConfig(16, 64, 1, 2, 4, 1, plain=True)),  # grouped order, ragged M and N
        ((3, 256, 640), GemmConfig(16, 256, 1, 0, 4, 1, plain=True)),  # N tile wider than a scale block
        ((2, 64, 128 * 7), GemmConfig(16, 32, 3, 0, 4, 1, plain=True)),  # 7 K blocks over 3 splits (3, 3, 1)
        ((4, 72, 128 * 6), GemmConfig(16, 32, 3, 0, 4, 1, plain=True, fused_reduce=True)),
        ((1, 48, 128 * 5), GemmConfig(16, 32, 5, 0, 4, 1, plain=True)),  # one K block per split
    ],
)
def test_static_shape_kernel_matches_general_kernel_and_reference(mnk, cfg, device):
    from kernels.fp8_gemm import _plain_ok

    m, n, k = mnk
    a, a_s, b, b_s = _operands(m, n, k, seed=sum(mnk), device=device)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    assert _plain_ok(a, a_s, b, b_s, out, cfg.split_k)  # the static-shape kernel really runs
    fp8_gemm(a, a_s, b, b_s, out=out, config=cfg)
    general = fp8_gemm(a, a_s, b, b_s, config=GemmConfig(16, 32, 1, 1, 4, 1))
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    assert not torch.isnan(out).any()  # every element written, edges included
    torch.testing.assert_close(out.float(), general.float(), rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=1e-2)


def test_strided_operands_take_the_general_kernel(device):
    from kernels.fp8_gemm import _plain_ok

    a, a_s, b, b_s = _operands(4, 64, 512, seed=5, device=device)
    wide = torch.zeros(4, 1024, dtype=torch.float8_e4m3fn, device=device)
    wide[:, :512] = a
    view = wide[:, :512]  # row stride 1024, not K
    out = torch.empty(4, 64, dtype=torch.bfloat16, device=device)
    assert not _plain_ok(view, a_s, b, b_s, out, 1)
    got = fp8_gemm(view, a_s, b, b_s, config=GemmConfig(16, 32, 1, 0, 4, 1, plain=True))
    assert torch.equal(got, fp8_gemm(a, a_s, b, b_s, config=GemmConfig(16, 32, 1, 0, 4, 1, plain=True)))


@pytest.mark.parametrize(
    "shapes, needle",
    [
        (((4, 256), (4, 2), (64, 128), (1, 1)), "K differs"),
        (((4, 256), (4, 1), (64, 256), (1, 2)), "a_s must be [4, 2]"),
        (((4, 256), (4, 2), (200, 256), (1, 2)), "b_s must be [2, 2]"),
    ],
)
def test_bad_shapes_name_the_operand(shapes, needle):
    (am, ak), a_s, (bn, bk), b_s = shapes
    a = torch.zeros(am, ak, dtype=torch.float8_e4m3fn)
    b = torch.zeros(bn, bk, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=needle.replace("[", r"\[")):
        fp8_gemm(a, torch.ones(a_s), b, torch.ones(b_s))


@pytest.mark.parametrize(
    "mnk, cfg",
    [
        ((5, 96, 256), GemmConfig(16, 32, 1, 0, 4, 1, tma=True)),  # rows and columns past the edge: TMA zero-fill
        ((33, 130, 384), GemmConfig(16, 64, 1, 2, 4, 1, tma=True)),  # grouped order over a persistent loop
        ((3, 256, 640), GemmConfig(16, 256, 1, 0, 4, 1, tma=True)),  # N tile wider than a scale block
        ((2, 64, 128 * 7), GemmConfig(16, 32, 3, 0, 4, 1, tma=True)),  # split-K work items, second-kernel sum
        ((4, 72, 128 * 6), GemmConfig(16, 32, 3, 0, 4, 1, tma=True, fused_reduce=True)),
        ((20, 64, 256), GemmConfig(16, 32, 1, 0, 4, 1, tma=True, warp_spec=True)),
    ],
)
def test_persistent_tma_kernel_matches_reference(mnk, cfg, device):
    m, n, k = mnk
    a, a_s, b, b_s = _operands(m, n, k, seed=sum(mnk) + 1, device=device)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    fp8_gemm(a, a_s, b, b_s, out=out, config=cfg)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), fp8_gemm_ref(a, a_s, b, b_s).float(), rtol=2**-7, atol=1e-2)


@pytest.mark.parametrize("cfg", [
    GemmConfig(16, 64, 1, 2, 4, 1, plain=True, tma=True, warp_spec=True, n_sub=2),
    GemmConfig(16, 128, 1, 2, 4, 1, plain=True, tma=True, n_sub=2),
    GemmConfig(16, 64, 1, 2, 4, 1, plain=True, tma=True, tma_store=True),
    GemmConfig(16, 64, 2, 0, 4, 1, plain=True, pdl=True, prefetch=2),
    GemmConfig(16, 64, 2, 0, 4, 1, plain=True, pdl=True, prefetch=2, fused_reduce=True),
    GemmConfig(16, 64, 1, 0, 4, 1, plain=True, k_unroll=5),  # 5 K-blocks in one trip
    GemmConfig(16, 64, 5, 0, 4, 1, plain=True, k_unroll=2),  # one K-block per split: falls back to single steps
], ids=lambda c: f"{c.block_n}-sub{c.n_sub}-store{int(c.tma_store)}-pdl{int(c.pdl)}-fused{int(c.fused_reduce)}"
                 f"-ku{c.k_unroll}-split{c.split_k}")
def test_hopper_variants_match_the_plain_kernel(cfg, device):
    """Column slices (two accumulators), the TMA-store epilogue and the PDL launch (with the weight's first
    K-blocks prefetched into L2) change where work happens, never the sums: equal to the plain kernel."""
    a, a_s, b, b_s = _operands(33, 192, 128 * 5, seed=4, device=device)
    want = fp8_gemm(a, a_s, b, b_s, config=GemmConfig(16, cfg.block_n, cfg.split_k, 0, 4, 1, plain=True))
    got = fp8_gemm(a, a_s, b, b_s, config=cfg)
    if cfg.split_k == 1 or not cfg.fused_reduce:
        assert torch.equal(got, want)
    else:  # the partials are summed in another order
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(got.float(), fp8_gemm_ref(a, a_s, b, b_s).float(), rtol=2**-7, atol=1e-2)
