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
