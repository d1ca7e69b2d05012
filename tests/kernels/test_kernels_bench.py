"""The memory-bound benchmark script runs end to end (tiny sizes, CPU interpreter) and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.interpreter import interpreter

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@interpreter  # --smoke runs the kernels under the interpreter, in its own process
def test_benchmark_script_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/kernels_membound.py", "--smoke", "--no-compile", "--no-variants",
         "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "kernels_membound.json").read_text())
    assert data["parity"]["passed"] and data["ceiling"]["max"] > 0
    ops = {b["op"] for b in data["bench"] if "triton_us" in b and "eager_us" in b}
    assert ops == {"rmsnorm", "rmsnorm_residual", "act_quant", "silu_mul", "silu_mul_quant", "rope", "weight_dequant"}
    assert any("anchor_us" in b for b in data["bench"])
    assert "summary" in (tmp_path / "kernels_membound.txt").read_text()
