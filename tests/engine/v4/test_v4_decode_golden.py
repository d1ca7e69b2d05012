"""Decode suite for the V4 engine: greedy decode of the seed-0 tiny V4 checkpoint against the committed golden,
on the torch path and on the Triton path (hyper-connections, routers, indexer and MXFP4 experts as Triton
kernels), near-tie aware.

Runs on CPU in CI (the Triton path through the interpreter, on a shorter decode) and on a GPU runner
(cuda when present, full length). ``DRIFT_AUDIT_DECODE_OUT`` also writes this run's decodes as goldens.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine.golden import GoldenRecord, compare_records, read_golden, write_golden
from engine.v4.generate import generate
from tests.kernels.interpreter import KERNEL_DEVICE as DEVICE  # where this process's Triton kernels run

GOLDEN = Path(__file__).parent / "goldens" / "tiny_v4_seed0_fp32.jsonl"
NEAR_TIE = 1e-3  # fp32 on both sides: only a step whose reference margin is below 1e-3 may flip


@pytest.fixture(scope="module")
def golden():
    return read_golden(GOLDEN)


@pytest.fixture(scope="module")
def golden_dir(golden, tmp_path_factory):
    from engine.v4.tiny import write_tiny

    assert golden.header["model"] == "engine.v4.tiny preset=tiny seed=0 mxfp4"
    return write_tiny(tmp_path_factory.mktemp("v4golden") / "ckpt", seed=0, mxfp4=True)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_decode_matches_golden(golden, golden_dir, backend):
    from engine.v4.loader import load_v4

    model = load_v4(golden_dir, dtype=torch.float32, device=DEVICE, backend=backend, mxfp4="keep")
    records = golden.records
    steps = golden.header["max_new_tokens"]
    if backend == "triton" and DEVICE == "cpu":  # the interpreter runs each program in Python: keep it short
        records, steps = [records[0]], 3  # the interpreter pays per program: the 3-token prompt
    outs = generate(model, [r.prompt for r in records], steps)
    cand = [GoldenRecord(r.index, o.prompt, o.tokens, o.margins) for r, o in zip(records, outs, strict=True)]
    if os.environ.get("DRIFT_AUDIT_DECODE_OUT"):
        write_golden(Path(os.environ["DRIFT_AUDIT_DECODE_OUT"]).with_suffix(f".v4.{backend}.jsonl"), cand,
                     model=golden.header["model"], dtype="float32", device=DEVICE, backend=backend,
                     max_new_tokens=steps)
    ref = [GoldenRecord(r.index, r.prompt, r.tokens[:steps], r.margins[:steps]) for r in records]
    result = compare_records(ref, cand, near_tie=NEAR_TIE)
    assert result.ok, "\n" + result.table()
    if backend == "triton":
        used = model.ops.resolved()
        assert {op for op, b in used.items() if b == "triton"} >= {"hc_pre", "hc_post", "topk_route", "hash_route",
                                                                  "indexer_topk", "moe_mxfp4"}
    for r, got in zip(ref, cand, strict=True):
        n = next((p.match_length for p in result.prompts if p.index == r.index), len(r.tokens))
        assert max(abs(a - b) for a, b in zip(r.margins[:n], got.margins[:n], strict=True)) < 1e-3
