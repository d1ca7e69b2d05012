"""The op trace behind benchmarks/v4_divergence.py: it records every op call with its own inputs (so a replay
reproduces it), tags calls by layer and forward, finds the discrete choices where two traces part and
gives each flip the reference's margin."""

from __future__ import annotations

import math

import pytest
import torch

from engine.v4.generate import V4Decoder
from engine.v4.trace import Call, OpTrace, choice_flips, choice_margins, local_errors, replay
from kernels.hash_routing import scores_ref, topk_route_ref
from tests.kernels.interpreter import interpreter


def test_trace_replays_every_call_bit_equal_after_the_caches_moved_on(v4_model, v4_prompts):
    dec = V4Decoder(v4_model, len(v4_prompts), max(map(len, v4_prompts)) + 3, graphs=False)
    with OpTrace(v4_model) as tr:
        dec.generate(v4_prompts, 3)
    n = v4_model.cfg.num_hidden_layers
    assert {c.forward for c in tr.calls} == {0, 1, 2}
    for f in range(3):  # two hc_pre per layer per forward, one head
        assert [c.layer for c in tr.of("hc_pre", f)] == [i for i in range(n) for _ in (0, 1)]
        assert [c.layer for c in tr.of("hc_head", f)] == ["head"]
    valid = tr.calls[0].valid
    assert valid is not None and valid.shape == (len(v4_prompts), max(map(len, v4_prompts)))
    assert int(valid.sum()) == sum(map(len, v4_prompts))
    # the prefill's calls replay exactly although later steps rewrote the caches their inputs came from
    for c in tr.calls:
        if c.op == "kv_pack":
            continue
        got, want = replay(c, "torch"), c.out
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            # bit-equal; NaN where the compressor pools a candidate with no source (it goes to the trash slot)
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=str((c.op, c.layer, c.forward)))
    # the trace leaves the model as it was
    assert not any(getattr(f, "__name__", "") == "traced" for f in v4_model.ops._fns.values())


def test_fp32_reference_of_an_fp32_model_is_the_model_itself(v4_model, v4_prompts):
    dec = V4Decoder(v4_model, len(v4_prompts), max(map(len, v4_prompts)) + 1, graphs=False)
    with OpTrace(v4_model, {"hc_pre", "hc_post", "topk_route", "indexer_topk"}) as tr:
        dec.generate(v4_prompts, 1)
    with pytest.MonkeyPatch.context() as mp:  # no Triton here: the torch-vs-fp32 columns alone
        mp.setattr("engine.v4.trace.impl", lambda op, which: None if which == "triton" else _ref(op))
        errs = local_errors(tr)
    assert {e.op for e in errs} == {"hc_pre", "hc_post", "topk_route", "indexer_topk"}
    for e in errs:
        if e.part == "choice":
            assert e.flips["torch/fp32"] == 0 and e.flips["rows"] > 0
        else:
            assert e.torch_vs_fp32 == 0.0 and math.isnan(e.tri_vs_torch)


def _ref(op):
    import importlib

    from engine.v4.ops import OPS

    mod, name = OPS[op]
    return getattr(importlib.import_module(mod), name)


def _route_call(logits, ids, valid=None, forward=0, layer=2):
    w = torch.ones_like(ids, dtype=torch.float32)
    return Call("topk_route", layer, forward, (logits, None, ids.shape[1], 1.0, "sqrtsoftplus"), {}, (w, ids), valid)


def test_choice_flips_names_the_row_and_the_reference_margin():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 8, generator=g)
    _, ids = topk_route_ref(logits, None, 2, 1.0)
    cand = ids.clone()
    cand[1, 1] = next(e for e in range(8) if e not in ids[1].tolist())  # row 1's second expert swapped
    cand[3, 0] = next(e for e in range(8) if e not in ids[3].tolist())  # row 3 too, but it is padding
    valid = torch.tensor([[True, True], [True, False]])
    ref, other = OpTrace.__new__(OpTrace), OpTrace.__new__(OpTrace)
    ref.calls = [_route_call(logits, ids, valid)]
    other.calls = [_route_call(logits, cand, valid)]
    flips = choice_flips(ref, other)
    assert [(f.row, f.op, f.layer) for f in flips] == [(1, "topk_route", 2)]
    s = scores_ref(logits, "sqrtsoftplus")[1].sort(descending=True).values
    assert flips[0].margin == pytest.approx((s[1] - s[2]).item())
    assert flips[0].ref == sorted(ids[1].tolist()) and flips[0].cand == sorted(cand[1].tolist())
    assert choice_flips(ref, ref) == []


def test_indexer_margin_is_infinite_when_every_visible_entry_is_chosen():
    q, w = torch.randn(1, 2, 2, 16), torch.rand(1, 2, 2)
    keys = torch.randn(1, 6, 16)
    nv = torch.tensor([[2, 6]])
    call = Call("indexer_topk", 1, 0, (q, w, keys, nv, 0.25, 3), {}, None, None)
    m = choice_margins(call)
    assert m is not None and math.isinf(m[0]) and math.isfinite(m[1]) and m[1] >= 0


def test_ops_use_switches_every_module_in_place(v4_dir):
    from engine.v4.loader import load_v4

    m = load_v4(v4_dir, dtype=torch.float32, backend="triton")
    assert m.ops.backend_of("hc_post") == "triton"
    m.ops.use({"default": "triton", "hc_post": "torch"})
    assert m.ops.backend_of("hc_post") == "torch" and m.ops.backend_of("hc_pre") == "triton"
    assert all(layer.attn_hc.ops is m.ops for layer in m.model.layers)  # type: ignore[union-attr]


@interpreter
def test_triton_replays_of_an_fp32_model_stay_near_the_reference(v4_model):
    prompts = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    dec = V4Decoder(v4_model, 2, 10, graphs=False)
    with OpTrace(v4_model, {"hc_post", "topk_route"}) as tr:
        dec.generate(prompts, 1)
    errs = {(e.op, e.layer, e.part): e for e in local_errors(tr)}
    assert errs[("hc_post", 0, "streams")].triton_vs_fp32 < 1e-5
    route = [e for k, e in errs.items() if k[0] == "topk_route" and k[2] == "choice"]
    assert route and all(e.flips["triton/torch"] == 0 for e in route)
