"""Tests that need the Triton interpreter, on a machine whose kernels compile for a GPU.

Triton picks interpreter or compiler when a kernel is defined (``@triton.jit``), once per process, so a
GPU process cannot run a kernel on CPU tensors. Tests come in two kinds:

- tests that run on the device they are given take the ``device`` fixture (:data:`KERNEL_DEVICE`: CUDA
  where this process compiles kernels, else the CPU through the interpreter), or parametrize over
  :data:`DEVICES`;
- tests written for the interpreter (its CPU-sized parity cases, checks of its rounding) carry the
  ``interpreter`` mark. In a process that compiles kernels they do not run in it: all of them run once, in
  one ``pytest`` subprocess with ``TRITON_INTERPRET=1`` and the GPUs hidden, and each test reports the
  outcome it had there. ``DRIFT_AUDIT_INTERP_SUBPROCESS=1`` forces that path on CPU too (to test it).

``tests/kernels/conftest.py`` and ``tests/engine/conftest.py`` install :func:`pyfunc_call` as their
``pytest_pyfunc_call`` hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import kernels  # noqa: F401  (turns the interpreter on where there is no GPU, before triton is used)
from kernels.arch import interpreting

ROOT = Path(__file__).resolve().parents[2]
FORCE = "DRIFT_AUDIT_INTERP_SUBPROCESS"
REPORT = "DRIFT_AUDIT_INTERP_REPORT"

KERNEL_DEVICE = "cuda" if not interpreting() and torch.cuda.is_available() else "cpu"
interpreter = pytest.mark.interpreter
DEVICES = [pytest.param("cpu", marks=interpreter)] + (["cuda"] if KERNEL_DEVICE == "cuda" else [])


def elsewhere() -> bool:
    """Whether ``interpreter`` tests must run in a subprocess (this process compiles kernels, or forced)."""
    return (not interpreting() or os.environ.get(FORCE) == "1") and os.environ.get(REPORT) is None


def configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interpreter: written for the Triton interpreter (CPU); in a process "
                                       "that compiles kernels it runs in a TRITON_INTERPRET=1 subprocess")


def _run_batch(nodeids: list[str]) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = {k: v for k, v in os.environ.items() if k != FORCE}
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", **{REPORT: str(report)})
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.kernels.interpreter",
               *nodeids]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
        results = json.loads(report.read_text()) if report.exists() else {}
    results["__log__"] = {"text": (proc.stdout + proc.stderr)[-4000:]}
    return results


def pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Answer an ``interpreter`` test from the subprocess batch instead of running it here."""
    if pyfuncitem.get_closest_marker("interpreter") is None or not elsewhere():
        return None
    config = pyfuncitem.config
    results = getattr(config, "_interp_results", None)
    if results is None:
        ids = [i.nodeid for i in pyfuncitem.session.items if i.get_closest_marker("interpreter") is not None]
        results = config._interp_results = _run_batch(ids)  # type: ignore[attr-defined]
    got = results.get(pyfuncitem.nodeid)
    if got is None:
        pytest.fail(f"did not run in the TRITON_INTERPRET=1 subprocess; its output ends:\n{results['__log__']['text']}",
                    pytrace=False)
    if got["outcome"] == "skipped":
        pytest.skip(f"(TRITON_INTERPRET=1 subprocess) {got['text']}")
    if got["outcome"] != "passed":
        pytest.fail(f"failed under TRITON_INTERPRET=1 (subprocess):\n{got['text']}", pytrace=False)
    return True


# --- the subprocess side: loaded there with ``-p tests.kernels.interpreter`` -----------------------------

_outcomes: dict[str, dict] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get(REPORT) is None:
        return
    prev = _outcomes.get(report.nodeid)
    if prev is not None and prev["outcome"] != "passed":
        return  # keep the first failure or skip (a teardown after a failed call passes)
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    else:
        text = report.longreprtext
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.nodeid] = {"outcome": report.outcome, "text": text[-3000:]}


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(REPORT)
    if path:
        Path(path).write_text(json.dumps(_outcomes))


def assert_same(out: torch.Tensor, ref: torch.Tensor, device: str) -> None:
    """Bit-equal under the interpreter (the kernels' EXACT rounding); within one bf16 rounding where they
    compile, since the GPU contracts multiply-adds and its rsqrt/exp are not the CPU's."""
    if device == "cpu":
        assert torch.equal(out, ref), (out - ref).abs().max()
    else:
        torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=2**-7)
