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
  Under pytest-xdist they share one ``xdist_group``, so ``--dist loadgroup`` runs that batch once.

The interpreter these kernels are written for is the one CI installs (Triton ≥ :data:`MIN_INTERPRETER`).
An older Triton's interpreter (GPU images pin their own: the H200 image has 3.6) cannot run them (e.g. a
``range`` bounded by a program-id value raises there), so on such a machine the interpreter-only tests
are skipped with the version named, and their kernels are checked compiled by the ``cuda`` variants.

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

MIN_INTERPRETER = (3, 9)  # the oldest Triton whose interpreter the CPU suite has run these kernels on

KERNEL_DEVICE = "cuda" if not interpreting() and torch.cuda.is_available() else "cpu"


def interpreter_unsupported() -> str | None:
    """Why this machine's Triton interpreter cannot run the kernels, or None when it can."""
    import triton

    have = tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())
    if have < MIN_INTERPRETER:
        want = ".".join(map(str, MIN_INTERPRETER))
        return (f"Triton {triton.__version__}'s interpreter cannot run these kernels (CI runs them on >= {want}); "
                "the cuda variants check the compiled kernels here")
    return None
interpreter = pytest.mark.interpreter
DEVICES = [pytest.param("cpu", marks=interpreter)] + (["cuda"] if KERNEL_DEVICE == "cuda" else [])


def elsewhere() -> bool:
    """Whether ``interpreter`` tests must run in a subprocess (this process compiles kernels, or forced)."""
    return (not interpreting() or os.environ.get(FORCE) == "1") and os.environ.get(REPORT) is None


def configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interpreter: written for the Triton interpreter (CPU); in a process "
                                       "that compiles kernels it runs in a TRITON_INTERPRET=1 subprocess")
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's grouping mark (known without xdist too)")


def group(items: list[pytest.Item]) -> None:
    """One xdist group for every interpreter test, so ``--dist loadgroup`` sends the batch to one worker."""
    for item in items:
        if item.get_closest_marker("interpreter") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("triton-interpreter"))


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
    why = interpreter_unsupported()
    if why:
        pytest.skip(why)
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
