"""The cache protocol: one attention forward in engine/, whichever cache (dense naive, dense latent, paged) is
installed; each cache answers the same queries the same way, also for a prompt fed in chunks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from engine.kv_cache import paged_cache
from engine.paged_cache import PagedLatentCache

ENGINE = Path(__file__).parents[2] / "engine"


def _paged(model, batch: int, max_len: int, page_size: int = 4) -> PagedLatentCache:
    c = model.cfg
    per_seq = -(-max_len // page_size)
    pool = PagedLatentCache(c.num_hidden_layers, c.kv_lora_rank, c.qk_rope_head_dim, batch * per_seq, batch, per_seq,
                            page_size=page_size, dtype=model.model.embed_tokens.weight.dtype,
                            device=model.rope_cos.device)
    for b in range(batch):
        pool.reserve(b, max_len)
    model.use_cache(paged_cache(pool, model.ops))
    return pool


def _install(model, kind: str, batch: int, max_len: int) -> None:
    if kind == "paged":
        _paged(model, batch, max_len)
    else:
        model.setup_cache(batch, max_len, kind.removesuffix("-static"), static=kind.endswith("-static"))


@pytest.mark.parametrize("kind", ["naive", "absorbed", "paged", "naive-static", "absorbed-static"])
def test_chunked_prompt_then_decode_equals_one_prefill(tiny_model, kind):
    """A prompt fed as 7 + 5 tokens, then one decode step, gives the logits of feeding all 13 at once: the
    second chunk must attend to rows the first chunk left in the cache (pages, for the paged cache)."""
    device = tiny_model.rope_cos.device
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(2, 256, (2, 13), generator=g).to(device)
    pos = torch.arange(13, device=device).unsqueeze(0).expand(2, 13)
    with torch.inference_mode():
        _install(tiny_model, "naive", 2, 16)
        want = tiny_model(tokens, pos, last=torch.tensor([11, 12], device=device))
        _install(tiny_model, kind, 2, 16)
        tiny_model(tokens[:, :7], pos[:, :7])
        got_12 = tiny_model(tokens[:, 7:12], pos[:, 7:12])
        got_13 = tiny_model(tokens[:, 12:], pos[:, 12:])
    torch.testing.assert_close(got_12[0], want[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_13[1], want[1], rtol=1e-4, atol=1e-4)


def test_attention_without_a_cache_says_what_to_call(tiny_model):
    tiny_model.kv_cache = None
    with pytest.raises(RuntimeError, match="setup_cache"):
        tiny_model(torch.tensor([[3]]), torch.tensor([[0]]))


def test_paged_decode_step_reads_lengths_from_the_device(tiny_model):
    """A one-token step through the paged cache takes no ``end`` from the host: ``begin`` records the lengths
    in ``seq_lens`` on the device, so the step can be replayed as a graph."""
    pool = _paged(tiny_model, 2, 8)
    pos = torch.tensor([[3], [5]])
    assert tiny_model.kv_cache.begin(pos) is None
    assert pool.seq_lens.tolist() == [4, 6]
    assert tiny_model.kv_cache.begin(torch.tensor([[0, 1], [0, 1]])) == 2
    tiny_model.setup_cache(2, 8, "absorbed", static=True)  # a static cache: the whole length, no sync
    assert tiny_model.kv_cache.begin(pos) == 8


def _calls(tree: ast.AST, name: str) -> int:
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == name)


def test_one_attention_forward_and_no_backend_checks_outside_the_op_set():
    trees = {p.name: ast.parse(p.read_text()) for p in ENGINE.glob("*.py")}
    for name, tree in trees.items():
        if name != "ops.py":
            assert _calls(tree, "backend_of") == 0, f"engine/{name} checks the backend; the OpSet decides"
        if name != "model.py":  # the projections around attention live in MLA.forward only
            assert _calls(tree, "kv_a_proj_with_mqa") == 0 and _calls(tree, "q_a_proj") == 0, name


def test_only_an_all_triton_op_set_is_captured_as_a_graph():
    from engine.ops import OpSet

    assert OpSet("triton").graph_safe
    assert not OpSet("torch").graph_safe
    assert not OpSet({"default": "triton", "paged_mla_decode": "torch"}).graph_safe
