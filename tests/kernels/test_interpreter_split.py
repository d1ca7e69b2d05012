"""Interpreter-only tests in a process that compiles kernels: they run in one TRITON_INTERPRET=1 subprocess,
and what happened there (pass, failure and its message) is what the test reports here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kernels.arch import interpreting
from tests.kernels.interpreter import FORCE, KERNEL_DEVICE, REPORT, ROOT, interpreter, interpreter_unsupported

PROBE = "DRIFT_AUDIT_INTERP_PROBE"


@interpreter
def test_interpreter_tests_run_with_the_interpreter_on():
    assert interpreting() and KERNEL_DEVICE == "cpu"
    if os.environ.get(REPORT):  # the subprocess: GPUs hidden, so no test there hands a kernel a CUDA tensor
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


if os.environ.get(PROBE):  # collected only by test_the_subprocess_outcome_is_the_reported_one

    @interpreter
    def test_probe():
        assert os.environ.get(REPORT), "ran in the parent process"
        assert os.environ[PROBE] != "fail", "probe-boom"


def _run(mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, FORCE: "1", PROBE: mode}
    env.pop(REPORT, None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/kernels/test_interpreter_split.py::test_probe"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_subprocess_outcome_is_the_reported_one():
    if interpreter_unsupported():
        pytest.skip(interpreter_unsupported())
    ok = _run("pass")
    assert ok.returncode == 0, ok.stdout[-2000:]
    bad = _run("fail")
    assert bad.returncode == 1, bad.stdout[-2000:]
    assert "failed under TRITON_INTERPRET=1 (subprocess)" in bad.stdout and "probe-boom" in bad.stdout
