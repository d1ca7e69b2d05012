"""Inline SVG pictures for the details page: no script, no external file, escaped text only.

- Parity: each case's error against its tolerance, as error / tol on a log axis
  with the tolerance line at 1 (what passes is left of it).
- Decode: each prompt's per-step top-1 minus top-2 logit margin of the
  reference, the near-tie threshold, and the first divergence marked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

from markupsafe import Markup

from checks.model import Audit, SuiteResult

MAX_ROWS = 60  # parity cases per chart
MAX_PROMPTS = 16  # decode prompts drawn per suite
MAX_STEPS = 512
_LO, _HI = -4.0, 2.0  # log10(error / tol) axis: 1e-4 … 1e2


@dataclass
class Figure:
    title: str
    svg: Markup
    caption: str = ""


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _parity_rows(r: SuiteResult) -> list[tuple[str, float, float, str]]:
    rows: list[tuple[str, float, float, str]] = []
    for c in r.cases:
        value, tol = _num(c.metrics.get("value")), _num(c.metrics.get("tol"))
        if value is None or tol is None or tol <= 0:
            continue
        label = c.name + (f" · {c.metrics['metric']}" if c.metrics.get("metric") else "")
        rows.append((label, value, tol, c.outcome))
    return rows


def parity_svg(rows: list[tuple[str, float, float, str]]) -> Markup:
    """One bar per case: log10(error / tol), clamped to the axis; red past the tolerance line."""
    shown = rows[:MAX_ROWS]
    label_w, plot_w, row_h, top = 330, 420, 18, 24
    height = top + row_h * len(shown) + 24
    width = label_w + plot_w + 150

    def x(ratio: float) -> float:
        lg = _LO if ratio <= 0 or math.isnan(ratio) else max(_LO, min(_HI, math.log10(ratio)))
        return label_w + (lg - _LO) / (_HI - _LO) * plot_w

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'viewBox="0 0 {width} {height}" font-family="system-ui,sans-serif" font-size="11">',
             "<title>error against tolerance per case</title>"]
    for p in range(int(_LO), int(_HI) + 1):
        gx = x(10.0**p)
        parts.append(f'<line x1="{gx:.1f}" y1="{top - 6}" x2="{gx:.1f}" y2="{height - 20}" stroke="#d0d7de"/>')
        parts.append(f'<text x="{gx:.1f}" y="{height - 6}" text-anchor="middle" fill="#57606a">1e{p}</text>')
    tol_x = x(1.0)
    parts.append(f'<line class="tolerance" x1="{tol_x:.1f}" y1="{top - 10}" x2="{tol_x:.1f}" y2="{height - 20}" '
                 'stroke="#cf222e" stroke-width="2" stroke-dasharray="4 2"/>')
    parts.append(f'<text x="{tol_x + 4:.1f}" y="{top - 12}" fill="#cf222e">tolerance</text>')
    for i, (label, value, tol, outcome) in enumerate(shown):
        y = top + i * row_h
        ratio = value / tol
        bad = outcome != "passed" or not (ratio <= 1.0)
        colour = "#cf222e" if bad else "#1a7f37"
        end = x(ratio) if not math.isnan(ratio) else x(10.0**_HI)
        short = label if len(label) <= 52 else label[:51] + "…"
        parts.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{escape(short)}</text>')
        parts.append(f'<rect class="{"over" if bad else "under"}" x="{label_w}" y="{y + 3}" '
                     f'width="{max(end - label_w, 1):.1f}" height="{row_h - 6}" fill="{colour}">'
                     f"<title>{escape(label)}: {value:.4g} / tol {tol:.4g}</title></rect>")
        parts.append(f'<text x="{label_w + plot_w + 8}" y="{y + 12}" fill="{colour}">'
                     f"{value:.3g} / {tol:.3g}</text>")
    parts.append("</svg>")
    return Markup("".join(parts))


def decode_svg(prompt: dict[str, Any], threshold: float | None) -> Markup:
    """The reference's per-step top-2 margin for one prompt; the first divergence as a red line."""
    margins = [m for m in (_num(v) for v in prompt.get("margins", [])[:MAX_STEPS]) if m is not None]
    first = prompt.get("first_divergence")
    width, height, left, bottom, top = 640, 150, 44, 22, 12
    plot_w, plot_h = width - left - 10, height - top - bottom
    hi = max([*margins, threshold or 0.0, 1e-6])
    steps = max(len(margins) - 1, 1)

    def px(step: int) -> float:
        return left + step / steps * plot_w

    def py(m: float) -> float:
        return top + plot_h - max(m, 0.0) / hi * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'viewBox="0 0 {width} {height}" font-family="system-ui,sans-serif" font-size="11">',
             f"<title>prompt {escape(str(prompt.get('index', '?')))}: top-2 margin per step</title>",
             f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#57606a"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#57606a"/>',
             f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{hi:.3g}</text>',
             f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>',
             f'<text x="{left + plot_w}" y="{height - 6}" text-anchor="end">step {len(margins) - 1}</text>']
    if threshold:
        ty = py(threshold)
        parts.append(f'<line class="near-tie" x1="{left}" y1="{ty:.1f}" x2="{left + plot_w}" y2="{ty:.1f}" '
                     'stroke="#9a6700" stroke-dasharray="3 3"/>')
        parts.append(f'<text x="{left + plot_w}" y="{ty - 3:.1f}" text-anchor="end" fill="#9a6700">near-tie</text>')
    if margins:
        points = " ".join(f"{px(i):.1f},{py(m):.1f}" for i, m in enumerate(margins))
        parts.append(f'<polyline class="margin" points="{points}" fill="none" stroke="#0969da" stroke-width="1.5"/>')
    if isinstance(first, int) and not isinstance(first, bool) and 0 <= first < MAX_STEPS:
        fx = px(min(first, steps))
        parts.append(f'<line class="divergence" x1="{fx:.1f}" y1="{top}" x2="{fx:.1f}" y2="{top + plot_h}" '
                     'stroke="#cf222e" stroke-width="2"/>')
        parts.append(f'<text x="{fx + 3:.1f}" y="{top + 10}" fill="#cf222e">first divergence: step {first}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def figures(audit: Audit) -> list[Figure]:
    out: list[Figure] = []
    for r in audit.results.suites if audit.results else []:
        rows = _parity_rows(r)
        if rows:
            over = sum(1 for _, v, t, o in rows if o != "passed" or not v / t <= 1.0)
            more = f"; first {MAX_ROWS} of {len(rows)} shown" if len(rows) > MAX_ROWS else ""
            out.append(Figure(f"{r.suite} on {r.runner}: error against tolerance", parity_svg(rows),
                              f"{len(rows)} case(s), {over} past tolerance{more}"))
        prompts = r.metrics.get("decode_prompts")
        if isinstance(prompts, list):
            threshold = _num(r.metrics.get("near_tie_threshold"))
            for p in [p for p in prompts if isinstance(p, dict)][:MAX_PROMPTS]:
                first = p.get("first_divergence")
                status = f"first divergence at step {first}" if first is not None else "matches the golden"
                out.append(Figure(f"{r.suite} on {r.runner}: prompt {p.get('index', '?')}", decode_svg(p, threshold),
                                  f"{status} ({p.get('status', '')})"))
    return out
