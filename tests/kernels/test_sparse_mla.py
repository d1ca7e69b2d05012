"""Sparse MLA decode over the 584-byte pool: chunking of the slots (split + combine with the sink), head
blocks, the prefetching loop, and the launch-config choice."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels import kv584
from kernels.metrics import gemm_diff
from kernels.sparse_mla import SparseConfig, sparse_config, sparse_mla_decode, sparse_mla_decode_ref
from tests.kernels.interpreter import DEVICES, KERNEL_DEVICE


def _case(b, h, k, device, seed=0, pages=2, drop=0.2, dtype=torch.bfloat16):
    gen = torch.Generator(device).manual_seed(seed)
    pool = kv584.new_pool(pages, 16, device)
    n = pages * 16
    kv = torch.randn(n, kv584.HEAD_DIM, generator=gen, device=device)
    kv[:, :64] *= 300.0  # tiles of very different scales: each tile's UE8M0 byte must be picked right
    kv[:, 64:128] *= 1e-3
    kv584.kv584_store_ref(kv, pool, torch.arange(n, device=device))
    idx = torch.randint(0, n, (b, k), generator=gen, device=device, dtype=torch.int32)
    idx = idx.masked_fill(torch.rand(b, k, generator=gen, device=device) < drop, -1)
    q = (torch.randn(b, h, kv584.HEAD_DIM, generator=gen, device=device) * 0.05).to(dtype)
    sinks = torch.randn(h, generator=gen, device=device)
    return {"q": q, "pool": pool, "indices": idx, "sinks": sinks, "scale": kv584.HEAD_DIM ** -0.5}


def _cfg(device, **kw) -> SparseConfig:
    base = SparseConfig(16, 16, 1, 1) if device == "cpu" else SparseConfig(64, 32, 1, 8)
    return dataclasses.replace(base, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_split", [1, 2, 3, 5])
def test_chunk_count_does_not_change_the_result(n_split, device):
    """Chunks of unequal tile counts, merged with the sink once, give the one-pass answer."""
    inp = _case(2, 16, 70, device, seed=n_split)
    ref = sparse_mla_decode_ref(**inp)
    out = sparse_mla_decode(**inp, config=_cfg(device, n_split=n_split))
    assert gemm_diff(out, ref).value < 2e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_split, lazy, l2", [(1, True, 0), (3, True, 0), (3, False, 0), (3, False, 1), (1, False, 2)])
def test_probabilities_exchanged_through_memory_match(n_split, lazy, l2, device):
    """``xchg``: p and its reference max reach the value dots through a per-program scratch (each row's
    lazy rescale decided on the score side); wide logits make rows rescale at different tiles. ``l2``:
    the next tile's rows are prefetched into L2 (a hint; compiled only)."""
    inp = _case(2, 16, 70, device, seed=10 + n_split)
    inp["q"] = (inp["q"].float() * 40).to(inp["q"].dtype)
    ref = sparse_mla_decode_ref(**inp)
    out = sparse_mla_decode(**inp, config=_cfg(device, n_split=n_split, xchg=True, lazy=lazy, l2_prefetch=l2))
    assert gemm_diff(out, ref).value < 2e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("xchg", [False, True])
def test_fused_merge_by_the_last_chunk(xchg, device):
    """``fused_combine``: the chunk that arrives last merges its row (counters reset for the next call)."""
    inp = _case(3, 20, 70, device, seed=30)
    ref = sparse_mla_decode_ref(**inp)
    cfg = _cfg(device, n_split=3, xchg=xchg, fused_combine=True)
    for _ in range(2):  # the second call finds the counters back at zero
        assert gemm_diff(sparse_mla_decode(**inp, config=cfg), ref).value < 2e-5


@pytest.mark.parametrize("device", DEVICES)
def test_calls_of_other_shapes_between_share_the_workspace_safely(device):
    """Partials and scratch live in one reused per-device buffer: a larger call grows it, a smaller one
    reuses it, and each result stays its own."""
    small, big = _case(1, 16, 40, device, seed=20), _case(3, 16, 90, device, seed=21)
    cfg = _cfg(device, n_split=3, xchg=True)
    refs = [sparse_mla_decode_ref(**small), sparse_mla_decode_ref(**big)]
    outs = [sparse_mla_decode(**inp, config=cfg) for inp in (small, big, small)]
    assert gemm_diff(outs[0], refs[0]).value < 2e-5 and gemm_diff(outs[1], refs[1]).value < 2e-5
    assert torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("device", DEVICES)
def test_chunks_with_nothing_valid_stay_finite(device):
    """A chunk whose slots are all -1 contributes nothing (no NaN from its empty softmax)."""
    inp = _case(2, 16, 64, device, seed=3, drop=0.0)
    inp["indices"][:, :40] = -1
    inp["indices"][1] = -1  # the whole row: only the sink, so the output is zero
    out = sparse_mla_decode(**inp, config=_cfg(device, n_split=4))
    assert torch.isfinite(out.float()).all()
    assert out[1].abs().max() == 0
    assert gemm_diff(out, sparse_mla_decode_ref(**inp)).value < 2e-5


@pytest.mark.parametrize("device", DEVICES)
def test_prefetching_and_plain_loops_agree(device):
    inp = _case(2, 16, 50, device, seed=4)
    a = sparse_mla_decode(**inp, config=_cfg(device, n_split=2, prefetch=True))
    b = sparse_mla_decode(**inp, config=_cfg(device, n_split=2, prefetch=False))
    assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_more_heads_than_a_block_and_bf16_partials(device):
    """72 heads: a second, partly masked head block re-reads the same slots; bf16 partials stay within
    the bound (one more bf16 rounding before the combine)."""
    inp = _case(1, 72, 40, device, seed=5)
    ref = sparse_mla_decode_ref(**inp)
    out = sparse_mla_decode(**inp, config=_cfg(device, block_h=64, n_split=2, part_bf16=True))
    assert gemm_diff(out, ref).value < 3e-5
    assert gemm_diff(sparse_mla_decode(**inp), ref).value < 2e-5


@pytest.mark.parametrize("device", DEVICES)
def test_a_large_sink_takes_the_mass(device):
    """A sink far above every logit leaves (almost) nothing for the values."""
    inp = _case(2, 16, 24, device, seed=6)
    inp["sinks"] = torch.full((16,), 60.0, device=device)
    out = sparse_mla_decode(**inp, config=_cfg(device, n_split=2))
    assert out.float().abs().max() < 1e-12  # values reach ~1e3: e^-60 of them
    inp["sinks"] = torch.full((16,), -1e4, device=device)  # a sink far below: the plain softmax
    out = sparse_mla_decode(**inp, config=_cfg(device, n_split=2))
    q, kv = inp["q"].float(), kv584.kv584_load_ref(inp["pool"], inp["indices"].reshape(-1)).view(2, 24, -1)
    s = torch.einsum("bhd,btd->bht", q, kv) * inp["scale"]
    p = s.masked_fill((inp["indices"] < 0).unsqueeze(1), float("-inf")).softmax(-1)
    assert gemm_diff(out, torch.einsum("bht,btd->bhd", p, kv)).value < 2e-5


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_q_rounds_to_bf16_like_the_reference_of_its_bf16_copy(device):
    inp = _case(2, 16, 33, device, seed=7, dtype=torch.float16)
    out = sparse_mla_decode(**inp)
    assert out.dtype == torch.float16
    ref = sparse_mla_decode_ref(**{**inp, "q": inp["q"].bfloat16()})
    assert gemm_diff(out, ref).value < 2e-5


def test_launch_config_fills_one_wave_on_sm90():
    """All 64 heads of a row share each tile (8 warps hold the 64 × 512 fp32 accumulator); rows × chunks
    stay within one wave of 132 programs; no chunk is shorter than two tiles."""
    for b, splits in ((32, 4), (64, 2), (128, 1), (256, 1), (1, 5)):
        cfg = sparse_config(b, 64, 640, (9, 0), True, 132)
        assert (cfg.block_h, cfg.num_warps, cfg.n_split) == (64, 8, splits), (b, cfg)
        assert b * cfg.n_split <= 132 or cfg.n_split == 1
    assert sparse_config(4, 128, 640, (9, 0)).block_h == 64  # two head blocks per row
    assert sparse_config(4, 8, 640, (9, 0)).block_h == 16  # the smallest tensor-core tile
    fp32 = sparse_config(4, 64, 640, (9, 0), low=False)
    assert fp32.block_h == 16 and not fp32.prefetch
    assert sparse_config(2, 16, 40, None).n_split == 2  # the interpreter exercises the combine


def test_rejects_a_q_of_the_wrong_width():
    pool = kv584.new_pool(1, 16)
    with pytest.raises(ValueError, match="q must be"):
        sparse_mla_decode(torch.zeros(1, 2, 448), pool, torch.zeros(1, 4, dtype=torch.int32), torch.zeros(2), 1.0)
    with pytest.raises(ValueError, match="indices must be"):
        sparse_mla_decode(torch.zeros(1, 2, 512), pool, torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2), 1.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lazy", [True, False])
def test_lazy_and_eager_rescaling_match_the_reference(lazy, device):
    """Wide logits (the running max grows by far more than 2^8 within a row) take the rescaling branch;
    skipping it while the max stays within 2^8 of the last one changes nothing beyond rounding."""
    inp = _case(2, 16, 80, device, seed=8, drop=0.1)
    inp["q"] = (inp["q"].float() * 60).to(inp["q"].dtype)
    ref = sparse_mla_decode_ref(**inp)
    s = torch.einsum("bhd,btd->bht", inp["q"].float(),
                     kv584.kv584_load_ref(inp["pool"], inp["indices"].reshape(-1)).view(2, 80, -1)) * inp["scale"]
    assert (s.amax(-1) - s[..., :16].amax(-1)).max() > 8 / 1.4427  # a later tile really raises the max
    out = sparse_mla_decode(**inp, config=_cfg(device, n_split=1, lazy=lazy))
    assert gemm_diff(out, ref).value < 2e-5


def test_fast_launch_reuses_the_compiled_kernel_with_its_constants(monkeypatch):
    """After the first launch of a plan, later launches go to the compiled kernel with every argument in
    signature order (constants included, as Triton's own launch passes them); a caller tensor of other
    alignment is a different key (Triton specialises on it), so it is bound afresh."""
    import kernels.sparse_mla as sm

    calls: list[tuple] = []

    class Compiled:
        def __getitem__(self, grid):
            return lambda *a: calls.append(("fast", grid, a))

    class Jit:
        def __init__(self, fn):
            self.arg_names = fn.arg_names

        def __getitem__(self, grid):
            def run(*a, **kw):
                calls.append(("jit", grid, a, kw))
                return Compiled()
            return run

    monkeypatch.setattr(sm, "_sparse_decode_kernel", Jit(sm._sparse_decode_kernel))
    monkeypatch.setattr(sm, "_combine_kernel", Jit(sm._combine_kernel))
    monkeypatch.setattr(sm, "_INTERP", False)
    monkeypatch.setattr(sm, "capability", lambda dev: (9, 0))
    monkeypatch.setattr(sm, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(sm, "_COMPILED", {})
    sm._plan.cache_clear()
    try:
        inp = _case(4, 64, 256, "cpu", seed=40)
        cfg = SparseConfig(64, 64, 2, 8, 1, False, lazy=False, xchg=True)
        for _ in range(3):
            sparse_mla_decode(**inp, config=cfg)
        kinds = [c[0] for c in calls]
        assert kinds == ["jit", "jit", "fast", "fast", "fast", "fast"]  # split kernel + combine, then reused
        jit_split, fast_split = calls[0], calls[2]
        names = sm._sparse_decode_kernel.arg_names
        assert len(fast_split[2]) == len(names)
        consts = dict(zip(names[len(jit_split[2]):], fast_split[2][len(jit_split[2]):]))
        assert consts == {n: jit_split[3][n] for n in consts} and consts["SPLIT"] is True
        q = inp["q"]
        odd = torch.empty(q.numel() + 8, dtype=q.dtype)[1:q.numel() + 1].view_as(q).copy_(q)  # 2-byte aligned
        sparse_mla_decode(**{**inp, "q": odd}, config=cfg)
        assert [c[0] for c in calls[6:]] == ["jit", "jit"]
    finally:
        sm._plan.cache_clear()


def test_gluon_kernel_taken_on_sm90_with_its_tiles_only():
    """The Gluon kernel (wgmma, cp.async ring) runs where it was written for: asked for, sm90, a 16-bit q,
    64 heads a block and 64-slot tiles; the interpreter, fp32 q, other parts and other tiles take tl."""
    from kernels.sparse_mla import HAVE_GLUON, use_gluon

    g = SparseConfig(64, 64, 2, 8, 2, gluon=True)
    assert use_gluon(g, (9, 0), True, False) is HAVE_GLUON
    assert not use_gluon(g, (9, 0), True, True)  # interpreter
    assert not use_gluon(g, None, True, False)
    assert not use_gluon(g, (8, 0), True, False) and not use_gluon(g, (12, 0), True, False)
    assert not use_gluon(g, (9, 0), False, False)  # fp32 q: fp32 dots
    assert not use_gluon(dataclasses.replace(g, block_t=32), (9, 0), True, False)
    assert not use_gluon(dataclasses.replace(g, gluon=False), (9, 0), True, False)


def _sm90() -> bool:
    from kernels.arch import capability

    return KERNEL_DEVICE == "cuda" and (capability("cuda") or (0, 0))[0] == 9


@pytest.mark.skipif(not _sm90(), reason="the Gluon kernel is sm90-only (wgmma); CPU and other parts run tl")
@pytest.mark.parametrize("b, h, k, n_split, dtype, wide, knobs", [
    (2, 64, 70, 1, torch.bfloat16, False, {}),  # one chunk, a partial tile, the sink in the kernel
    (3, 72, 200, 3, torch.bfloat16, True, {}),  # a second, mostly masked head block; chunks; rescaling
    (2, 16, 130, 2, torch.float16, False, {"l2_prefetch": 1}),  # fewer heads than the block; fp16 q
    (4, 64, 640, 4, torch.bfloat16, False, {"early_parts": 2, "wg_sums": True}),  # V4-Flash's row
    (2, 64, 100, 5, torch.bfloat16, True, {"wg_sums": True}),  # more chunks than tiles: capped
    (3, 72, 330, 2, torch.bfloat16, True, {"row_warps": True, "idx_ahead": True, "l2_prefetch": 1}),  # row a warp
    (2, 64, 130, 1, torch.float16, False, {"row_warps": True}),  # rows a warp, slot numbers loaded at the gather
    (3, 64, 300, 1, torch.bfloat16, True, {"idx_ahead": True, "l2_prefetch": 1}),  # slot numbers a trip ahead
    (3, 72, 330, 2, torch.bfloat16, True, {"idx_ahead": True}),  # ahead without the L2 prefetch; chunks
    (2, 64, 40, 1, torch.float16, False, {"q_async": True, "idx_ahead": True}),  # fp16 q keeps the register path
    (4, 64, 640, 4, torch.bfloat16, True, {"fused_combine": True, "l2_prefetch": 1}),  # the last chunk merges
    (3, 72, 330, 5, torch.bfloat16, False, {"fused_combine": True, "q_async": True, "idx_ahead": True,
                                            "l2_prefetch": 1}),  # two head blocks, each its own counter
])
def test_gluon_kernel_matches_the_reference(b, h, k, n_split, dtype, wide, knobs):
    _check_gluon(b, h, k, n_split, dtype, wide, knobs)


@pytest.mark.skipif(not _sm90(), reason="the Gluon kernel is sm90-only (wgmma); CPU and other parts run tl")
@pytest.mark.parametrize("b, h, k, n_split, dtype, wide, knobs", [
    (2, 64, 70, 1, torch.bfloat16, False, {"num_stages": 3}),  # one chunk, a partial tile, the sink in the kernel
    (3, 72, 330, 2, torch.bfloat16, True, {"num_stages": 3, "l2_prefetch": 1, "lazy": False}),  # two head blocks
    (2, 16, 130, 2, torch.float16, False, {"num_stages": 2, "lazy": False}),  # fewer heads than the block; fp16 q
    (4, 64, 640, 4, torch.bfloat16, True, {"num_stages": 3, "fused_combine": True, "q_async": True, "lazy": False}),
    (2, 64, 100, 5, torch.bfloat16, False, {"num_stages": 3, "fused_combine": True}),  # more chunks than tiles
    (4, 64, 640, 4, torch.bfloat16, True, {"num_stages": 3, "score_split": True, "lazy": False,
                                           "idx_ahead": True, "l2_prefetch": 1}),  # halves meet; slots ahead
    (3, 72, 200, 1, torch.float16, False, {"num_stages": 2, "score_split": True, "l2_prefetch": 1}),  # lazy rescale
    (3, 72, 330, 2, torch.bfloat16, True, {"num_stages": 1, "score_split": True, "producers": 2, "lazy": False,
                                           "idx_ahead": True}),
    (4, 64, 640, 4, torch.bfloat16, False, {"num_stages": 1, "score_split": True, "producers": 2,
                                            "fused_combine": True, "l2_prefetch": 1}),  # two producers, alternate tiles
    (2, 64, 40, 1, torch.bfloat16, False, {"num_stages": 2, "producers": 2}),  # one tile: the second producer idles
])
def test_warp_specialised_kernel_matches_the_reference(b, h, k, n_split, dtype, wide, knobs):
    _check_gluon(b, h, k, n_split, dtype, wide, {"warp_spec": True, **knobs})


def _check_gluon(b, h, k, n_split, dtype, wide, knobs):
    inp = _case(b, h, k, "cuda", seed=50 + k, pages=64, dtype=dtype)
    inp["indices"][-1] = -1  # a row with only the sink
    if wide:
        inp["q"] = (inp["q"].float() * 60).to(dtype)
    ref = sparse_mla_decode_ref(**{**inp, "q": inp["q"].bfloat16()}).to(dtype)
    cfg = dataclasses.replace(SparseConfig(64, 64, n_split, 8, 2, gluon=True), **knobs)
    out = sparse_mla_decode(**inp, config=cfg)
    assert torch.isfinite(out.float()).all() and out[-1].abs().max() == 0
    assert gemm_diff(out, ref).value < 2e-5
    # a second call gives the same bits (the fused merge's counters were reset by the first)
    assert torch.equal(sparse_mla_decode(**inp, config=cfg), out)


def test_gluon_launch_passes_every_constant_and_merges_splits(monkeypatch):
    """On sm90 a gluon config launches the Gluon kernel with every constexpr its signature names (and only
    those), then the combine for a split; the unsplit launch writes the output directly."""
    import kernels.sparse_mla as sm

    calls: list[tuple] = []

    class Jit:
        def __init__(self, fn, name):
            self.arg_names, self.name = fn.arg_names, name

        def __getitem__(self, grid):
            def run(*a, **kw):
                consts = [n for n in self.arg_names[len(a):]]
                assert sorted(n for n in kw if n not in ("num_warps", "num_stages", "maxnreg")) == sorted(consts), (self.name, kw)
                calls.append((self.name, grid, kw))
            return run

    if not sm.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(sm, "_sparse_decode_gluon", Jit(sm._sparse_decode_gluon, "gluon"))
    monkeypatch.setattr(sm, "_sparse_decode_ws", Jit(sm._sparse_decode_ws, "ws"))
    monkeypatch.setattr(sm, "_combine_kernel", Jit(sm._combine_kernel, "combine"))
    monkeypatch.setattr(sm, "_INTERP", False)
    monkeypatch.setattr(sm, "capability", lambda dev: (9, 0))
    monkeypatch.setattr(sm, "_num_sms", lambda dev: 132)
    monkeypatch.setattr(sm, "_COMPILED", {})
    sm._plan.cache_clear()
    try:
        inp = _case(4, 64, 256, "cpu", seed=41)
        cfg = SparseConfig(64, 64, 2, 8, 2, gluon=True, idx_ahead=True, q_async=True, l2_prefetch=1)
        sparse_mla_decode(**inp, config=cfg)
        assert [c[0] for c in calls] == ["gluon", "combine"]
        g = calls[0][2]
        assert g["SPLIT"] is True and g["IDXA"] is True and g["L2PF"] is True and g["num_warps"] == 8
        assert g["QA"] is True and g["FUSED"] is False  # a bf16 q may be copied as it is
        assert calls[0][1] == (4, 2, 1)
        calls.clear()
        sparse_mla_decode(**inp, config=dataclasses.replace(cfg, n_split=1))
        assert [c[0] for c in calls] == ["gluon"] and calls[0][2]["SPLIT"] is False
        calls.clear()
        sparse_mla_decode(**inp, config=dataclasses.replace(cfg, fused_combine=True))  # the last chunk merges
        assert [c[0] for c in calls] == ["gluon"] and calls[0][2]["FUSED"] is True
        calls.clear()
        sparse_mla_decode(**{**inp, "q": inp["q"].half()}, config=cfg)  # fp16 rounds through registers
        assert calls[0][2]["QA"] is False
        calls.clear()
        sparse_mla_decode(**inp, config=dataclasses.replace(cfg, warp_spec=True, num_stages=3, fused_combine=True))
        assert [c[0] for c in calls] == ["ws"]  # the warp-specialised kernel, its last chunk merging
        g = calls[0][2]
        assert g["num_warps"] == 4 and g["STAGES"] == 3 and g["FUSED"] is True and g["NPROD"] == 1
        for nprod in (1, 2):
            if nprod == 2:
                calls.clear()
                sparse_mla_decode(**inp, config=dataclasses.replace(cfg, warp_spec=True, producers=2))
                g = calls[0][2]
            assert (g["maxnreg"], g["CREGS"], g["PREGS"]) == sm.WS_REGS[nprod] and g["NPROD"] == nprod
            # 4 + 4 + 4 nprod warps fit the 64K register file at launch, and the first producer keeps at least
            # the 24 registers a warpgroup can hold after the consumers' (and a second producer's) share
            assert (2 + nprod) * 128 * g["maxnreg"] <= 65536
            assert (2 + nprod) * g["maxnreg"] - 2 * g["CREGS"] - (nprod - 1) * g["PREGS"] >= 24
    finally:
        sm._plan.cache_clear()


def test_sm90_default_takes_the_gluon_kernel_when_chosen(monkeypatch):
    """With Gluon knobs chosen as the default, sm90 (and only sm90) gets a gluon config of the same tiles
    and one-wave chunking; other parts keep the tl exchange kernel."""
    import kernels.sparse_mla as sm

    monkeypatch.setattr(sm, "GLUON_DEFAULT", {"idx_ahead": True})
    monkeypatch.setattr(sm, "HAVE_GLUON", True)
    for b, splits in ((32, 4), (64, 2), (128, 1)):
        cfg = sparse_config(b, 64, 640, (9, 0), True, 132)
        assert cfg.gluon and cfg.idx_ahead and (cfg.block_h, cfg.block_t, cfg.n_split) == (64, 64, splits)
        assert sm.use_gluon(cfg, (9, 0), True, False)
    for cap in ((12, 0), (8, 0)):
        assert not sparse_config(32, 64, 640, cap).gluon and sparse_config(32, 64, 640, cap).xchg
    assert not sparse_config(4, 16, 640, (9, 0)).gluon  # 16 heads: the 16-row tl tiles
    assert not sparse_config(4, 64, 640, (9, 0), low=False).gluon  # fp32 q
