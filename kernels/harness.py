"""Parity harness: run a kernel against its torch reference over a spec of cases and judge each output.

An op module declares ``SPEC = ParitySpec(...)`` and ``kernels/registry.py`` names it. For each case the
harness builds inputs, runs the reference, allocates the outputs *poisoned* (NaN, or a sentinel for integers)
so an element the kernel never writes fails, calls ``spec.kernel(**inputs, out=outs)``, and applies every
check. A NaN anywhere in an output fails, whatever the metric. Only torch is imported here, so the harness
runs on a bare GPU image.
"""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from kernels import metrics as M


class Skip(Exception):
    """Raised by a kernel (or returned as a reason by ``Case.skip``) when its path cannot run here, say an
    arch without the instructions it needs: the case is reported ``skipped`` with the reason, never passed."""


@dataclass(frozen=True)
class Case:
    """One input configuration. ``params`` go to ``make_inputs``; ``devices`` says where it runs (CPU cases
    stay small because the Triton interpreter is slow). ``skip(device)`` returns why the case cannot run on
    that device (None: it can), checked before any input is made."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    dtype: torch.dtype = torch.bfloat16
    devices: tuple[str, ...] = ("cpu", "cuda")
    skip: Callable[[torch.device], str | None] | None = None


@dataclass(frozen=True)
class Check:
    """One judged output. ``tol`` is the pass bound on the metric (``value <= tol``; ``allclose`` passes at
    ≤ 1). ``cpu_tol`` loosens it under the Triton interpreter where its numerics differ from the GPU's."""

    metric: str
    tol: float
    why: str
    output: int = 0
    name: str = "out"
    opts: Mapping[str, Any] = field(default_factory=dict)
    cpu_tol: float | None = None
    dtypes: tuple[torch.dtype, ...] | None = None  # only for cases of these dtypes (None: all)

    def label(self) -> str:
        if not self.opts:
            return self.metric
        return f"{self.metric}({','.join(f'{k}={v:g}' if isinstance(v, float) else f'{k}={v}' for k, v in self.opts.items())})"


@dataclass(frozen=True)
class ParitySpec:
    """What an op must satisfy. ``make_inputs(case, device, generator) -> dict`` of keyword inputs;
    ``reference(**inputs)`` returns a tensor or tuple; ``kernel(**inputs, out=tuple)`` writes every output
    in place. ``case.params`` may carry anything ``make_inputs`` reads (shape, strides, flags)."""

    op: str
    make_inputs: Callable[[Case, torch.device, torch.Generator], dict[str, Any]]
    reference: Callable[..., Any]
    kernel: Callable[..., Any]
    cases: Sequence[Case]
    checks: Sequence[Check]
    description: str = ""
    seed: int = 1234


@dataclass
class Row:
    """One (case, check) verdict; ``to_case_result`` gives the runner's CaseResult shape."""

    op: str
    case: str
    dtype: str
    output: str
    metric: str
    value: float | None
    tol: float | None
    outcome: str  # passed | failed | error | skipped
    message: str = ""
    duration: float = 0.0
    device: str = "cpu"
    worst_index: list[int] | None = None
    worst_value: float | None = None
    ref_value: float | None = None

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @property
    def bad(self) -> bool:
        """Failed or errored: what makes a parity run fail (a skip does not, nor does it pass)."""
        return self.outcome in ("failed", "error")

    def name(self) -> str:
        return f"{self.op}[{self.case} {self.dtype}]::{self.output}"

    def to_case_result(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {"metric": self.metric, "value": self.value, "tol": self.tol}
        if self.worst_index is not None:
            metrics.update(worst_index=self.worst_index, worst_value=self.worst_value, ref_value=self.ref_value)
        return {
            "name": self.name(),
            "outcome": self.outcome,
            "duration": round(self.duration, 6),
            "message": self.message,
            "metrics": metrics,
        }


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with a value no correct kernel writes: NaN for floats (fp8 too), a sentinel for ints."""
    if t.dtype.is_floating_point:
        if t.element_size() == 1:
            t.view(torch.uint8).fill_(0x7F if t.dtype == torch.float8_e4m3fn else 0xFF)
        else:
            t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).min)
    return t


def poisoned_like(ref: torch.Tensor) -> torch.Tensor:
    return poison(torch.empty(ref.shape, dtype=ref.dtype, device=ref.device))


def _as_tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fmt_idx(idx: Sequence[int] | None) -> str:
    return "[" + ", ".join(map(str, idx)) + "]" if idx is not None else "?"


def judge(check: Check, out: torch.Tensor, ref: torch.Tensor, on_cpu: bool) -> tuple[str, float, float, M.Measure, str]:
    """Apply one check: ``(outcome, value, tol, measure, message)``. NaN in the output fails first."""
    tol = check.cpu_tol if (on_cpu and check.cpu_tol is not None) else check.tol
    nan_at = M.first_nan(out)
    if nan_at is not None:
        n = int(torch.isnan(out.float()).sum())
        ref_v = float(ref.detach().float()[nan_at]) if ref.shape == out.shape else float("nan")
        msg = f"NaN in output at {_fmt_idx(nan_at)} ({n} of {out.numel()}; never written or overflow), reference {ref_v:.6g}"
        return "failed", float("nan"), tol, M.Measure(float("nan"), nan_at, float("nan"), ref_v), msg
    if M.first_nan(ref) is not None:
        return "error", float("nan"), tol, M.Measure(float("nan")), f"reference has NaN at {_fmt_idx(M.first_nan(ref))}"
    m = M.METRICS[check.metric](out, ref, **dict(check.opts))
    passed = m.value <= tol
    msg = ""
    if not passed:
        msg = (
            f"{check.label()} = {m.value:.4g} > {tol:.4g}: worst at {_fmt_idx(m.worst_index)} "
            f"got {m.worst_value!r}, reference {m.ref_value!r}"
            + (f" ({m.note})" if m.note else "")
        )
    return ("passed" if passed else "failed"), m.value, tol, m, msg


def run_spec(spec: ParitySpec, device: str = "cpu", case_filter: str | None = None) -> list[Row]:
    """Run every case of ``spec`` meant for ``device``; a raising kernel is an ``error`` row, never an abort."""
    dev = torch.device(device)
    rows: list[Row] = []
    for case in spec.cases:
        if dev.type not in case.devices or (case_filter and case_filter not in case.name):
            continue
        checks = [c for c in spec.checks if c.dtypes is None or case.dtype in c.dtypes]
        base = dict(op=spec.op, case=case.name, dtype=_dtype_name(case.dtype), device=str(dev))
        reason = case.skip(dev) if case.skip is not None else None
        if reason:
            rows += [Row(**base, output=c.name, metric=c.label(), value=None, tol=c.tol, outcome="skipped",
                         message=reason) for c in checks]
            continue
        t0 = time.perf_counter()
        try:
            gen = torch.Generator(device=dev).manual_seed(spec.seed)
            inputs = spec.make_inputs(case, dev, gen)
            refs = _as_tuple(spec.reference(**inputs))
            outs = tuple(poisoned_like(r) for r in refs)
            _sync(dev)
            t0 = time.perf_counter()
            spec.kernel(**inputs, out=outs)
            _sync(dev)
        except Skip as exc:  # the path cannot run here: say why, judge nothing
            rows += [Row(**base, output=c.name, metric=c.label(), value=None, tol=c.tol, outcome="skipped",
                         message=str(exc) or "skipped", duration=time.perf_counter() - t0) for c in checks]
            continue
        except Exception as exc:  # the kernel or its inputs failed: report, keep going
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            for c in checks:
                rows.append(Row(**base, output=c.name, metric=c.label(), value=None, tol=c.tol, outcome="error",
                                message=f"raised {tb}", duration=time.perf_counter() - t0))
            continue
        dt = time.perf_counter() - t0
        for c in checks:
            try:
                outcome, value, tol, m, msg = judge(c, outs[c.output], refs[c.output], dev.type == "cpu")
            except Exception as exc:
                rows.append(Row(**base, output=c.name, metric=c.label(), value=None, tol=c.tol, outcome="error",
                                message=f"check raised {type(exc).__name__}: {exc}", duration=dt))
                continue
            rows.append(Row(**base, output=c.name, metric=c.label(), value=value, tol=tol, outcome=outcome,
                            message=msg, duration=dt,
                            worst_index=list(m.worst_index) if m.worst_index is not None else None,
                            worst_value=m.worst_value, ref_value=m.ref_value))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """Plain-text table (no rich: it must print on the GPU image): op, case, dtype, output, metric, value,
    tol, pass; failure messages follow the table."""
    head = ("op", "case", "dtype", "output", "metric", "value", "tol", "pass")
    body = [
        (r.op, r.case, r.dtype, r.output, r.metric,
         "-" if r.value is None else f"{r.value:.3g}", "-" if r.tol is None else f"{r.tol:.3g}",
         "PASS" if r.passed else r.outcome.upper())
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(head), line(tuple("-" * w for w in widths))] + [line(b) for b in body]
    bad = [r for r in rows if not r.passed]
    if bad:
        out.append("")
        out += [f"{r.name()} {r.metric}: {r.message}" for r in bad]
    n_pass = sum(r.passed for r in rows)
    n_skip = sum(r.outcome == "skipped" for r in rows)
    out.append(f"\n{n_pass}/{len(rows)} checks passed" + (f", {n_skip} skipped" if n_skip else ""))
    return "\n".join(out)


def device_info(device: str) -> dict[str, Any]:
    """A fingerprint of where the parity ran, with the keys of the runner's DeviceFingerprint."""
    import triton

    info: dict[str, Any] = {
        "label": device, "host": platform.node(), "gpu": None, "compute_capability": None,
        "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        cap = torch.cuda.get_device_capability(device)
        info.update(gpu=torch.cuda.get_device_name(device), compute_capability=f"{cap[0]}.{cap[1]}")
    return info


def results_json(rows: Sequence[Row], device: str) -> dict[str, Any]:
    """``rows`` as JSON: the full verdicts plus ``cases`` in CaseResult shape for the runner."""
    return {
        "device": device_info(device),
        "passed": not any(r.bad for r in rows) and any(r.passed for r in rows),
        "rows": [asdict(r) for r in rows],
        "cases": [r.to_case_result() for r in rows],
    }


def write_json(path: str, rows: Sequence[Row], device: str) -> None:
    with open(path, "w") as f:
        json.dump(results_json(rows, device), f, indent=1, default=float)
