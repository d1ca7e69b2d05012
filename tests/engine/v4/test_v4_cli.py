"""``drift-audit engine generate|golden`` on a V4 checkpoint: config.json's model_type picks the V4 engine."""

from __future__ import annotations

import json

from bot.cli import main


def test_generate_and_golden_read_a_v4_checkpoint(v4_dir, v4_model, capsys):
    from engine.v4.generate import generate

    prompts = [[5, 6, 7], [9, 10]]
    args = ["--model", str(v4_dir), "--prompt-ids", "5,6,7", "--prompt-ids", "9", "10", "--max-new-tokens", "5",
            "--dtype", "float32"]
    assert main(["engine", "generate", *args]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    expected = [g.tokens for g in generate(v4_model, prompts, 5)]
    assert [x["prompt"] for x in lines] == prompts
    assert [x["tokens"] for x in lines] == expected  # the CLI decodes exactly what the V4 engine does

    gold = v4_dir.parent / "cli-golden.jsonl"
    assert main(["engine", "golden", *args, "--out", str(gold)]) == 0
    records = [json.loads(x) for x in gold.read_text().splitlines()[1:]]
    assert [r["tokens"] for r in records] == expected
    capsys.readouterr()
    assert main(["engine", "compare", str(gold), str(gold)]) == 0


def test_both_families_refuse_bad_prompts_before_decoding(v4_model):
    import pytest

    from engine.generate import check_prompts
    from engine.v4.generate import generate

    v = v4_model.cfg.vocab_size
    for prompts, steps, why in (([], 4, "no prompts"), ([[1], []], 4, "prompt 1 is empty"),
                                ([[1, v]], 4, "outside the vocabulary"), ([[1]], 0, "max_new_tokens must be >= 1")):
        with pytest.raises(ValueError, match=why):
            check_prompts(v, prompts, steps)
        with pytest.raises(ValueError, match=why):
            generate(v4_model, prompts, steps)
