"""The kernels build for sm80, sm90 and sm120 without a GPU, each on the path its capability selects."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.aot import _specs

ROOT = Path(__file__).resolve().parents[2]


def test_fp8_path_follows_compute_capability():
    for cap, q_type in (((8, 0), "*u8"), ((8, 9), "*fp8e4nv"), ((9, 0), "*fp8e4nv"), ((12, 0), "*fp8e4nv")):
        specs = {name: (sig, consts) for name, _, sig, consts, *_ in _specs(cap)}
        assert specs["act_quant"][0]["q_ptr"] == q_type
        assert specs["act_quant"][1]["HW_CAST"] is (q_type != "*u8")
        assert specs["silu_mul_quant"][1]["HW_CAST"] is (q_type != "*u8")


@pytest.mark.slow
def test_every_kernel_compiles_for_sm80_and_sm120_without_spills():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-m", "kernels.aot", "--arch", "80", "120"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [ln.split() for ln in proc.stdout.splitlines()[1:] if ln.strip()]
    built = {(r[0], r[1]) for r in rows}
    names = {"rmsnorm", "rmsnorm[fp16,plain]", "act_quant", "act_quant[ue8m0]", "act_dequant", "weight_dequant",
             "rope", "rope[positions]", "silu_mul", "silu_mul_quant"}
    assert built == {(n, a) for n in names for a in ("sm_80", "sm_120")}
    assert all(int(r[3]) == 0 for r in rows), proc.stdout  # stack bytes: no spills
