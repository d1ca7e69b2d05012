"""The V4 decode step is static: fixed-capacity caches, no op that reads a device value on the host (what
makes it capturable as a CUDA graph), and the same tokens as before whatever the capacity."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.v4.generate import V4Decoder, generate

aten = torch.ops.aten
# ops whose result size or value the host must read (each one a sync on CUDA, and a capture error)
HOST_READS = {aten.nonzero.default, aten._local_scalar_dense.default, aten.masked_select.default,
              aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
              aten.bincount.default, aten.is_nonzero.default, aten.equal.default, aten.repeat_interleave.Tensor}


class HostReads(TorchDispatchMode):
    """Records every op that reads a device value on the host, boolean-mask indexing included."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS:
            self.seen.append(str(func))
        if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
            idx = args[1]
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx):
                self.seen.append(f"{func} with a boolean mask")
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def quant_models(tmp_path_factory):
    from engine.v4.loader import load_v4
    from engine.v4.tiny import write_tiny

    wide = write_tiny(tmp_path_factory.mktemp("v4s") / "wide", seed=0, mxfp4=True, head_dim=512,
                      partial_rotary_factor=0.125, num_attention_heads=2, o_groups=2, index_head_dim=64)
    return {"mxfp4": load_v4(wide, dtype=torch.float32, mxfp4="keep")}


def _step_reads(model, prompts, kv="dense") -> list[str]:
    dec = V4Decoder(model, len(prompts), 64, kv=kv, graphs=False)
    dec.generate(prompts, 2)
    with HostReads() as mode:
        dec.step()
    return mode.seen


def test_the_host_read_detector_sees_a_mask_filter():
    with HostReads() as mode:
        x = torch.arange(6.0)
        _ = x[x > 2]
        _ = torch.nonzero(x)
    assert len(mode.seen) >= 2


def test_decode_step_reads_nothing_on_the_host(v4_model, v4_prompts):
    assert _step_reads(v4_model, v4_prompts) == []


def test_decode_step_over_the_fp8_pool_with_mxfp4_experts_reads_nothing_on_the_host(quant_models, v4_prompts):
    assert _step_reads(quant_models["mxfp4"], v4_prompts, kv="fp8") == []


def test_capacity_does_not_change_tokens(v4_model, v4_prompts):
    """Entry slots past what a query sees are masked, not sliced: a roomier cache decodes the same."""
    exact = generate(v4_model, v4_prompts, 12)
    roomy = V4Decoder(v4_model, len(v4_prompts), 200, graphs=False).generate(v4_prompts, 12)
    for a, b in zip(exact, roomy, strict=True):
        assert a.tokens == b.tokens
        assert max(abs(x - y) for x, y in zip(a.margins, b.margins, strict=True)) < 1e-4


def test_decoder_is_reused_and_stops_recording_at_eos(v4_model, v4_prompts):
    first = generate(v4_model, v4_prompts, 10)
    again = generate(v4_model, v4_prompts, 10)  # the same decoder, its caches emptied in place
    assert [g.tokens for g in first] == [g.tokens for g in again]
    eos = first[0].tokens[3]
    cut = generate(v4_model, v4_prompts, 10, eos_token_id=eos)
    for full, short in zip(first, cut, strict=True):
        n = full.tokens.index(eos) + 1 if eos in full.tokens else len(full.tokens)
        assert short.tokens == full.tokens[:n] and len(short.margins) == n


def test_decoder_refuses_prompts_past_its_capacity(v4_model, v4_prompts):
    dec = V4Decoder(v4_model, len(v4_prompts), 16, graphs=False)
    with pytest.raises(ValueError, match="16 tokens"):
        dec.generate(v4_prompts, 8)


@pytest.mark.parametrize("tokens", [2, 9], ids=["gathered experts", "every expert"])
@pytest.mark.parametrize("mxfp4", [False, True], ids=["dense", "mxfp4"])
def test_static_experts_equal_the_references(tokens, mxfp4):
    from engine.v4.moe import experts_static
    from kernels.mxfp4 import mxfp4_moe_ref, mxfp4_quantize, swiglu_moe_ref

    g = torch.Generator().manual_seed(0)
    e, k, h, i = 24, 3, 64, 32
    x = torch.randn(tokens, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, generator=g)
    gu, dn = torch.randn(e, 2 * i, h, generator=g) / 8, torch.randn(e, h, i, generator=g) / 6
    assert (3 * tokens * k < e) == (tokens == 2)
    if mxfp4:
        (gq, gs), (dq, ds) = mxfp4_quantize(gu), mxfp4_quantize(dn)
        ref = mxfp4_moe_ref(x, w, ids, gq, gs, dq, ds, 1.0)
        got = experts_static(x, w, ids, gq, dq, 1.0, gs, ds)
    else:
        ref = swiglu_moe_ref(x, w, ids, gu, dn, 1.0)
        got = experts_static(x, w, ids, gu, dn, 1.0)
    assert ref.abs().max() > 0.1
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_rope_tail_is_rope_ref_on_the_tail():
    """The complex-product rope equals :func:`kernels.rope.rope_ref` on the rope channels and leaves the
    others as they were; its conjugate rotates back."""
    from engine.v4.layers import rope_rot, rope_tail
    from kernels.rope import rope_ref, yarn_freqs

    g = torch.Generator().manual_seed(0)
    cos, sin = yarn_freqs(16, 64, 10000.0)
    pos = torch.randint(0, 64, (2, 5), generator=g)
    x = torch.randn(2, 5, 3, 48, generator=g)
    rot = rope_rot(cos, sin)[pos].unsqueeze(2)
    y = rope_tail(x, rot)
    assert torch.equal(y[..., :32], x[..., :32])
    torch.testing.assert_close(y[..., 32:], rope_ref(x[..., 32:], cos[pos].unsqueeze(2), sin[pos].unsqueeze(2)),
                               atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rope_tail(y, rot.conj()), x, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cuda_graph_decode_equals_eager_decode(v4_dir, v4_prompts, backend):
    from engine.v4.generate import decoder_for
    from engine.v4.loader import load_v4

    model = load_v4(v4_dir, dtype=torch.float32, device="cuda", backend=backend)
    eager = generate(model, v4_prompts, 16, graphs=False)
    graphed = generate(model, v4_prompts, 16, graphs=True)
    assert decoder_for(model, len(v4_prompts), max(map(len, v4_prompts)) + 16, graphs=True).graphed
    for a, b in zip(eager, graphed, strict=True):
        assert a.tokens == b.tokens
        assert max(abs(x - y) for x, y in zip(a.margins, b.margins, strict=True)) < 1e-4


@pytest.mark.parametrize("tokens", [1, 9], ids=["gathered experts", "every expert"])
def test_static_w4a8_experts_equal_the_reference(tokens):
    from engine.v4.moe import experts_static
    from kernels.mxfp4 import mxfp4_moe_w4a8_ref, mxfp4_quantize

    g = torch.Generator().manual_seed(1)
    e, k, h, i = 24, 3, 256, 128
    x = torch.randn(tokens, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, generator=g)
    (gq, gs), (dq, ds) = mxfp4_quantize(torch.randn(e, 2 * i, h, generator=g) / 16), \
        mxfp4_quantize(torch.randn(e, h, i, generator=g) / 11)
    ref = mxfp4_moe_w4a8_ref(x, w, ids, gq, gs, dq, ds, 1.0)
    plain = experts_static(x, w, ids, gq, dq, 1.0, gs, ds)
    got = experts_static(x, w, ids, gq, dq, 1.0, gs, ds, act_block=128)
    assert (plain - ref).abs().max() > 1e-4  # the fp8 activations matter
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_qat_reaches_the_mxfp4_experts(tmp_path, v4_prompts):
    from engine.v4.loader import load_v4
    from engine.v4.tiny import write_tiny

    model = load_v4(write_tiny(tmp_path / "mx", seed=0, mxfp4=True), dtype=torch.float32, mxfp4="keep")
    plain = generate(model, v4_prompts, 2)
    model.set_qat(True)
    assert all(layer.mlp.qat for layer in model.model.layers)
    qat = generate(model, v4_prompts, 2)
    assert max(abs(a.margins[0] - b.margins[0]) for a, b in zip(plain, qat, strict=True)) > 1e-4
