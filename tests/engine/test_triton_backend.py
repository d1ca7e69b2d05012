"""The engine's Triton backend: paged latent cache, Triton kernels, greedy tokens equal to the torch backend's.

The models live where this process's kernels run: on CPU every kernel goes through the Triton interpreter
(so the runs are a few steps long), on a GPU they compile and the decode step is a replayed CUDA graph. The
GPU benchmark (benchmarks/kernels_heavy.py) runs 32+ steps. Pages of 8 tokens make short prompts cross page
boundaries. Tokens must equal the torch backend's except at a near-tie (two kernels that round differently
may pick either of two tokens whose logits are within 0.1). On CPU the models are bf16: the interpreter
rounds exactly as torch does. On a GPU they are fp32: there cuBLAS and Triton round bf16 differently, and a
router near-tie then sends a token to another expert, a real change of the step that no logit threshold
can tell from a bug (seen on the H200: a break with margin 1.08 at step 4).
"""

from __future__ import annotations

import pytest
import torch

from engine.generate import generate
from engine.golden import GoldenRecord, compare_records
from engine.loader import load_model
from engine.paged_cache import CacheFull, PagedLatentCache
from engine.triton_decode import GRAPH_MAX_BATCH, PagedDecoder, use_cuda_graph

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [9, 10], [200, 3, 77]]


def _same_tokens(ref, out):
    """None when every prompt matches the reference up to a near-tie, else the comparison table."""
    records = [[GoldenRecord(i, g.prompt, g.tokens, g.margins) for i, g in enumerate(gens)] for gens in (ref, out)]
    result = compare_records(*records)
    return None if result.ok else "\n" + result.table()


@pytest.fixture(scope="module")
def bf16_pair(tiny_dir, kernel_device):
    dtype = torch.bfloat16 if kernel_device == "cpu" else torch.float32
    return (load_model(tiny_dir, dtype=dtype, backend="torch", device=kernel_device),
            load_model(tiny_dir, dtype=dtype, backend="triton", device=kernel_device))


def test_triton_backend_matches_torch_backend_tokens(bf16_pair, kernel_device):
    torch_model, triton_model = bf16_pair
    steps = 5
    ref = generate(torch_model, PROMPTS, steps, mla="absorbed")
    dec = PagedDecoder(triton_model, page_size=8)
    out = dec.generate(PROMPTS, steps)
    assert dec.graphed == (kernel_device == "cuda")  # CPU: eager; GPU: the decode step is a replayed graph
    assert triton_model.ops.backend_of("moe_experts") == "triton"
    assert _same_tokens(ref, out) is None, _same_tokens(ref, out)
    assert all(len(o.margins) == steps for o in out)
    # the paged cache really held the sequences: each one's pages are distinct and its rows are filled
    cache = dec.cache
    lens = [len(p) + steps - 1 for p in PROMPTS]
    assert cache.seq_lens[: len(PROMPTS)].tolist() == lens
    pages = cache.block_table[: len(PROMPTS)].flatten().tolist()
    assert len(set(pages)) == len(pages)
    for b, n in enumerate(lens):
        pos = torch.arange(n, device=cache.pages.device)
        rows = cache.layer(0)[cache.block_table[b, pos // 8].long(), pos % 8]
        assert not torch.isnan(rows.float()).any()
    assert torch.isnan(cache.layer(0).float()).any()  # slots past seq_lens stay poisoned


def test_torch_ops_through_the_paged_path_match_the_dense_path(bf16_pair):
    torch_model, _ = bf16_pair
    ref = generate(torch_model, PROMPTS[:2], 4, mla="absorbed")
    dec = PagedDecoder(torch_model, page_size=8)
    out = dec.generate(PROMPTS[:2], 4)
    assert not dec.graphed  # the torch references sync with the host: never captured
    assert _same_tokens(ref, out) is None, _same_tokens(ref, out)
    eos = ref[0].tokens[1]  # stop the first sequence at its second token
    ref_eos = generate(torch_model, PROMPTS[:2], 4, mla="absorbed", eos_token_id=eos)
    out_eos = PagedDecoder(torch_model, page_size=8).generate(PROMPTS[:2], 4, eos_token_id=eos)
    assert [o.tokens for o in out_eos] == [r.tokens for r in ref_eos]
    assert out_eos[0].tokens[-1] == eos and len(out_eos[0].tokens) == 2


def test_fp8_checkpoint_keeps_fp8_weights_on_the_triton_path(tmp_path, kernel_device):
    from engine.tiny import write_tiny

    d = write_tiny(tmp_path / "fp8", seed=3, fp8=True)
    torch_model = load_model(d, dtype=torch.bfloat16, backend="torch", fp8="keep", device=kernel_device)
    triton_model = load_model(d, dtype=torch.bfloat16, backend="triton", fp8="keep", device=kernel_device)
    experts = triton_model.decoder_layers[1].mlp.experts
    assert experts.gate_proj.dtype == torch.float8_e4m3fn and experts.gate_proj_scale_inv is not None
    ref = generate(torch_model, PROMPTS[:2], 3, mla="absorbed")
    out = PagedDecoder(triton_model, page_size=8).generate(PROMPTS[:2], 3)
    assert _same_tokens(ref, out) is None, _same_tokens(ref, out)


def test_cuda_graphs_only_for_gpu_decode_batches():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert use_cuda_graph(cuda, 1, interpreting=False)
    assert use_cuda_graph(cuda, GRAPH_MAX_BATCH, interpreting=False)
    assert not use_cuda_graph(cuda, GRAPH_MAX_BATCH + 1, interpreting=False)
    assert not use_cuda_graph(cuda, 8, interpreting=True)
    assert not use_cuda_graph(cpu, 8, interpreting=False)


def test_paged_cache_allocates_from_a_pool_and_reports_exhaustion():
    cache = PagedLatentCache(2, 32, 8, num_pages=5, max_batch=3, max_pages_per_seq=3, page_size=4)
    cache.reserve(0, 9)  # 3 pages
    cache.reserve(1, 4)  # 1 page
    assert cache.free_pages() == 1
    with pytest.raises(CacheFull, match="needs 2 more page"):
        cache.reserve(2, 8)
    with pytest.raises(CacheFull, match="exceed the 12 a sequence can hold"):
        cache.reserve(2, 13)
    cache.release(1)
    assert cache.free_pages() == 2
    cache.reserve(2, 4)
    cache.reserve(1, 3)
    assert cache.free_pages() == 0
    pages = cache.block_table[0, :3].tolist() + [int(cache.block_table[1, 0]), int(cache.block_table[2, 0])]
    assert sorted(pages) == [0, 1, 2, 3, 4]  # every page owned by exactly one sequence
    pos = torch.tensor([[0, 8], [1, 2], [3, 0]])
    lat = torch.randn(3, 2, 32).bfloat16()
    pe = torch.randn(3, 2, 8).bfloat16()
    cache.write(1, pos, lat, pe)
    for b in range(3):
        for s in range(2):
            p = int(pos[b, s])
            row = cache.layer(1)[cache.block_table[b, p // 4], p % 4]
            assert torch.equal(row[:32], lat[b, s]) and torch.equal(row[32:], pe[b, s])
    assert torch.isnan(cache.layer(0).float()).all()  # layer 0 untouched
