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
        comparison = eg.compare_files(golden_path, produced_path)
    except eg.GoldenError as exc:  # a malformed or mismatched file is a result, not a runner crash
        return "error", f"cannot compare with '{label}': {exc}", {}
    outcome, reason, metrics = adapt(comparison, label)
    metrics["decode_prompts"] = prompt_traces(eg.read_golden(golden_path).records, comparison)
    return outcome, reason, metrics


MAX_TRACED_PROMPTS, MAX_TRACED_STEPS = 16, 256


def prompt_traces(reference: list[Any], comparison: Any) -> list[dict[str, Any]]:
    """Per prompt, the reference's top-1 minus top-2 margin at each step and where it first diverged:
    what the details page draws (a divergence at a small margin is a near-tie, not a bug)."""
    margins = {r.index: r.margins for r in reference}
    return [
        {"index": p.index, "status": p.status, "first_divergence": p.first_divergence,
         "margins": [round(float(m), 4) for m in margins.get(p.index, [])[:MAX_TRACED_STEPS]]}
        for p in comparison.prompts[:MAX_TRACED_PROMPTS]
    ]


def adapt(comparison: Any, label: str) -> tuple[str, str, dict[str, Any]]:
    """Suite outcome and metrics from the engine's Comparison: the earliest divergence decides."""
    diverged = [p for p in comparison.prompts if p.first_divergence is not None]
    metrics: dict[str, Any] = {
        "prompts": len(comparison.prompts),
        "prompts_matched": sum(p.status == "match" for p in comparison.prompts),
        "near_tie_threshold": comparison.near_tie,
    }
    if not diverged:
        return "passed", "", metrics
    first = min(diverged, key=lambda p: (p.first_divergence, p.index))
    metrics["first_divergence"] = first.first_divergence
    margins = [p.reference_margin for p in diverged if p.reference_margin is not None]
    if margins:
        metrics["near_tie_margin"] = min(margins)
    breaks = [p for p in diverged if p.status in ("break", "short")]
    where = f"prompt {first.index} step {first.first_divergence}"
    if not breaks:
        return "passed", f"diverges from '{label}' only at near-ties (first: {where})", metrics
    b = min(breaks, key=lambda p: (p.first_divergence, p.index))
    detail = (
        f"prompt {b.index} stops at step {b.first_divergence}"
        if b.status == "short"
        else f"prompt {b.index} step {b.first_divergence}: expected token {b.expected}, got {b.got}"
        + (f" (reference margin {b.reference_margin:.3g})" if b.reference_margin is not None else "")
    )
    return "failed", f"{len(breaks)} of {len(comparison.prompts)} prompt(s) break from '{label}'; {detail}", metrics
