"""Audit → Report: the PR comment, the check-run output and its annotations.

The comment must fit GitHub's 65 536-character limit even for a 129-file PR, so
it is rendered at decreasing levels of detail until it fits; whatever the
comment leaves out goes to the check-run text, and the full record stays in
the JSON.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

import jinja2

from checks.model import Annotation, Audit, Finding, Report

COMMENT_MARKER = "<!-- drift-audit:comment -->"
COMMENT_LIMIT = 65_536
CHECK_LIMIT = 65_535
FAILED_OUTCOMES = {"failed", "error", "timeout", "segfault", "abort", "cuda-error"}

# Levels of detail, most to least: max files / symbols listed per pillar, max findings listed.
_LEVELS = [
    {"files": 1000, "symbols": 1000, "findings": 1000, "cases": 1000},
    {"files": 25, "symbols": 25, "findings": 200, "cases": 50},
    {"files": 8, "symbols": 8, "findings": 50, "cases": 10},
    {"files": 3, "symbols": 3, "findings": 15, "cases": 3},
]

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~])")


def md(value: object) -> str:
    """Escape user-controlled text (paths, messages, PR text) for GitHub markdown and its HTML."""
    text = html.escape(str(value), quote=False)
    return _MD_SPECIAL.sub(r"\\\1", text).replace("\n", " ")


def code(value: object) -> str:
    """Inline code that survives backticks and table pipes in the value.

    GitHub renders a code span literally (no HTML), so only the fence and the
    table cell separator need care.
    """
    text = str(value).replace("\n", " ").replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept across processes (like .pyc files): compiling them is most of a cold
    render. Skipped where no cache directory can be written."""
    import os
    from pathlib import Path

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "drift-audit" / "jinja"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(root)) if os.access(root, os.W_OK) else None


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("bot", "templates"),
        bytecode_cache=_bytecode_cache(),
        autoescape=False,  # markdown; values pass through md/code filters instead
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["md"] = md
    env.filters["code"] = code
    env.tests["contains_pillar"] = lambda reasons, pid: any(f"pillar '{pid}'" in r for r in reasons)
    env.filters["seconds"] = lambda s: f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"
    return env


def _version() -> str:
    try:
        return version("drift-audit")
    except PackageNotFoundError:
        return "dev"


def verdict_of(audit: Audit) -> tuple[str, str]:
    """(verdict, headline). Only new error findings and failed suites fail."""
    failing = audit.findings.failing
    failed_suites = [s for s in (audit.results.suites if audit.results else []) if s.outcome in FAILED_OUTCOMES]
    touched = [p for p in audit.pillars.pillars if p.id != "other"]
    parts = []
    if failing:
        parts.append(f"{len(failing)} new drift error{'s' * (len(failing) != 1)}")
    if failed_suites:
        parts.append(f"{len(failed_suites)} suite{'s' * (len(failed_suites) != 1)} failed")
    if parts:
        return "fail", "; ".join(parts)
    bits = [f"{len(touched)} pillar{'s' * (len(touched) != 1)} touched"]
    new_other = [f for f in audit.findings.findings if f.status == "new"]
    bits.append(f"{len(new_other)} new warning{'s' * (len(new_other) != 1)}" if new_other else "no new drift")
    if audit.results:
        ran = [s for s in audit.results.suites if s.outcome == "passed"]
        bits.append(f"{len(ran)} suite{'s' * (len(ran) != 1)} passed")
    return "pass", ", ".join(bits)


def annotations_of(findings: list[Finding]) -> list[Annotation]:
    level = {"error": "failure", "warning": "warning", "note": "notice"}
    out = []
    for f in findings:
        for loc in f.locations:
            out.append(
                Annotation(
                    path=loc.path,
                    start_line=max(loc.line, 1),
                    end_line=max(loc.end_line or loc.line, 1),
                    level=level[f.severity],
                    message=f.message + (f" ({loc.note})" if loc.note else ""),
                    title=f"{f.rule} [{f.pillar}]",
                )
            )
    return out


def _cut(text: str, limit: int, pointer: str) -> str:
    if len(text) <= limit:
        return text
    keep = limit - len(pointer) - 2
    head = text[:keep]
    head = head[: head.rfind("\n")] if "\n" in head else head
    return head + "\n\n" + pointer


def render(audit: Audit, *, blob_url: str | None = None, details_url: str | None = None,
           json_hint: str = "the full JSON (`drift-audit review --format json`)") -> Report:
    verdict, headline = verdict_of(audit)
    env = environment()
    base_ctx = {
        "audit": audit,
        "verdict": verdict,
        "headline": headline,
        "blob_url": blob_url,
        "details_url": details_url,
        "marker": COMMENT_MARKER,
        "version": _version(),
    }
    comment_tpl = env.get_template("comment.md.j2")
    full = comment_tpl.render(**base_ctx, limits=_LEVELS[0], truncated=False)
    markdown, truncated = full, False
    if len(full) > COMMENT_LIMIT:
        truncated = True
        for level in _LEVELS[1:]:
            markdown = comment_tpl.render(**base_ctx, limits=level, truncated=True)
            if len(markdown) <= COMMENT_LIMIT:
                break
        pointer = f"**Comment cut at GitHub's size limit.** The rest is in the check run and in {json_hint}."
        markdown = _cut(markdown, COMMENT_LIMIT, pointer)

    summary = env.get_template("check_summary.md.j2").render(**base_ctx, limits=_LEVELS[2], truncated=False)
    summary = _cut(summary, CHECK_LIMIT, f"Summary cut at GitHub's size limit; see {json_hint}.")
    check_text = _cut(full, CHECK_LIMIT, f"Cut at GitHub's size limit; see {json_hint}.") if truncated else ""
    new = audit.findings.with_status("new")
    return Report(
        verdict=verdict,
        headline=headline,
        markdown=markdown,
        check_title=f"Drift Audit: {headline}",
        check_summary=summary,
        check_text=check_text,
        annotations=annotations_of(new),
        truncated=truncated,
    )
