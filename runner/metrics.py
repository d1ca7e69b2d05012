"""Read what a suite reports about itself: pytest JUnit XML and a metrics JSON-lines file.

The contract for suites (documented in docs/runners.md):

* pytest commands get ``--junitxml`` (through ``PYTEST_ADDOPTS``); per-test
  ``record_property("max_abs", x)`` values arrive as JUnit ``<property>``s.
* Any command may append JSON lines to the file named by ``DRIFT_AUDIT_METRICS``.
  A line with a ``name`` is a case, shaped like ``CaseResult``:
  ``{"name", "outcome", "duration", "message", "metrics": {...}}``; it merges into
  the JUnit case of the same name or adds a case. A line without a name carries
  suite-level ``metrics``. The file may instead hold one JSON object with a
  ``cases`` list of such records (what ``drift-audit kernels parity --json``
  writes). A harness's ``{"metric": "gemm_diff", "value": v}`` is also read as
  ``gemm_diff = v``.

The suite's headline metrics are the worst over its cases, so the comment can
show one row per suite.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

OUTCOMES = ("passed", "failed", "error", "skipped", "timeout", "segfault", "abort", "cuda-error", "not-run")

# metric → how cases combine into the suite's headline value
WORST = {
    "max_abs": max,
    "rel": max,
    "max_rel": max,
    "cos_diff": max,
    "gemm_diff": max,
    "lse_abs": max,
    "bit_exact": max,
    "allclose": max,
    "first_divergence": min,
    "near_tie_margin": min,
}
KEY_METRICS = tuple(WORST)


@dataclass
class Case:
    name: str
    outcome: str
    duration: float = 0.0
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


class JUnitError(ValueError):
    pass


def read_junit(path: str) -> list[Case]:
    """Cases from a JUnit XML file (pytest's xunit1/xunit2, or any JUnit producer)."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise JUnitError(f"{path}: malformed JUnit XML: {exc}") from None
    cases: list[Case] = []
    for tc in root.iter("testcase"):
        classname = tc.get("classname") or ""
        name = tc.get("name") or "?"
        full = f"{classname}::{name}" if classname else name
        try:
            duration = float(tc.get("time") or 0.0)
        except ValueError:
            duration = 0.0
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or (el.text or "")).strip()
                break
        metrics: dict[str, Any] = {}
        for prop in tc.iter("property"):
            if key := prop.get("name"):
                metrics[key] = _number(prop.get("value") or "")
        cases.append(Case(full, outcome, duration, message[:2000], metrics))
    return cases


def read_metrics_lines(path: str) -> tuple[list[tuple], dict[str, Any], int]:
    """(case records, suite-level metrics, number of malformed lines) from a JSON-lines file."""
    records: list[tuple] = []
    suite: dict[str, Any] = {}
    bad = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        return [], {}, 0
    whole = _whole_object("".join(lines))
    if whole is not None:
        items = [json.dumps(c) for c in whole.get("cases", [])]
        if isinstance(whole.get("metrics"), dict):
            suite.update(whole["metrics"])
    else:
        items = lines
    for line in items:
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if not isinstance(rec, dict):
            bad += 1
            continue
        metrics = rec.get("metrics", {})
        if not isinstance(metrics, dict):
            bad += 1
            continue
        if "name" not in rec:
            suite.update(metrics)
            continue
        outcome = rec.get("outcome")
        if outcome is not None and outcome not in OUTCOMES:
            bad += 1
            continue
        try:
            duration = float(rec.get("duration") or 0.0)
        except (TypeError, ValueError):
            bad += 1
            continue
        records.append((str(rec["name"]), outcome, duration, str(rec.get("message") or ""), _named(metrics)))
    return records, suite, bad


def _whole_object(text: str) -> dict | None:
    """The file as one JSON object with a ``cases`` list, or None when it is JSON lines."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    try:
        obj = json.loads(stripped)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("cases"), list) else None


def _named(metrics: dict[str, Any]) -> dict[str, Any]:
    """Spell out a harness's ``{"metric": name, "value": v}`` as ``name: v``."""
    name, value = metrics.get("metric"), metrics.get("value")
    if isinstance(name, str):
        name = name.split("(", 1)[0].strip()  # "allclose(atol=..,rtol=..)" → "allclose"
    if isinstance(name, str) and name and isinstance(value, (int, float)) and not isinstance(value, bool) and name not in metrics:
        return {**metrics, name: value}
    return metrics


def merge(cases: list[Case], records: list[tuple], default_outcome: str) -> list[Case]:
    """Fold metric records into JUnit cases by name (exact, or the part after '::'); others become cases."""
    by_name: dict[str, Case] = {}
    for c in cases:
        by_name.setdefault(c.name, c)
        by_name.setdefault(c.name.rsplit("::", 1)[-1], c)
    for name, outcome, duration, message, metrics in records:
        hit = by_name.get(name)
        if hit is None:  # a harness may report several checks under one name: keep each
            cases.append(Case(name, outcome or default_outcome, duration, message, dict(metrics)))
            continue
        # JUnit decides pass/fail; a harness may only make a case worse.
        if outcome and outcome not in ("passed", "skipped") and hit.outcome == "passed":
            hit.outcome = outcome
        if message and not hit.message:
            hit.message = message
        hit.metrics.update(metrics)
    return cases


def headline(cases: list[Case], explicit: dict[str, Any]) -> dict[str, Any]:
    """Suite metrics: what the suite said about itself, else the worst value over its cases."""
    out = dict(explicit)
    for key, pick in WORST.items():
        if key in out:
            continue
        values = [
            c.metrics[key]
            for c in cases
            if isinstance(c.metrics.get(key), (int, float))
            and not isinstance(c.metrics.get(key), bool)
            and not math.isnan(c.metrics[key])
        ]
        if values:
            out[key] = pick(values)
    return out
