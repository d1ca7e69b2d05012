"""Compare a decode suite's output with its golden file, using the engine's comparator.

The engine owns the golden format and the comparison (first divergence, and
whether it was a near-tie between the top-2 logits); this module only adapts
its answer to a suite outcome and metrics. The engine is imported lazily so
selection and the executor never pay for torch.
"""

from __future__ import annotations

import os
from typing import Any


def compare_files(golden_path: str, produced_path: str, label: str) -> tuple[str, str, dict[str, Any]]:
    """(outcome, reason, metrics) for a decode suite that exited cleanly."""
    if not os.path.isfile(golden_path):
        return "error", f"golden file '{label}' is not in the head tree", {}
    if not os.path.isfile(produced_path) or os.path.getsize(produced_path) == 0:
        return "failed", "the suite wrote no outputs to $DRIFT_AUDIT_GOLDEN_OUT", {}
    try:
        from engine import golden as engine_golden
    except ImportError as exc:
        return "error", f"cannot compare with '{label}': the engine's golden comparator is not importable ({exc})", {}
    return _from_engine(engine_golden, golden_path, produced_path, label)


def _from_engine(eg: Any, golden_path: str, produced_path: str, label: str) -> tuple[str, str, dict[str, Any]]:
    try:
        expected = eg.load(golden_path)
        actual = eg.load(produced_path)
    except Exception as exc:  # a malformed file is a result, not a crash of the runner
        return "error", f"cannot read goldens: {type(exc).__name__}: {exc}", {}
    report = eg.compare(expected, actual)
    return _adapt(report, label)


def _adapt(report: Any, label: str) -> tuple[str, str, dict[str, Any]]:
    first = getattr(report, "first_divergence", None)
    margin = getattr(report, "near_tie_margin", None)
    near_tie = bool(getattr(report, "near_tie", False))
    metrics: dict[str, Any] = {}
    if first is not None:
        metrics["first_divergence"] = first
    if margin is not None:
        metrics["near_tie_margin"] = margin
    if first is None:
        return "passed", "", metrics
    if near_tie:
        return "passed", f"diverges from '{label}' at step {first}, a near-tie (margin {margin})", metrics
    return "failed", f"diverges from '{label}' at step {first}", metrics
