"""DeepSeek-V4 kernels against their references (CPU: the Triton interpreter; CUDA where present), the
584-byte pool's layout byte by byte, and the references against HF's DeepseekV4 modules."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels import compressor, kv584
from kernels.harness import format_table, run_spec
from kernels.registry import load_spec
from tests.kernels.interpreter import DEVICES

V4_OPS = ["kv584_store", "kv584_load", "sparse_mla_decode", "compress_store", "hc_pre", "hc_post", "indexer_topk",
          "mxfp4_dequant", "mxfp4_moe", "sqrtsoftplus_topk", "hash_routing"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", V4_OPS)
def test_parity(op, device):
    spec = load_spec(op)
    assert spec.op == op and any("cuda" in c.devices and "cpu" not in c.devices for c in spec.cases)
    rows = run_spec(spec, device)
    assert rows and all(r.passed for r in rows), format_table(rows)


def test_584_byte_layout_byte_by_byte():
    assert kv584.TOKEN_BYTES == 584 == kv584.NOPE_DIM + 2 * kv584.ROPE_DIM + kv584.SCALE_BYTES
    x = torch.zeros(1, 512)
    x[0, 0] = 1.0
    x[0, 1] = -448.0  # tile 0: amax 448 -> scale 1 (byte 127)
    x[0, 64] = 3.0  # tile 1: amax 3 -> scale 2^-7 (3/448 rounded up to a power of two), 3 = 384 * 2^-7
    x[0, 448] = 1.5  # first rope channel, bf16 0x3FC0 little-endian
    row = kv584.pack_ref(x)[0]
    assert row.shape == (584,) and row.dtype == torch.uint8
    assert row[0] == 0x38 and row[1] == 0xFE  # e4m3 1.0 and -448
    assert row[64] == torch.tensor([384.0]).to(torch.float8_e4m3fn).view(torch.uint8)[0]
    assert (row[448], row[449]) == (0xC0, 0x3F)
    assert row[576] == 127 and row[577] == 127 - 7 and row[583] == 0
    assert row[578:583].tolist() == [127 - 22] * 5  # zero tiles take the amax floor: 1e-4/448 -> 2^-22
    torch.testing.assert_close(kv584.unpack_ref(row[None]), x, rtol=0, atol=0)


# test_parity runs the default (tiles, 2 tokens, 2 warps); these are the other paths
STORE_VARIANTS = [{"impl": "row"}, {"impl": "words"}, {"impl": "words", "rows": 16, "num_warps": 8},
                  {"impl": "words", "rows": 8, "num_warps": 4, "evict": "evict_first"},
                  {"impl": "words", "rows": 4, "stages": 2, "programs": 3}, {"impl": "tiles", "rows": 4, "num_warps": 2},
                  {"impl": "tiles", "rows": 1, "num_warps": 1, "evict": "evict_first"}]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", STORE_VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_kv584_store_variants_pass_the_spec(variant, device):
    def kernel(out, kv, pool, slots):
        out[0].copy_(pool)
        kv584.kv584_store(kv, out[0], slots, **variant)

    rows = run_spec(dataclasses.replace(kv584.SPEC_STORE, kernel=kernel), device)
    assert rows and all(r.passed for r in rows), format_table(rows)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", [{"impl": "row"}, {"impl": "words", "rows": 4, "num_warps": 2}],
                         ids=lambda v: "-".join(map(str, v.values())))
def test_kv584_load_variants_pass_the_spec(variant, device):
    rows = run_spec(dataclasses.replace(kv584.SPEC_LOAD, kernel=lambda out, pool, slots: kv584.kv584_load(
        pool, slots, out=out[0], **variant)), device)
    assert rows and all(r.passed for r in rows), format_table(rows)


def test_word_load_reads_any_bytes_like_the_reference(device):
    """Random pool bytes (NaN codes, odd scales) and slot -1: the word kernel decodes exactly what the
    reference does; a non-contiguous ``out`` gets the same rows, its gaps untouched (either kernel)."""
    g = torch.Generator().manual_seed(4)
    pool = torch.randint(0, 256, (3, 8, kv584.TOKEN_BYTES), generator=g, dtype=torch.int32).to(torch.uint8)
    pool[0, :, kv584.SCALE_OFFSET:kv584.SCALE_OFFSET + kv584.N_TILES] = 0  # 2^-127: never written, still decoded
    slots = torch.tensor([3, -1, 23, 0, 9, 9, 17], device=device)
    pool = pool.to(device)
    want = kv584.kv584_load_ref(pool, slots)
    got = kv584.kv584_load(pool, slots, impl="words", rows=4)
    bits_differ = (got.view(torch.int32) != want.view(torch.int32)) & ~(got.isnan() & want.isnan())
    assert torch.equal(got.isnan(), want.isnan()) and not bits_differ.any()  # bf16 subnormals and -0.0 too
    assert want.isnan().any() and got[1].eq(0).all()
    for impl in ("row", "words"):
        wide = torch.full((slots.shape[0], 2 * kv584.HEAD_DIM), 7.0, device=device)
        kv584.kv584_load(pool, slots, out=wide[:, ::2], impl=impl)
        assert torch.equal(wide[:, ::2].nan_to_num(), want.nan_to_num()) and wide[:, 1::2].eq(7).all()


def _e4m3_ties(n: int, gen: torch.Generator) -> torch.Tensor:
    """Rows whose tiles each hold amax 448·2^k (so the scale is 2^k exactly) and otherwise only e4m3 values and
    exact midpoints between neighbours (normal, subnormal, and across binade edges such as 240|256)."""
    e4 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    pos = torch.unique(e4[torch.isfinite(e4) & (e4 >= 0)])
    pick = torch.cat([(pos[1:] + pos[:-1]) / 2, pos])
    pick = torch.cat([pick, -pick])
    x = pick[torch.randint(0, pick.numel(), (n, kv584.HEAD_DIM), generator=gen)]
    x[:, 0:kv584.NOPE_DIM:kv584.TILE] = 448.0
    k = torch.randint(-12, 6, (n, kv584.N_TILES + 1), generator=gen).float()
    return x * torch.exp2(k).repeat_interleave(kv584.TILE, 1)


@pytest.mark.parametrize("impl", ["row", "words"])
def test_load_decodes_every_scale_byte_exactly(impl, device):
    """Scale byte b is 2^(b-127) for all 256 bytes (0: the subnormal 2^-127; 255: 2^128 = inf) times every
    e4m3 code, in the reference and in both load kernels, bit for bit; the reference matches fp64 math."""
    rows = torch.zeros(256, kv584.TOKEN_BYTES, dtype=torch.uint8)
    rows[:, :kv584.NOPE_DIM] = ((torch.arange(256)[:, None] + torch.arange(kv584.NOPE_DIM)[None]) % 256).to(torch.uint8)
    rows[:, kv584.SCALE_OFFSET:kv584.SCALE_OFFSET + kv584.N_TILES] = torch.arange(256).to(torch.uint8)[:, None]
    want = kv584.unpack_ref(rows)
    q = rows[:, :kv584.NOPE_DIM].contiguous().view(torch.float8_e4m3fn).double()
    exact = (q * torch.exp2(torch.arange(256).double() - 127)[:, None]).float()
    fin = torch.arange(255)  # byte 255 is inf: 0 * inf is NaN in the reference, 0 in fp64 math
    assert torch.equal(want[fin, :kv584.NOPE_DIM].nan_to_num(), exact[fin].nan_to_num())
    assert want[0, 1:8].ne(0).all() and want[0, :kv584.NOPE_DIM].nan_to_num().abs().max() < 2.0**-118
    pool = rows.view(4, 64, kv584.TOKEN_BYTES).to(device)
    got = kv584.kv584_load(pool, torch.arange(256, device=device), impl=impl).cpu()
    bits_differ = (got.view(torch.int32) != want.view(torch.int32)) & ~(got.isnan() & want.isnan())
    assert torch.equal(got.isnan(), want.isnan()) and not bits_differ.any(), bits_differ.nonzero()[:4].tolist()


@pytest.mark.parametrize("impl", ["row", "words", "tiles"])
def test_kv584_store_rounds_ties_to_even_at_every_e4m3_step(impl, device):
    x = _e4m3_ties(24, torch.Generator().manual_seed(0))
    x[1, 64:128] = 0.0
    want = kv584.pack_ref(x)
    assert (want[:, 1:448].view(torch.float8_e4m3fn).float() != x[:, 1:448] * 0).any()  # ties were planted
    pool = kv584.new_pool(1, 32, device)
    kv584.kv584_store(x.to(device), pool, torch.arange(24, device=device), impl=impl)
    got = pool.view(-1, kv584.TOKEN_BYTES)[:24].cpu()
    assert torch.equal(got, want), (got != want).nonzero()[:8].tolist()


@pytest.mark.parametrize("impl", ["words", "tiles"])
def test_kv584_store_scale_bytes_at_binade_edges(impl, device):
    """Tile amaxes at 448·2^k and one ulp either side (where the scale's power of two steps), and at 2^k and
    one ulp either side: the scale bytes (and the e4m3 bytes) equal the reference's, bit for bit."""
    base = torch.tensor([448.0 * 2.0**k for k in range(-12, 14)] + [2.0**k for k in range(-12, 14)])
    amax = torch.cat([torch.nextafter(base, base * 0), base, torch.nextafter(base, base * 4)])
    amax = torch.cat([amax, amax[: (-amax.numel()) % 7]])  # whole rows of 7 nope tiles
    n = amax.numel() // 7
    x = torch.rand(n, kv584.HEAD_DIM, generator=torch.Generator().manual_seed(6)) * 2 - 1
    x[:, :kv584.NOPE_DIM].view(n, 7, 64).mul_(amax.view(n, 7, 1))
    x[:, 0:kv584.NOPE_DIM:kv584.TILE] = -amax.view(n, 7)  # each tile's amax exactly, negative
    want = kv584.pack_ref(x)
    pool = kv584.new_pool(1, n, device)
    kv584.kv584_store(x.to(device), pool, torch.arange(n, device=device), impl=impl)
    got = pool.view(-1, kv584.TOKEN_BYTES).cpu()
    assert len(set(want[:, kv584.SCALE_OFFSET:kv584.SCALE_OFFSET + 7].flatten().tolist())) > 30
    assert torch.equal(got, want), (got != want).nonzero()[:8].tolist()


@pytest.mark.parametrize("impl", ["row", "words", "tiles"])
def test_store_skips_negative_slots_and_load_zeroes_them(impl, device):
    pool = kv584.new_pool(2, 4, device)
    kv = torch.randn(3, 512, device=device)
    kv584.kv584_store(kv, pool, torch.tensor([5, -1, 0], device=device), impl=impl)
    assert pool.view(-1, 584)[[1, 2, 3, 4, 6, 7]].eq(0).all()
    out = kv584.kv584_load(pool, torch.tensor([0, -1, 5], device=device))
    assert out[1].eq(0).all()
    torch.testing.assert_close(out[[0, 2]], kv584.unpack_ref(kv584.pack_ref(kv[[2, 0]])), rtol=0, atol=0)
    with pytest.raises(ValueError, match="584"):
        kv584.kv584_load(torch.zeros(2, 583, dtype=torch.uint8, device=device), torch.tensor([0], device=device))
    with pytest.raises(ValueError, match="impl"):
        kv584.kv584_store(kv, pool, torch.tensor([5, -1, 0], device=device), impl="bytes")


@pytest.mark.parametrize("offset", [2, 1])
def test_tiles_store_reads_strided_bf16_rows(offset, device):
    """Rows of a wider bf16 buffer: at an even element offset the rope words are read through the int32 view of
    the rows (their bits unchanged), at an odd one (not 4-byte aligned) they are rounded from the values."""
    kv = kv584._rows(5, torch.Generator().manual_seed(3), "cpu", torch.bfloat16)
    wide = torch.zeros(5, 2 * kv584.HEAD_DIM, dtype=torch.bfloat16)
    wide[:, offset:offset + kv584.HEAD_DIM] = kv
    pool = kv584.new_pool(1, 8, device)
    kv584.kv584_store(wide.to(device)[:, offset:offset + kv584.HEAD_DIM], pool, torch.arange(5, device=device),
                      impl="tiles")
    assert torch.equal(pool.view(-1, kv584.TOKEN_BYTES)[:5].cpu(), kv584.pack_ref(kv))


def test_word_store_on_a_pool_not_8_byte_aligned_falls_back(device):
    """A pool viewed at a 2-byte offset cannot take int64 words: the byte-store kernel writes it instead."""
    buf = torch.zeros(2 + 6 * kv584.TOKEN_BYTES, dtype=torch.uint8, device=device)
    pool = buf[2:].view(2, 3, kv584.TOKEN_BYTES)
    assert kv584._words(pool.view(-1, kv584.TOKEN_BYTES)) is None
    assert kv584._words(kv584.new_pool(2, 3, device).view(-1, kv584.TOKEN_BYTES)) is not None
    kv = torch.randn(4, 512, device=device)
    kv584.kv584_store(kv, pool, torch.tensor([4, 0, 2, 5], device=device), impl="words")
    rows = pool.view(-1, kv584.TOKEN_BYTES)[[4, 0, 2, 5]].cpu()
    assert torch.equal(rows, kv584.pack_ref(kv.cpu())) and buf[:2].eq(0).all()


# test_parity runs the default (stream, 4 rows per step, the tail's inputs early, evict_first on CSA windows; split
# windows only on a GPU with fewer entries than SMs); these are the other paths
COMPRESS_VARIANTS = [{"impl": "row"}, {"impl": "unrolled"}, {"impl": "unrolled", "entries": 2, "block_l": 4},
                     {"impl": "stream", "block_l": 8}, {"impl": "stream", "block_l": 2, "num_warps": 2},
                     {"impl": "stream", "parts": 2}]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", COMPRESS_VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_compress_store_variants_pass_the_spec(variant, device):
    def kernel(out, **inp):
        pool = inp["pool"].clone()
        compressor.compress_store(**dict(inp, pool=pool), **variant)
        out[0].copy_(kv584.kv584_load_ref(pool, inp["slots"]))
        out[1].copy_(kv584._flat(pool)[inp["slots"]][:, kv584.SCALE_OFFSET:])

    rows = run_spec(dataclasses.replace(compressor.SPEC, kernel=kernel), device)
    assert rows and all(r.passed for r in rows), format_table(rows)


@pytest.mark.parametrize("impl", ["row", "unrolled", "stream", "stream-late"])
def test_compress_store_skips_negative_slots_and_ragged_entry_blocks(impl, device, monkeypatch):
    """5 entries (not a multiple of the entries per program), a window of 5 (not a multiple of the rows
    pooled per step), and slot -1: the other slots hold exactly what the reference writes, the rest is
    untouched."""
    case = compressor.Case("ragged", {"shape": (5, 5, 2)}, dtype=torch.float32)
    inp = compressor._inputs(case, torch.device(device), torch.Generator(device=device).manual_seed(2))
    inp["slots"][1] = -1
    inp["pool"].fill_(0xA5)
    want = compressor.compress_store_ref(**dict(inp, pool=inp["pool"].clone()))
    if impl == "stream-late":  # the tail's inputs loaded after the window
        monkeypatch.setattr(compressor, "STREAM_PRE", False)
    got = compressor.compress_store(**dict(inp, pool=inp["pool"].clone()), impl=impl.split("-")[0], entries=4,
                                    block_l=2)
    keep = inp["slots"] >= 0
    flat_w, flat_g = kv584._flat(want), kv584._flat(got)
    others = torch.ones(flat_w.shape[0], dtype=torch.bool, device=device)
    others[inp["slots"][keep]] = False
    assert flat_g[others].eq(0xA5).all()
    torch.testing.assert_close(kv584.unpack_ref(flat_g[inp["slots"][keep]]), kv584.unpack_ref(flat_w[inp["slots"][keep]]),
                               atol=2.0**-15, rtol=0.13)
    assert torch.equal(flat_g[inp["slots"][keep]][:, kv584.SCALE_OFFSET:], flat_w[inp["slots"][keep]][:, kv584.SCALE_OFFSET:])


def test_compress_store_split_windows_merge_to_the_reference(device):
    """Windows pooled in 4 parts by separate programs and merged (CSA's -inf half window in entry 0, slot -1):
    the entries match the reference as the one-pass kernel's do, the scales exactly; parts that do not tile the
    window are refused."""
    case = compressor.Case("split", {"shape": (3, 16, 2), "overlap": True}, dtype=torch.float32)
    inp = compressor._inputs(case, torch.device(device), torch.Generator(device=device).manual_seed(5))
    inp["slots"][1] = -1
    want = kv584._flat(compressor.compress_store_ref(**dict(inp, pool=inp["pool"].clone())))
    got = kv584._flat(compressor.compress_store(**dict(inp, pool=inp["pool"].clone()), impl="stream", parts=4,
                                                block_l=2))
    assert torch.equal(got[inp["slots"][1:]][:, kv584.SCALE_OFFSET:], want[inp["slots"][1:]][:, kv584.SCALE_OFFSET:])
    torch.testing.assert_close(kv584.unpack_ref(got), kv584.unpack_ref(want), atol=2.0**-15, rtol=0.13)
    with pytest.raises(ValueError, match="tile"):
        compressor.compress_store(**inp, impl="stream", parts=4, block_l=8)


def test_split_windows_only_for_prefill_sized_entry_counts_below_the_sm_count(monkeypatch):
    monkeypatch.setattr(compressor, "_sms", lambda index: 132)
    monkeypatch.setattr(compressor, "interpreting", lambda: False)
    monkeypatch.setattr(compressor, "STREAM_SPLIT", True)
    gpu = torch.device("cuda", 0)
    assert compressor._split(128, 128, 4, gpu) == 4  # HCA at a 16K-token prefill: 512 programs
    assert compressor._split(64, 128, 4, gpu) == 8
    assert compressor._split(compressor.STREAM_SPLIT_MIN_ENTRIES - 1, 128, 4, gpu) == 1  # a decode step's entries
    assert compressor._split(132, 128, 4, gpu) == 1  # a program per SM already
    assert compressor._split(100, 8, 4, gpu) == 1  # CSA windows: parts would be under 16 rows
    assert compressor._split(128, 128, 4, torch.device("cpu")) == 1
    monkeypatch.setattr(compressor, "STREAM_SPLIT", False)
    assert compressor._split(128, 128, 4, gpu) == 1


def test_hc_reference_matches_hf_hyper_connection():
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    from engine.v4.tiny import TINY
    from kernels.hc import hc_post_ref, hc_pre_ref

    cfg = transformers.DeepseekV4Config(**{k: v for k, v in TINY.items() if k not in ("architectures",)})
    hc = DeepseekV4HyperConnection(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hc.fn.copy_(torch.randn(hc.fn.shape, generator=g) * 0.05)
        hc.base.copy_(torch.randn(hc.base.shape, generator=g))
        hc.scale.copy_(1 + 0.3 * torch.randn(3, generator=g))
    x = torch.randn(2, 3, 4, 64, generator=g)
    with torch.no_grad():
        post, comb, col = hc(x)
    c2, p2, m2 = hc_pre_ref(x, hc.fn, hc.base, hc.scale, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)
    torch.testing.assert_close((c2, p2, m2), (col, post, comb), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m2.sum(-1), torch.ones(2, 3, 4), rtol=0, atol=1e-3)  # doubly stochastic
    torch.testing.assert_close(m2.sum(-2), torch.ones(2, 3, 4), rtol=0, atol=1e-3)
    o = torch.randn(2, 3, 64, generator=g)
    want = post.unsqueeze(-1) * o.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), x)
    torch.testing.assert_close(hc_post_ref(o, x, p2, m2), want, rtol=1e-5, atol=1e-6)


def test_mxfp4_layout_low_nibble_first_and_scales_are_powers_of_two():
    from kernels.mxfp4 import E2M1, mxfp4_dequant_ref, mxfp4_quantize

    w = torch.tensor([[0x21] + [0] * 15], dtype=torch.uint8).view(torch.int8)  # nibbles: 1 (0.5), then 2 (1.0)
    s = torch.tensor([[128]], dtype=torch.uint8).view(torch.float8_e8m0fnu)  # 2^1
    out = mxfp4_dequant_ref(w, s)
    assert out[0, :2].tolist() == [2 * E2M1[1], 2 * E2M1[2]] and out[0, 2:].eq(0).all()
    x = torch.randn(4, 64) * 3
    q, sc = mxfp4_quantize(x)
    back = mxfp4_dequant_ref(q, sc)
    assert (back - x).abs().max() <= (mxfp4_dequant_ref(q, sc).abs().amax() / 6 * 2)  # within an e2m1 step
    assert q.shape == (4, 32) and sc.shape == (4, 2)
    with pytest.raises(ValueError, match="disagree"):
        mxfp4_dequant_ref(q, sc[:, :1])


def test_arch_paths_keyed_on_compute_capability():
    from kernels.arch import fp8_hw_cast
    from kernels.mxfp4 import fp4_hw

    assert fp4_hw((12, 0)) and fp4_hw((10, 0)) and not fp4_hw((9, 0)) and not fp4_hw(None)
    assert fp8_hw_cast((9, 0)) and fp8_hw_cast((12, 0))  # the pool's e4m3 convert on both targets
