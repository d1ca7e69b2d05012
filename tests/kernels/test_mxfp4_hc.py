"""MXFP4 dequant variants, the w4a8 MoE and its selection by compute capability, and hc_pre's launch choices
(CPU: the Triton interpreter; CUDA where present)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels import hc, mxfp4
from kernels.harness import Case, format_table, run_spec
from kernels.registry import load_spec
from tests.kernels.interpreter import DEVICES


def _cap(device: str) -> tuple[int, int] | None:
    from kernels.arch import capability

    return capability(device)


# --- selection (no kernel runs) -------------------------------------------------------------------------

def test_w4a8_path_by_compute_capability():
    assert mxfp4.w4a8_select(None)[0] == "interpreter"
    path, why = mxfp4.w4a8_select((8, 0))
    assert path is None and "sm80" in why and "w4a16" in why
    assert mxfp4.w4a8_select((8, 9))[0] == mxfp4.w4a8_select((9, 0))[0] == "fp8-mma"
    assert "FP4" in mxfp4.w4a8_select((9, 0))[1]  # sm90: no FP4 tensor cores, said so
    for cap in ((10, 0), (12, 0)):  # native FP4 MMA would apply but is not built, and the reason says it
        path, why = mxfp4.w4a8_select(cap)
        assert path == "fp8-mma" and why == mxfp4.W4A8_NATIVE_FP4 and "not built" in why


def test_dequant_variant_by_capability(monkeypatch):
    monkeypatch.setitem(mxfp4.DQ_TILE, "variant", "bf16x2")
    assert mxfp4.dequant_variant((9, 0), torch.bfloat16) == "bf16x2"
    assert mxfp4.dequant_variant((12, 0), torch.bfloat16) == "bf16x2"
    assert mxfp4.dequant_variant((8, 9), torch.bfloat16) == "tile"  # mul.rn.bf16x2 is sm90+
    assert mxfp4.dequant_variant((9, 0), torch.float32) == "tile"
    assert mxfp4.dequant_variant(None, torch.bfloat16) == "tile"  # no inline PTX under the interpreter
    monkeypatch.setitem(mxfp4.DQ_TILE, "variant", "tile")
    assert mxfp4.dequant_variant((9, 0), torch.bfloat16) == "tile"


def test_expert_tiles_cover_every_pair_once_within_one_expert():
    ids = torch.tensor([[3, 1], [3, 0], [3, 1], [2, 3], [3, 0]])
    order, meta = mxfp4._expert_tiles(ids, 5, 2)
    flat = ids.reshape(-1)
    seen = []
    for e, first, end in meta.tolist():
        if first == end:
            continue
        rows = order[first:min(end, first + 2)].tolist()  # a tile: up to bm pairs from first, within the expert
        assert 0 < len(rows) <= 2
        assert all(flat[p] == e for p in rows)
        seen += rows
    assert sorted(seen) == list(range(flat.numel()))
    assert meta.shape[0] >= sum(-(-int(c) // 2) for c in torch.bincount(flat, minlength=5))


# --- kernels ------------------------------------------------------------------------------------------

@triton.jit
def _decode_e4m3_kernel(b_ptr, o_ptr):
    i = tl.arange(0, 16)
    b = tl.load(b_ptr + i[:, None] * 16 + tl.arange(0, 16)[None, :]).to(tl.int32) & 0xFF
    v = mxfp4._e2m1_as_e4m3(b, 16, 16)  # [16, 32]
    tl.store(o_ptr + i[:, None] * 32 + tl.arange(0, 32)[None, :], v.to(tl.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_e2m1_decodes_to_e4m3_exactly(device):
    b = torch.arange(256, device=device, dtype=torch.int32).to(torch.uint8)
    o = torch.empty(512, device=device)
    _decode_e4m3_kernel[(1,)](b, o)
    want = mxfp4.mxfp4_dequant_ref(b.view(1, 256), torch.full((1, 16), 127 - 6, dtype=torch.uint8, device=device))
    assert torch.equal(o.view(1, -1).view(torch.int32), want.view(torch.int32))  # -0.0 for code 8 included
    assert torch.equal(want.to(torch.float8_e4m3fn).float(), want)  # and every value is an e4m3 value


def _variants(device: str) -> list[str]:
    cap = _cap(device)
    return ["flat", "tile"] + (["bf16x2"] if cap is not None and cap >= (9, 0) else [])


@pytest.mark.parametrize("device", DEVICES)
def test_dequant_variants_exact_on_every_byte_and_scale(device):
    # the interpreter flushes bf16 subnormals, so on the CPU bf16 starts at scale byte 3 (2^-124)
    lo_bf16 = 3 if device == "cpu" else 0
    for out_dtype, lo in ((torch.float32, 0), (torch.bfloat16, lo_bf16)):
        w = torch.arange(256, device=device, dtype=torch.int32).to(torch.uint8).repeat(256 - lo, 1)
        s = torch.arange(lo, 256, device=device, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 16)
        ref = mxfp4.mxfp4_dequant_ref(w, s, out_dtype)
        for v in _variants(device):
            if v == "bf16x2" and out_dtype != torch.bfloat16:
                continue
            out = mxfp4.mxfp4_dequant(w, s, out_dtype, variant=v)
            assert torch.equal(out.isnan(), ref.isnan()), v  # scale byte 255 is inf: 0 · inf
            ok = ~ref.isnan()
            bits = torch.int32 if out_dtype == torch.float32 else torch.int16
            assert torch.equal(out.view(bits)[ok], ref.view(bits)[ok]), (v, out_dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_dequant_code_8_is_negative_zero_and_tiles_are_partial(device):
    w = torch.full((1, 48), 0x88, device=device, dtype=torch.uint8)  # both nibbles code 8; 3 groups: a partial tile
    s = torch.full((1, 3), 127, device=device, dtype=torch.uint8)
    for v in _variants(device):
        for dt in (torch.float32, torch.bfloat16) if v != "bf16x2" else (torch.bfloat16,):
            out = mxfp4.mxfp4_dequant(w, s, dt, variant=v)
            assert out.shape == (1, 96) and out.eq(0).all() and torch.signbit(out).all(), (v, dt)


@pytest.mark.parametrize("device", DEVICES)
def test_w4a8_parity(device):
    path, why = mxfp4.w4a8_select(_cap(device))
    if path is None:
        pytest.skip(why)
    spec = load_spec("mxfp4_moe_w4a8")
    assert spec.op == "mxfp4_moe_w4a8"
    rows = run_spec(spec, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


def test_w4a8_parity_on_a_part_without_fp8_mma_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(mxfp4, "capability", lambda device: (8, 0))  # an A100: no fp8 MMA
    spec = load_spec("mxfp4_moe_w4a8")
    rows = run_spec(spec, "cpu", case_filter="4tok")  # the reference runs; the kernel refuses before any launch
    assert rows and all(r.outcome == "skipped" for r in rows), format_table(rows)
    assert "sm80" in rows[0].message and "w4a16" in rows[0].message
    with pytest.raises(RuntimeError, match="sm80"):  # a direct caller still gets an error it can catch as before
        mxfp4.mxfp4_moe_w4a8(**spec.make_inputs(spec.cases[0], torch.device("cpu"), torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("device", DEVICES)
def test_w4a8_one_expert_over_several_tiles_and_block_32(device):
    path, why = mxfp4.w4a8_select(_cap(device))
    if path is None:
        pytest.skip(why)
    gen = torch.Generator(device=device).manual_seed(5)
    inp = mxfp4._moe_inputs(Case("x", {"shape": (20, 4, 64, 64, 2)}, dtype=torch.float32), torch.device(device), gen)
    inp["ids"] = torch.stack([torch.tensor([2, 0]) if t % 5 else torch.tensor([1, 2]) for t in range(20)]).to(device)
    for block in (128, 32):
        ref = mxfp4.mxfp4_moe_w4a8_ref(**inp, block=block)
        out = mxfp4.mxfp4_moe_w4a8(**inp, block=block, bm=16)  # expert 2: 20 pairs over two tiles; expert 3 unused
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    # quantising the activations is a visible change against w4a16 (the QAT-faithful difference)
    assert not torch.allclose(ref, mxfp4.mxfp4_moe_ref(**inp), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_w4a8_non_default_tiles_bm32_bn64_8_warps_block_32(device):
    """The config that once hit "misaligned address" on the H200 (32 pairs per tile, 64 columns, 8 warps,
    activation block 32): at a small shape everywhere and, on a GPU, at V4-Flash's H 4096 / I 2048."""
    path, why = mxfp4.w4a8_select(_cap(device))
    if path is None:
        pytest.skip(why)
    shapes = [(20, 4, 128, 64, 2)] + ([(32, 16, 4096, 2048, 6)] if device == "cuda" else [])
    for shape in shapes:
        gen = torch.Generator(device=device).manual_seed(6)
        inp = mxfp4._moe_inputs(Case("x", {"shape": shape}, dtype=torch.bfloat16), torch.device(device), gen)
        ref = mxfp4.mxfp4_moe_w4a8_ref(**inp, block=32).float()
        out = mxfp4.mxfp4_moe_w4a8(**inp, block=32, bm=32, bn=64, warps=8).float()
        assert ((out - ref).pow(2).sum() / ref.pow(2).sum()).item() < 1e-5, shape


def _hc_inputs(t, n, d, device, dtype):
    return hc._pre_inputs(Case("x", {"shape": (t, n, d)}, dtype=dtype), torch.device(device),
                          torch.Generator(device=device).manual_seed(3))


def test_hc_pre_rejects_unknown_launch_choices():
    inp = _hc_inputs(3, 4, 16, "cpu", torch.float32)
    with pytest.raises(ValueError, match="unknown launch choices.*'variant'"):
        hc.hc_pre(**inp, variant="split")


@pytest.mark.parametrize("device", DEVICES)
def test_hc_pre_split_over_k_and_d_slices(device):
    inp = _hc_inputs(19, 4, 72, device, torch.float32)
    ref = hc.hc_pre_ref(**inp)
    for tune in ({"s": 1, "ds": 1}, {"s": 3, "ds": 3, "rev": True}):
        out = hc.hc_pre(**inp, **tune)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_expert_alignment_kernel_matches_the_torch_tiles(device):
    gen = torch.Generator(device=device).manual_seed(7)
    for t, k, e, bm in ((5, 2, 5, 2), (40, 6, 256, 16), (300, 3, 9, 4)):
        ids = torch.stack([torch.randperm(e, generator=gen, device=device)[:k] for _ in range(t)])
        o_ref, m_ref = mxfp4._expert_tiles(ids, e, bm)
        order, meta = mxfp4._expert_tiles_triton(ids, e, bm)
        assert torch.equal(meta, m_ref)  # the same tile table
        flat = ids.reshape(-1)
        # each expert's run holds the same pairs (in any order: rows of a tile are independent)
        assert torch.equal(flat[order.long()], flat[o_ref.long()])
        assert torch.equal(order.sort().values, torch.arange(flat.numel(), device=device, dtype=torch.int32))
