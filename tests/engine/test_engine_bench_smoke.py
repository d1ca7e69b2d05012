"""The decode benchmark runs end to end on CPU (the GPU run uses the same code with bigger presets)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.mark.slow  # builds the HF model too: ~6 s of CPU
def test_benchmark_quick_cpu_run_prints_the_table(capsys):
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_decode.py"
    spec = importlib.util.spec_from_file_location("engine_decode_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--device", "cpu", "--quick", "--dtype", "float32", "--batches", "1", "--steps", "3",
                     "--parity-steps", "4", "--backends", "torch"])
    out = capsys.readouterr().out
    assert rc == 0, out
    row = next(line for line in out.splitlines() if line.startswith("tiny "))
    assert "x)" in row  # engine columns carry a ratio against the HF anchor measured in this run
    parity = [line for line in out.splitlines() if line.startswith("parity tiny")]
    assert len(parity) == 2 and all(line.endswith("-> OK") for line in parity), parity
