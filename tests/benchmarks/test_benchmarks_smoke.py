"""Benchmarks cannot rot: every script in benchmarks/ runs with ``--smoke`` (tiny sizes, CPU, every section
once) in a subprocess and must exit 0 without a section error, in under 60 CPU seconds (CPU time, not wall:
a loaded machine stretches wall time far more than the work a script does).

A script reports a broken section by printing a line that starts with ``section error`` (and exits non-zero);
this test fails on either. Modules that are libraries, not benchmarks, are listed in :data:`LIBRARIES` with
the reason; a new ``benchmarks/*.py`` is picked up automatically.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
LIMIT_S = 60.0  # per script, CPU seconds: a smoke run must stay small; contention on a shared runner inflates CPU time too (20 s alone read 31 s under load)

LIBRARIES = {
    "synth_repo.py": "builds the synthetic repositories other benchmarks review; imported, not run",
    "fp8_gemm_anchor.py": "the DeepSeek-design FP8 GEMM anchor shared by kernels_heavy.py and tune_heavy.py",
}
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_") and p.name not in LIBRARIES)
# scripts whose --smoke runs Triton kernels under the interpreter (they need the one CI installs): those that
# switch it on themselves, and the engine benchmark, whose Triton decoder gets it from the hidden GPU
INTERPRETED = {"engine_decode.py"} | {n for n in SCRIPTS if "TRITON_INTERPRET" in (BENCH / n).read_text()}


def test_every_library_exists_and_every_other_module_is_a_benchmark():
    assert all((BENCH / name).is_file() for name in LIBRARIES), "a listed library was removed: update LIBRARIES"
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_run(script, tmp_path):
    from tests.kernels.interpreter import interpreter_unsupported

    why = interpreter_unsupported() if script in INTERPRETED else None
    if why:
        pytest.skip(why)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OUT")}
    path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)  # keep installed extras
    env.update(PYTHONPATH=path, PYTHONUNBUFFERED="1", OUT=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(BENCH / script), "--smoke"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    log = (proc.stdout + proc.stderr)[-4000:]
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.lstrip().lower().startswith("section error")]
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}:\n{log}"
    assert not errors, f"{script} --smoke: " + "\n".join(errors)
    assert cpu < LIMIT_S, f"{script} --smoke took {cpu:.1f} CPU s ({wall:.1f} s wall; limit {LIMIT_S:.0f} CPU s)"
