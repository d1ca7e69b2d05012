"""Block FP8 quantisation kernels: parity, e4m3 rounding at every edge, UE8M0 scales, errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

import kernels.fp8_quant as fq
from kernels._tl import div_rn_by, e4m3_bits, e4m3_to_f32
from kernels.harness import format_table, run_spec
from tests.kernels.interpreter import DEVICES, interpreter


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", [fq.SPEC, fq.SPEC_UE8M0, fq.SPEC_DEQUANT, fq.SPEC_WEIGHT_DEQUANT], ids=lambda s: s.op)
def test_parity(spec, device):
    rows = run_spec(spec, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


@triton.jit
def _encode(x_ptr, q_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(q_ptr + o, e4m3_bits(tl.load(x_ptr + o, mask=o < n)).to(tl.uint8), mask=o < n)


def test_integer_e4m3_encoding_matches_torch_everywhere(device):
    """Every finite e4m3 value, every midpoint between neighbours (ties to even), and nudges either side."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    vals = codes[~torch.isnan(codes)].unique().sort().values
    mids = (vals[1:] + vals[:-1]) / 2
    x = torch.cat([vals, mids, torch.nextafter(mids, vals[1:]), torch.nextafter(mids, vals[:-1]),
                   torch.tensor([-0.0, 1e-30, -1e-30, 124.9, 127.9, -447.99])])
    x = x[x.abs() <= 448]
    q = torch.empty(x.numel(), dtype=torch.uint8, device=device)
    _encode[(triton.cdiv(x.numel(), 1024),)](x.to(device), q, x.numel(), BLOCK=1024)
    q = q.cpu()
    want = x.to(torch.float8_e4m3fn).view(torch.uint8)
    bad = (q != want).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} differ, e.g. x={x[bad[:5]].tolist()} got {q[bad[:5]].tolist()} want {want[bad[:5]].tolist()}"


@triton.jit
def _naive_quant(x_ptr, q_ptr, s_ptr, K: tl.constexpr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * K + tl.arange(0, K)).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x)), 1e-4) / 448.0
    tl.store(q_ptr + row * K + tl.arange(0, K), (x / s).to(tl.float8e4nv))
    tl.store(s_ptr + row, s)


@interpreter
def test_edges_case_catches_a_plain_convert():
    """A quantiser that relies on the interpreter's own e4m3 convert misrounds the spec's edge values."""

    def naive(out, x, block, ue8m0):
        _naive_quant[(x.numel() // 128,)](x.contiguous(), out[0], out[1], K=128)

    spec = dataclasses.replace(fq.SPEC, kernel=naive)
    rows = [r for r in run_spec(spec, "cpu", case_filter="edges") if r.output == "q"]
    assert rows and rows[0].outcome == "failed" and "reference 128.0" in rows[0].message


def test_ue8m0_rounds_up_exactly_just_above_a_power_of_two():
    s = torch.tensor([2.0**-10, torch.nextafter(torch.tensor(2.0**-10), torch.tensor(1.0)).item(), 3.0, 0.75])
    assert fq.ue8m0_ref(s).tolist() == [2.0**-10, 2.0**-9, 4.0, 1.0]
    # exp2(ceil(log2 s)) lands the second one back on 2^-10, i.e. rounds it down
    assert torch.exp2(torch.ceil(torch.log2(s[1:2]))).item() == 2.0**-10


def test_quantisation_round_trip_error_is_bounded(device):
    x = torch.randn(4, 640, device=device) * 10
    q, s = fq.act_quant(x)
    back = fq.act_dequant(q, s)
    blocks = x.view(4, 5, 128)
    amax = blocks.abs().amax(-1, keepdim=True)
    assert ((back.view(4, 5, 128) - blocks).abs() <= amax / 448 * 16 + 1e-7).all()  # ≤ half an ulp at 448


def test_weight_dequant_matches_deepseek_layout(device):
    w = torch.randn(200, 300, device=device).to(torch.float8_e4m3fn)
    s = torch.rand(2, 3, device=device)
    out = fq.weight_dequant(w, s, out_dtype=torch.bfloat16)
    assert torch.equal(out[130:, 260:], (w[130:, 260:].float() * s[1, 2]).bfloat16())


def test_bad_inputs_are_explained(device):
    with pytest.raises(ValueError, match="scale_inv must be"):
        fq.weight_dequant(torch.zeros(200, 300, dtype=torch.float8_e4m3fn, device=device), torch.ones(1, 3, device=device))
    with pytest.raises(ValueError, match="power of two"):
        fq.act_quant(torch.randn(2, 300, device=device), block=100)
    q, s = fq.act_quant(torch.randn(2, 300, device=device))
    with pytest.raises(ValueError, match="does not tile"):
        fq.act_dequant(q, s[:, :2])


@triton.jit
def _divide(x_ptr, s_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(x_ptr + o, mask=m, other=1.0)
    s = tl.load(s_ptr + o, mask=m, other=1.0)
    r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    tl.store(y_ptr + o, div_rn_by(x, s, r), mask=m)


def test_reciprocal_division_is_correctly_rounded(device):
    """``div_rn_by`` equals IEEE division bit for bit: random operands over the quantiser's whole range,
    signed zeros, subnormals, and quotients an ulp either side of every e4m3 rounding midpoint."""
    g = torch.Generator().manual_seed(7)
    n = 200_000
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 20, (n,), generator=g).float())
    s = torch.rand(n, generator=g) * torch.exp2(torch.randint(-22, 10, (n,), generator=g).float()) + 1e-30
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    vals = codes[~torch.isnan(codes)].unique().sort().values
    mids = ((vals[1:] + vals[:-1]) / 2).repeat(8)
    sm = torch.rand(mids.numel(), generator=g) + 0.25
    xm = mids * sm  # x/s lands on or next to a midpoint
    x = torch.cat([x, xm, torch.nextafter(xm, xm * 2), torch.nextafter(xm, xm / 2),
                   torch.tensor([0.0, -0.0, 1e-40, -1e-40, 448.0, -3e-39])])
    s = torch.cat([s, sm, sm, sm, torch.tensor([0.5, 0.5, 1e-3, 2.0, 1.0, 7e-3])])
    y = torch.empty(x.shape, device=device)
    _divide[(triton.cdiv(x.numel(), 4096),)](x.to(device), s.to(device), y, x.numel(), BLOCK=4096)
    y = y.cpu()
    want = x / s
    # below 2^-102 the residual x − y·s is subnormal and no longer exact; there the quotient is far under
    # e4m3's smallest step, so only its e4m3 byte has to agree
    tiny = x.abs() < 2.0**-102
    assert torch.equal(y[tiny].clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8),
                       want[tiny].clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
    bad = ((y.view(torch.int32) != want.view(torch.int32)) & ~tiny).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} differ: x={x[bad[:4]].tolist()} s={s[bad[:4]].tolist()} got {y[bad[:4]].tolist()} want {want[bad[:4]].tolist()}"


def test_reference_scale_is_an_ieee_divide():
    amax_row = torch.zeros(1, 128)
    amax_row[0, 0] = 672.0  # 672/448 = 1.5 exactly; a reciprocal multiply gives 1.5000001
    assert fq.act_quant_ref(amax_row)[1].item() == 1.5


@pytest.mark.parametrize("tune", [{"tile_n": 16}, {"tile_n": 64}, {"groups": 2}, {"groups": 8},
                                  {"rows": 2, "groups": 4}, {"rows": 4, "groups": 2, "stream": True},
                                  {"rows": 1, "groups": 8, "stream": True}], ids=str)
def test_launch_overrides_keep_results_exact(tune, device):
    if "tile_n" in tune:
        w = torch.randn(300, 260, device=device).to(torch.float8_e4m3fn)
        s = torch.rand(3, 3, device=device)
        assert torch.equal(fq.weight_dequant(w, s, tune=tune), fq.weight_dequant_ref(w, s))
        with pytest.raises(ValueError, match="must divide"):
            fq.weight_dequant(w, s, tune={"tile_n": 48})
    else:
        x = torch.randn(3, 1000, device=device).bfloat16()  # 3 rows: a partial row tile; 1000: a partial block
        for ue8m0 in (False, True):
            q, s = fq.act_quant(x, ue8m0=ue8m0, tune=tune)
            rq, rs = fq.act_quant_ref(x, ue8m0=ue8m0)
            assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)



@triton.jit
def _decode(q_ptr, y_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y_ptr + o, e4m3_to_f32(tl.load(q_ptr + o)))


def test_integer_e4m3_decoding_matches_torch_for_all_256_codes(device):
    codes = torch.arange(256, dtype=torch.uint8)
    y = torch.empty(256, device=device)
    _decode[(1,)](codes.to(device), y, BLOCK=256)
    y = y.cpu()
    want = codes.view(torch.float8_e4m3fn).float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(y), nan)
    assert torch.equal(y[~nan].view(torch.int32), want[~nan].view(torch.int32))
