"""Decode suite: the engine's greedy decode of the seed-0 tiny checkpoint against the committed golden.

Runs on CPU in CI and on a GPU runner alike (cuda when present). Set ``DRIFT_AUDIT_DECODE_OUT`` to also
write this run's decode as a golden-format file, for ``drift-audit engine compare`` or the runner.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine.generate import generate
from engine.golden import GoldenRecord, compare_records, read_golden, write_golden

GOLDEN = Path(__file__).parent / "goldens" / "tiny_seed0_fp32.jsonl"
# fp32 everywhere: kernels that reorder fp32 sums move logits by ~1e-5, so only a step whose reference
# margin is below 1e-3 may legitimately flip (the golden has one at 9.9e-4, prompt 0).
NEAR_TIE = 1e-3


@pytest.fixture(scope="module")
def golden():
    return read_golden(GOLDEN)


@pytest.fixture(scope="module")
def golden_model(golden, tmp_path_factory):
    from engine.loader import load_model
    from engine.tiny import write_tiny

    assert golden.header["model"] == "engine.tiny preset=tiny seed=0"
    d = write_tiny(tmp_path_factory.mktemp("golden") / "ckpt", seed=0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return load_model(d, dtype=torch.float32, device=device)


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
def test_decode_matches_golden(golden, golden_model, mla):
    prompts = [r.prompt for r in golden.records]
    outs = generate(golden_model, prompts, golden.header["max_new_tokens"], mla=mla)
    cand = [GoldenRecord(i, o.prompt, o.tokens, o.margins) for i, o in enumerate(outs)]
    if os.environ.get("DRIFT_AUDIT_DECODE_OUT"):
        write_golden(Path(os.environ["DRIFT_AUDIT_DECODE_OUT"]).with_suffix(f".{mla}.jsonl"), cand,
                     model=golden.header["model"], mla=mla, dtype="float32", device=str(golden_model.rope_cos.device),
                     backend="torch", max_new_tokens=golden.header["max_new_tokens"])
    result = compare_records(golden.records, cand, near_tie=NEAR_TIE)
    assert result.ok, "\n" + result.table()
    # margins are reproduced too, not just the argmax
    for ref, got in zip(golden.records, cand, strict=True):
        n = next((p.match_length for p in result.prompts if p.index == ref.index), len(ref.tokens))
        assert max(abs(a - b) for a, b in zip(ref.margins[:n], got.margins[:n], strict=True)) < 1e-3
