"""The decode benchmark runs end to end on CPU (the GPU run uses the same code with bigger presets)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest


@pytest.mark.slow  # builds the HF model too: ~6 s of CPU
def test_benchmark_quick_cpu_run_prints_the_table(capsys):
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_decode.py"
    spec = importlib.util.spec_from_file_location("engine_decode_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--device", "cpu", "--quick", "--dtype", "float32", "--batches", "1", "--steps", "8",
                     "--parity-steps", "4", "--backends", "torch", "--sections", "table"])
    out = capsys.readouterr().out
    assert rc == 0, out
    row = next(line for line in out.splitlines() if line.startswith("tiny "))
    # HF is the anchor; engine columns carry a ratio to it ("noisy" only when a loaded CPU hides the decode time)
    cells = re.split(r"\s{2,}", row.strip())
    assert cells[:2] == ["tiny", "1"] and len(cells) == 5, row
    assert re.fullmatch(r"[\d,.]+|noisy", cells[2]), row
    assert all(re.fullmatch(r"[\d,.]+ \([\d.]+x\)|[\d,.]+|noisy", c) for c in cells[3:]), row
    parity = [line for line in out.splitlines() if line.startswith("parity tiny")]
    assert len(parity) == 2 and all(line.endswith("-> OK") for line in parity), parity


def _bench_module():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_decode.py"
    spec = importlib.util.spec_from_file_location("engine_decode_bench_roofline", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_roofline_bytes_account_for_every_weight_once(tiny_model):
    """The bound's bytes: non-expert weights + each MoE layer's experts + the embedding rows read add up to
    the model's parameter bytes (with every expert and every embedding row touched)."""
    import torch

    bench = _bench_module()
    params = dict(tiny_model.named_parameters())
    total = sum(p.numel() * p.element_size() for p in params.values())
    emb = params["model.embed_tokens.weight"]
    n_moe = sum(hasattr(layer.mlp, "gate") for layer in tiny_model.model.layers)
    experts = tiny_model.cfg.n_routed_experts
    assert (bench.static_bytes(tiny_model, emb.shape[0]) + n_moe * experts * bench.expert_bytes(tiny_model)
            == total)
    # the routing tap sees one gate call per MoE decoder layer, each with at most tokens x top-k experts
    tap = bench.RoutingTap(tiny_model)
    tiny_model.setup_cache(1, 4)
    with torch.inference_mode():
        tiny_model(torch.tensor([[3]]), torch.tensor([[0]]))
    tap.close()
    moe_decoder = sum(hasattr(layer.mlp, "gate") for layer in tiny_model.decoder_layers)
    assert len(tap.counts) == moe_decoder and all(c == tiny_model.cfg.num_experts_per_tok for c in tap.counts)
