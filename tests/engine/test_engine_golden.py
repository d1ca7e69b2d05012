"""Golden files and the comparator: injected token changes are breaks, forced near-ties are near-ties."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from engine.generate import generate
from engine.golden import GoldenError, GoldenRecord, compare_files, compare_records, read_golden, write_golden


def _records(gens):
    return [GoldenRecord(i, g.prompt, g.tokens, g.margins) for i, g in enumerate(gens)]


def test_roundtrip_and_identical_match(tmp_path, tiny_model, prompts):
    recs = _records(generate(tiny_model, prompts, 16))
    path = write_golden(tmp_path / "g.jsonl", recs, model="tiny", mla="naive")
    back = read_golden(path)
    assert back.header["model"] == "tiny" and back.header["format"] == "drift-audit-golden"
    assert [r.tokens for r in back.records] == [r.tokens for r in recs]
    res = compare_files(path, path)
    assert res.ok and [p.status for p in res.prompts] == ["match"] * len(prompts)
    assert all(p.match_length == 16 for p in res.prompts)


def test_injected_one_token_change_is_a_break(tiny_model, prompts):
    ref = _records(generate(tiny_model, prompts, 16))
    k = max(range(16), key=lambda i: ref[1].margins[i])  # a step with a clear winner
    cand = copy.deepcopy(ref)
    cand[1].tokens[k] = (cand[1].tokens[k] + 1) % 256
    res = compare_records(ref, cand, near_tie=0.1)
    assert not res.ok
    p = res.prompts[1]
    assert (p.status, p.match_length, p.first_divergence) == ("break", k, k)
    assert p.expected == ref[1].tokens[k] and p.got == cand[1].tokens[k]
    assert p.reference_margin == pytest.approx(ref[1].margins[k])
    assert [q.status for i, q in enumerate(res.prompts) if i != 1] == ["match"] * (len(prompts) - 1)


def _final_hidden(model, seq: list[int]) -> torch.Tensor:
    """The normed hidden state that produced the logits after ``seq``."""
    t = torch.tensor([seq])
    model.setup_cache(1, len(seq))
    with torch.no_grad():
        h = model.hidden(t, torch.arange(len(seq)).unsqueeze(0))[0, -1]
        return model.model.norm(h)


def _set_margin(model, h: torch.Tensor, winner: int, runner: int, margin: float) -> None:
    """Move ``runner``'s head row along ``h`` so its logit is ``logit[winner] - margin`` at that state."""
    w = model.lm_head.weight
    with torch.no_grad():
        gap = float(w[winner] @ h - w[runner] @ h) - margin
        w[runner] += gap * h / float(h @ h)


def test_forced_near_tie_is_classified_near_tie_and_a_real_flip_a_break(tmp_path, tiny_dir, prompts):
    """Make the model nearly tie at one step, then flip that tie: a near-tie. Flip a clear winner: a break."""
    from engine.loader import load_model

    model = load_model(tiny_dir, dtype=torch.float32)
    prompt = prompts[0]
    base = generate(model, [prompt], 12)[0]
    k = 5
    h = _final_hidden(model, prompt + base.tokens[:k])
    logits = model.lm_head.weight @ h
    winner = base.tokens[k]
    runner = int(logits.topk(2).indices[1])
    saved = model.lm_head.weight.detach().clone()

    _set_margin(model, h, winner, runner, 0.01)  # reference: winner ahead by 0.01
    ref = generate(model, [prompt], 12)[0]
    _set_margin(model, h, winner, runner, -0.01)  # candidate: runner ahead by 0.01
    cand = generate(model, [prompt], 12)[0]
    assert ref.tokens[:k] == cand.tokens[:k] == base.tokens[:k]  # the edit only matters from step k
    assert ref.margins[k] == pytest.approx(0.01, abs=1e-4)
    res = compare_records(_records([ref]), _records([cand]), near_tie=0.1)
    p = res.prompts[0]
    assert (p.status, p.first_divergence, p.expected, p.got) == ("near-tie", k, winner, runner)
    assert res.ok

    with torch.no_grad():
        model.lm_head.weight.copy_(saved)
    _set_margin(model, h, winner, runner, -2.0)  # candidate prefers the runner by a wide margin
    flipped = generate(model, [prompt], 12)[0]
    assert base.margins[k] > 0.1  # the reference had a clear winner at k
    res = compare_records(_records([base]), _records([flipped]), near_tie=0.1)
    assert (res.prompts[0].status, res.prompts[0].first_divergence) == ("break", k)
    assert not res.ok


def test_short_candidate_and_missing_prompt():
    ref = [GoldenRecord(0, [1, 2], [5, 6, 7], [1.0, 1.0, 1.0])]
    res = compare_records(ref, [GoldenRecord(0, [1, 2], [5, 6], [])])
    assert (res.prompts[0].status, res.prompts[0].match_length) == ("short", 2) and not res.ok
    with pytest.raises(GoldenError, match="no decode for reference prompt 0"):
        compare_records(ref, [GoldenRecord(0, [9], [5, 6, 7], [])])


def test_bad_golden_files_name_the_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"format": "drift-audit-golden", "version": 1}) + "\n" + '{"prompt": [1], "tokens": [2, "x"]}\n')
    with pytest.raises(GoldenError, match=r"bad.jsonl:2: 'tokens' must be a list of integer token ids"):
        read_golden(p)
    p.write_text('{"prompt": [1]\n')
    with pytest.raises(GoldenError, match=r"bad.jsonl:1: invalid JSON"):
        read_golden(p)
    p.write_text('{"prompt": [1]}\n')
    with pytest.raises(GoldenError, match=r"bad.jsonl:1: missing field 'tokens'"):
        read_golden(p)
