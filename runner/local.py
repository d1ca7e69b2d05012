"""Run a TestPlan's suites as subprocesses on this machine and read their results back.

Each suite runs in its own process group with its output going to a file (a
pipe can fill up, and a grandchild holding it open would block the reader). At
the timeout the whole group gets SIGTERM, then SIGKILL, so nothing a suite
started outlives it and a wedged GPU test becomes a ``timeout`` result, never a
hang. How a suite ended (signal, exit code, a CUDA error in its output) maps to
one of the distinct outcomes the report shows.

Imports only the standard library and runner/compat, so the same code runs on
a bare GPU image.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner import device, metrics, runnable
from runner.compat import model
from runner.signing import PYTEST

TAIL_LINES = 60
TAIL_CHARS = 4000
# A suite that cannot run here says why in one line; its traceback is not the reviewer's business.
NOT_RUNNABLE_TAIL_LINES = 6
NOT_RUNNABLE_TAIL_CHARS = 600
KILL_GRACE_S = 5.0

_CUDA_ERROR = re.compile(
    r"CUDA error|cudaError\w*|CUDA_ERROR_\w+|illegal memory access|device-side assert triggered"
    r"|unspecified launch failure|misaligned address|CUDA out of memory|OutOfMemoryError: CUDA"
)
_SIGNAL_OUTCOME = {
    signal.SIGSEGV: "segfault",
    signal.SIGBUS: "segfault",
    signal.SIGILL: "segfault",
    signal.SIGFPE: "segfault",
    signal.SIGABRT: "abort",
}

Progress = Callable[[str], Any]


def is_pytest(command: str) -> bool:
    return bool(PYTEST.search(command))


def run_plan(
    plan,
    repo_dir: str | Callable[[], str],
    *,
    labels: list[str] | None = None,
    capability: Any = None,
    progress: Progress | None = None,
):
    """Run ``plan``'s suites (those for ``labels``, or all) in ``repo_dir``, the head tree.

    ``repo_dir`` may be a callable that makes the tree: it is called once, before the first suite that
    runs, so a plan whose suites all need another machine makes no tree. ``capability`` is None to
    detect this machine's GPU, ``"cpu"`` for none, or ``"9.0"`` / ``(9, 0)`` to state it. Suites whose
    runner label or ``requires`` this machine cannot satisfy are skipped with the reason.
    """
    m = model()
    tree: list[str] = []

    def root() -> str:
        if not tree:
            path = repo_dir() if callable(repo_dir) else repo_dir
            if not Path(path).is_dir():
                raise ValueError(f"{path}: not a directory; pass the directory holding the head tree")
            tree.append(path)
        return tree[0]

    if not callable(repo_dir):
        root()  # a wrong path is the caller's mistake: say so before any suite is looked at
    suites = [s for s in plan.suites if labels is None or s.runner in labels]
    if not suites:  # nothing to run costs nothing: no GPU probe (importing torch alone takes seconds)
        return m.Results(audit_id=plan.audit_id, head_sha=plan.head_sha)
    gpu = _resolve_gpu(capability)
    cap = gpu.capability if gpu else None
    asked = labels[0] if labels and len(labels) == 1 else None
    if asked and device.label_unmet(asked, cap) is not None:
        asked = None  # say what this machine is, not what it was asked to be
    fp = device.fingerprint(asked, gpu)
    results = m.Results(audit_id=plan.audit_id, head_sha=plan.head_sha, devices=[fp])
    for i, suite in enumerate(suites, 1):
        unmet = device.label_unmet(suite.runner, cap, gpu.name if gpu else None) or device.requires_unmet(
            suite.requires, cap
        )
        if unmet:
            results.suites.append(m.SuiteResult(suite=suite.id, runner=suite.runner, outcome="skipped", reason=unmet))
            _say(progress, f"[{i}/{len(suites)}] {suite.id} on {suite.runner}: skipped ({unmet})")
            continue
        _say(progress, f"[{i}/{len(suites)}] {suite.id} on {suite.runner}: running")
        result = run_suite(suite, root())
        results.suites.append(result)
        _say(progress, f"[{i}/{len(suites)}] {suite.id} on {suite.runner}: {result.outcome} in {result.duration:.1f} s")
    return results


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)


def _resolve_gpu(capability: Any) -> device.Gpu | None:
    if capability is None:
        return device.detect_gpu()
    if capability in ("cpu", "none", False):
        return None
    if isinstance(capability, device.Gpu):
        return capability
    cap = device.parse_capability(capability)
    if cap is None:
        return None
    return device.Gpu(name=f"cc {cap[0]}.{cap[1]} (stated)", capability=cap)


def run_suite(suite, repo_dir: str):
    """Run one PlannedSuite in ``repo_dir`` and turn whatever happened into a SuiteResult."""
    m = model()
    with tempfile.TemporaryDirectory(prefix="drift-audit-suite-") as tmp:
        junit = os.path.join(tmp, "junit.xml")
        metrics_path = os.path.join(tmp, "metrics.jsonl")
        golden_out = os.path.join(tmp, "golden-out.jsonl")
        log_path = os.path.join(tmp, "output.log")
        env = _suite_env(suite, repo_dir, junit, metrics_path, golden_out)
        start = time.monotonic()
        timed_out = False
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(
                    ["/bin/bash", "-c", suite.command],
                    cwd=repo_dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                return m.SuiteResult(suite.id, suite.runner, "error", 0.0, f"could not start: {exc}")
            try:
                rc = proc.wait(timeout=suite.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                rc = _kill_group(proc)
            finally:
                _reap_group(proc.pid)
        duration = time.monotonic() - start
        tail = _tail(log_path)

        cases: list[metrics.Case] = []
        notes: list[str] = []
        report = os.path.exists(junit)
        if report:
            try:
                cases = metrics.read_junit(junit)
            except metrics.JUnitError as exc:
                notes.append(str(exc))
        records, suite_metrics, bad = metrics.read_metrics_lines(metrics_path)
        cases = metrics.merge(cases, records, "passed" if rc == 0 and not timed_out else "error")
        if bad:
            notes.append(f"{bad} malformed line(s) in $DRIFT_AUDIT_METRICS ignored")

        outcome, reason = classify(
            rc, timed_out, suite.timeout, tail, cases, is_pytest(suite.command), report=report
        )
        if outcome in ("failed", "error", "cuda-error") and _signal_of(rc) is None:
            unrunnable = runnable.not_runnable(
                junit, tail, repo_dir, rc, [c.message for c in cases if c.outcome in ("failed", "error")]
            )
            if unrunnable is not None:
                outcome, reason = "not-runnable", unrunnable[0]
                tail = _short_tail(tail)
                cases = _mark_not_runnable(cases, unrunnable[1])
        if suite.golden and outcome == "passed":
            outcome, reason, golden_metrics = _check_golden(suite.golden, repo_dir, golden_out)
            suite_metrics = {**golden_metrics, **suite_metrics}
        if notes:
            reason = "; ".join([reason, *notes]) if reason else "; ".join(notes)
        return m.SuiteResult(
            suite=suite.id,
            runner=suite.runner,
            outcome=outcome,
            duration=round(duration, 3),
            reason=reason,
            output_tail="" if outcome in ("passed", "skipped") else tail,
            cases=[
                m.CaseResult(c.name, c.outcome, round(c.duration, 4), c.message, c.metrics) for c in cases
            ],
            metrics=metrics.headline(cases, suite_metrics),
        )


def _short_tail(tail: str) -> str:
    return "\n".join(tail.splitlines()[-NOT_RUNNABLE_TAIL_LINES:])[-NOT_RUNNABLE_TAIL_CHARS:]


def _mark_not_runnable(cases: list[metrics.Case], modules: dict[str, str]) -> list[metrics.Case]:
    """Collection-failure cases become not-runnable ones carrying the one-line reason, not the traceback."""
    if not modules:
        return cases
    by_dotted = {path.removesuffix(".py").replace("/", "."): why for path, why in modules.items()}
    out = []
    for c in cases:
        why = by_dotted.get(c.name.rsplit("::", 1)[-1]) or by_dotted.get(c.name)
        out.append(metrics.Case(c.name, "not-runnable", c.duration, why, c.metrics) if why else c)
    return out


def _suite_env(suite, repo_dir: str, junit: str, metrics_path: str, golden_out: str) -> dict[str, str]:
    env = dict(os.environ)
    # The head tree's packages come first, ahead of any installed copy of the same project.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_dir, env.get("PYTHONPATH", "")) if p)
    # `python` in a suite command is this interpreter's, even when its venv is not activated.
    env["PATH"] = os.pathsep.join(p for p in (os.path.dirname(sys.executable), env.get("PATH", "")) if p)
    env["DRIFT_AUDIT_METRICS"] = metrics_path
    env["DRIFT_AUDIT_GOLDEN_OUT"] = golden_out
    env["DRIFT_AUDIT_SUITE"] = suite.id
    env["DRIFT_AUDIT_RUNNER"] = suite.runner
    env["PYTHONFAULTHANDLER"] = "1"
    if is_pytest(suite.command):
        extra = f"--junitxml={shlex.quote(junit)} -o junit_family=xunit1"
        env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} {extra}".strip()
    return env


def _kill_group(proc: subprocess.Popen) -> int:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.returncode if proc.returncode is not None else -signal.SIGKILL


def _reap_group(pgid: int) -> None:
    """Kill anything the suite left running in its group (a server, a stuck worker)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str) -> str:
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        fh.seek(max(0, size - TAIL_CHARS * 4))
        data = fh.read().decode("utf-8", "replace")
    lines = data.splitlines()[-TAIL_LINES:]
    return "\n".join(lines)[-TAIL_CHARS:]


def _signal_of(rc: int) -> int | None:
    if rc < 0:
        return -rc
    if rc > 128 and (rc - 128) in {int(s) for s in signal.Signals}:
        return rc - 128  # the shell reports a child killed by signal N as 128 + N
    return None


def classify(
    rc: int, timed_out: bool, timeout: float, tail: str, cases: list[metrics.Case], pytest: bool,
    *, report: bool = True,
) -> tuple[str, str]:
    """(outcome, reason) for a finished suite. ``report``: pytest wrote its JUnit file. A pytest that exits 0
    without one never reached its own end (``os._exit(0)`` in a head's conftest), so it proved nothing."""
    if timed_out:
        return "timeout", f"killed after the {timeout:g} s timeout"
    failed = [c for c in cases if c.outcome in ("failed", "error", "segfault", "abort", "cuda-error", "timeout")]
    if rc != 0:
        hit = _CUDA_ERROR.search(tail)
        if hit:
            line = next((ln for ln in tail.splitlines() if hit.group(0) in ln), hit.group(0))
            return "cuda-error", line.strip()[:300]
        sig = _signal_of(rc)
        if sig is not None:
            signum = signal.Signals(sig)
            name = signum.name
            if signum in _SIGNAL_OUTCOME:
                return _SIGNAL_OUTCOME[signum], f"killed by {name}"
            return "error", f"killed by {name}" + (" (out of memory?)" if sig == signal.SIGKILL else "")
        if pytest and rc == 5:
            return "error", "pytest collected no tests (exit 5)"
        if failed or (pytest and rc == 1):
            return "failed", f"{len(failed)} of {len(cases)} test(s) failed" if cases else f"exit code {rc}"
        return "error", f"exit code {rc}"
    if failed:
        return "failed", f"{len(failed)} of {len(cases)} case(s) reported failure (exit code 0)"
    if pytest and not report:
        return "error", "pytest exited 0 without writing its test report (the code under test ended the interpreter?)"
    if cases and all(c.outcome == "skipped" for c in cases):
        return "skipped", cases[0].message or "every test skipped"
    return "passed", skipped_part(cases)


def skipped_part(cases: list[metrics.Case]) -> str:
    """"4 of 5 tests skipped: could not import 'transformers'" for a passing suite that skipped some:
    a pass whose oracle never ran must not read like one that checked everything."""
    skipped = [c for c in cases if c.outcome == "skipped"]
    if not skipped:
        return ""
    reasons: dict[str, int] = {}
    for c in skipped:
        first = (c.message.splitlines() or [""])[0].strip()
        reasons[first] = reasons.get(first, 0) + 1
    common = sorted(reasons, key=lambda r: -reasons[r])
    said = next((r for r in common if r), "")
    others = len([r for r in common if r and r != said])
    return (f"{len(skipped)} of {len(cases)} tests skipped" + (f": {said[:200]}" if said else "")
            + (f" (and {others} other reason{'s' * (others != 1)})" if others else ""))


def _check_golden(golden: str, repo_dir: str, produced: str) -> tuple[str, str, dict[str, Any]]:
    from runner import golden as golden_check

    return golden_check.compare_files(os.path.join(repo_dir, golden), produced, golden)
