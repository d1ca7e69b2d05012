"""The TP shard table: every weight has a placement, and a 2-rank run (two processes, gloo over loopback)
reproduces the single-process logits."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from engine.sharding import TP_SHARDING, ShardingError, pattern_of, placement, shard


def test_every_checkpoint_tensor_has_a_placement(tiny_dir):
    from engine.loader import checkpoint_index

    names = list(checkpoint_index(tiny_dir))
    assert {placement(n) for n in names} == {"column", "row", "replicated"}
    assert pattern_of("model.layers.7.mlp.experts.12.down_proj.weight_scale_inv") == "*.mlp.experts.*.down_proj.weight"


def test_table_is_a_plain_literal():
    import ast
    import inspect

    import engine.sharding as mod

    tree = ast.parse(inspect.getsource(mod))
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "TP_SHARDING")
    assert ast.literal_eval(node.value) == TP_SHARDING  # readable by a parser, not just by importing


def test_shards_tile_the_tensor():
    w = torch.arange(8 * 6).view(8, 6)
    cols = [shard("model.layers.0.self_attn.q_b_proj.weight", w, r, 2) for r in range(2)]
    rows = [shard("model.layers.0.self_attn.o_proj.weight", w, r, 3) for r in range(3)]
    assert torch.equal(torch.cat(cols, 0), w) and torch.equal(torch.cat(rows, 1), w)
    assert shard("model.norm.weight", w, 1, 2) is w
    with pytest.raises(ShardingError, match="dim 1 of size 6 does not split over 4 ranks"):
        shard("model.layers.0.mlp.down_proj.weight", w, 0, 4)
    with pytest.raises(ShardingError, match="no tensor-parallel placement for 'model.layers.0.mlp.mystery.weight'"):
        placement("model.layers.0.mlp.mystery.weight")


def _rank_main(rank: int, world: int, ckpt: str, rdv: str, tokens: torch.Tensor, out: str) -> None:
    import torch.distributed as dist

    from engine.generate import prefill_logits
    from engine.loader import load_model
    from engine.model import TP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)

    def all_reduce(t):
        dist.all_reduce(t)
        return t

    def all_gather(t):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=-1)

    model = load_model(ckpt, dtype=torch.float32, tp=TP(rank, world, all_reduce, all_gather))
    logits = prefill_logits(model, tokens, "absorbed")
    if rank == 0:
        torch.save({"logits": logits, "heads": model.model.layers[0].self_attn.n_heads}, out)
    dist.destroy_process_group()
    # The result is on disk and the group is gone: leave without running C++ static destructors, where gloo's
    # threads can std::terminate the process (SIGABRT, "terminate called without an active exception", seen in CI).
    os._exit(0)


@pytest.mark.slow  # two spawned processes: ~8 s of CPU
def test_two_rank_tensor_parallel_matches_one_rank(tmp_path, tiny_dir, tiny_model):
    from engine.generate import prefill_logits

    tokens = torch.randint(2, 256, (2, 7), generator=torch.Generator().manual_seed(4))
    out = tmp_path / "rank0.pt"
    mp.start_processes(_rank_main, args=(2, str(tiny_dir), str(tmp_path / "rdv"), tokens, str(out)), nprocs=2,
                       start_method="spawn", join=True)
    got = torch.load(out)
    assert got["heads"] == 2  # each rank really held half of the 4 heads
    want = prefill_logits(tiny_model, tokens, "absorbed")
    torch.testing.assert_close(got["logits"], want, atol=1e-4, rtol=1e-4)


def test_a_tree_sitter_fact_query_reads_the_table():
    """What a drift rule does: pull (pattern, placement) rows out of the source with a tree-sitter query."""
    import inspect

    import tree_sitter as ts

    import engine.sharding as mod
    from checks import syntax

    query = ts.Query(syntax.language("python"), """
        (assignment left: (identifier) @name (#eq? @name "TP_SHARDING")
          right: (dictionary (pair key: (string (string_content) @key) value: (string (string_content) @value))))
    """)
    tree = syntax.parse("python", inspect.getsource(mod).encode())
    rows = {}
    for _, caps in ts.QueryCursor(query).matches(tree.root_node):
        rows[syntax.text(caps["key"][0])] = syntax.text(caps["value"][0])
    assert rows == TP_SHARDING


def test_fp8_weights_split_on_scale_block_boundaries():
    name = "model.layers.0.self_attn.q_b_proj.weight"
    w = torch.zeros(256, 64).to(torch.float8_e4m3fn)
    s = torch.arange(2.0).view(2, 1)
    assert shard(name, w, 1, 2).shape == (128, 64)
    assert torch.equal(shard(name + "_scale_inv", s, 1, 2), s[1:])
    with pytest.raises(ShardingError, match="split of 64 is not a multiple of the 128-wide fp8 scale block"):
        shard(name, w, 0, 4)
