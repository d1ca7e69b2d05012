"""``drift-audit engine tiny|generate|golden|compare`` through the real console-script entry point."""

from __future__ import annotations

import json
import subprocess
import sys

from bot.cli import main


def test_tiny_generate_golden_compare(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert main(["engine", "tiny", str(ckpt), "--seed", "3", "--set", '{"num_nextn_predict_layers": 0}']) == 0
    assert (ckpt / "model.safetensors.index.json").exists()
    capsys.readouterr()

    args = ["--model", str(ckpt), "--prompt-ids", "5,6,7", "--prompt-ids", "9", "10", "11,12", "--max-new-tokens", "6",
            "--dtype", "float32"]
    assert main(["engine", "generate", *args, "--mla", "absorbed"]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(x) for x in captured.out.splitlines()]
    assert [x["prompt"] for x in lines] == [[5, 6, 7], [9, 10, 11, 12]]
    assert all(len(x["tokens"]) == 6 for x in lines)
    assert "loading" in captured.err and "100%" in captured.err  # load progress is shown

    gold = tmp_path / "g.jsonl"
    assert main(["engine", "golden", *args, "--out", str(gold)]) == 0
    records = [json.loads(x) for x in gold.read_text().splitlines()[1:]]
    assert [r["tokens"] for r in records] == [x["tokens"] for x in lines]  # naive == absorbed here
    capsys.readouterr()

    assert main(["engine", "compare", str(gold), str(gold)]) == 0
    assert "OK" in capsys.readouterr().out

    broken = tmp_path / "b.jsonl"
    text = gold.read_text().splitlines()
    rec = json.loads(text[2])
    rec["tokens"][0] = (rec["tokens"][0] + 1) % 256
    text[2] = json.dumps(rec)
    broken.write_text("\n".join(text) + "\n")
    assert main(["engine", "compare", str(gold), str(broken), "--near-tie", "0", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["prompts"][1]["status"] == "break"
    assert report["prompts"][1]["first_divergence"] == 0


def test_bad_inputs_exit_2_with_a_message(tmp_path, capsys):
    assert main(["engine", "generate", "--model", str(tmp_path), "--prompt-ids", "1,2"]) == 2
    assert "config.json: not found" in capsys.readouterr().err
    assert main(["engine", "compare", str(tmp_path / "nope.jsonl"), str(tmp_path / "nope.jsonl")]) == 2
    assert "no such golden file" in capsys.readouterr().err
    bad = tmp_path / "prompts.jsonl"
    bad.write_text("[1, 2]\n[3, oops]\n")
    assert main(["engine", "generate", "--model", str(tmp_path), "--prompts", str(bad)]) == 2
    assert f"{bad}:2: invalid JSON" in capsys.readouterr().err
    assert main(["engine", "generate", "--model", str(tmp_path), "--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert "cannot read prompts file" in capsys.readouterr().err


def test_cli_module_is_import_light():
    code = ("import sys, engine.cli; bad = [m for m in ('torch', 'git', 'tree_sitter', 'triton') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_tiny_refuses_a_misspelled_set_field(tmp_path, capsys):
    assert main(["engine", "tiny", str(tmp_path / "a"), "--set", '{"num_hiden_layers": 1}']) == 2
    assert "did you mean 'num_hidden_layers'" in capsys.readouterr().err
    assert main(["engine", "tiny", str(tmp_path / "b"), "--arch", "deepseek_v4", "--set", '{"nosuch_field": 1}']) == 2
    assert "'nosuch_field' is not a deepseek_v4 config field" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing half-written
