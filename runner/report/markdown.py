"""The PR comment and the check-run output (summary, overflow text, annotations), in GitHub markdown.

The comment must fit GitHub's 65 536-character limit even for a 150-file PR, so
it is rendered at decreasing levels of detail until it fits; whatever the
comment leaves out goes to the check-run text, and the full record stays in
the JSON.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import jinja2

from checks.model import Annotation, Audit, Finding, Report
from runner.report import Context
from runner.report.safe import blob_link, clip, code, text

COMMENT_MARKER = "<!-- drift-audit:comment -->"
COMMENT_LIMIT = 65_536
CHECK_LIMIT = 65_535
FAILED_OUTCOMES = {"failed", "error", "timeout", "segfault", "abort", "cuda-error"}

# Levels of detail, most to least: max files / symbols listed per pillar, max findings, cases, reasons.
_LEVELS = [
    {"files": 25, "symbols": 25, "findings": 1000, "cases": 1000},
    {"files": 10, "symbols": 10, "findings": 200, "cases": 50},
    {"files": 5, "symbols": 5, "findings": 50, "cases": 10},
    {"files": 3, "symbols": 3, "findings": 15, "cases": 3},
]


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept across processes (like .pyc files): compiling them is most of a cold
    render. Skipped where no cache directory can be written."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "drift-audit" / "jinja"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(root)) if os.access(root, os.W_OK) else None


def _seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("runner.report", "templates"),
        bytecode_cache=_bytecode_cache(),
        autoescape=False,  # markdown: values pass through the text / code filters instead
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["md"] = text
    env.filters["code"] = code
    env.filters["cell"] = lambda v: code(v, table=True)
    env.filters["clip"] = clip
    env.filters["seconds"] = _seconds
    env.globals["blob_link"] = blob_link
    env.tests["contains_pillar"] = lambda reasons, pid: any(f"pillar '{pid}'" in r for r in reasons)
    return env


def _version() -> str:
    try:
        return version("drift-audit")
    except PackageNotFoundError:
        return "dev"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def verdict_of(audit: Audit) -> tuple[str, str]:
    """(verdict, headline). ``audit.findings.failing`` (the repo's fail_on) and failed suites fail."""
    failing = audit.findings.failing
    suites = audit.results.suites if audit.results else []
    failed_suites = [s for s in suites if s.outcome in FAILED_OUTCOMES]
    parts = []
    if failing:
        parts.append(_plural(len(failing), "failing finding"))
    if failed_suites:
        parts.append(f"{_plural(len(failed_suites), 'suite')} failed")
    if parts:
        return "fail", "; ".join(parts)
    touched = [p for p in audit.pillars.pillars if p.id != "other"]
    bits = [f"{_plural(len(touched), 'pillar')} touched"]
    if not audit.findings.rules_run:
        bits.append("no drift rules configured")
    else:
        new = [f for f in audit.findings.findings if f.status in ("new", "changed")]
        bits.append(_plural(len(new), "new warning") if new else "no new drift")
    if audit.results:
        passed = [s for s in suites if s.outcome == "passed"]
        if passed:
            bits.append(f"{_plural(len(passed), 'suite')} passed")
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
                    level=level[f.severity],  # type: ignore[arg-type]
                    message=f.message + (f" ({loc.note})" if loc.note else ""),
                    title=f"{f.rule} [{f.pillar}]",
                )
            )
    return out


def _cut(body: str, limit: int, pointer: str) -> str:
    if len(body) <= limit:
        return body
    keep = limit - len(pointer) - 2
    head = body[:keep]
    head = head[: head.rfind("\n")] if "\n" in head else head
    return head + "\n\n" + pointer


def _context(audit: Audit, ctx: Context) -> dict:
    verdict, headline = verdict_of(audit)
    return {
        "audit": audit,
        "verdict": verdict,
        "headline": headline,
        "blob_url": ctx.blob_url,
        "details_url": ctx.details_url,
        "marker": COMMENT_MARKER,
        "version": _version(),
    }


def build_report(audit: Audit, ctx: Context) -> Report:
    base = _context(audit, ctx)
    env = environment()
    comment_tpl = env.get_template("comment.md.j2")
    full = comment_tpl.render(**base, limits=_LEVELS[0], truncated=False)
    markdown, truncated = full, False
    if len(full) > COMMENT_LIMIT:
        truncated = True
        for level in _LEVELS[1:]:
            markdown = comment_tpl.render(**base, limits=level, truncated=True)
            if len(markdown) <= COMMENT_LIMIT:
                break
        pointer = f"**Comment cut at GitHub's size limit.** The rest is in the check run and in {ctx.json_hint}."
        markdown = _cut(markdown, COMMENT_LIMIT, pointer)

    summary = env.get_template("check_summary.md.j2").render(**base, limits=_LEVELS[2], truncated=False)
    summary = _cut(summary, CHECK_LIMIT, f"Summary cut at GitHub's size limit; see {ctx.json_hint}.")
    check_text = _cut(full, CHECK_LIMIT, f"Cut at GitHub's size limit; see {ctx.json_hint}.") if truncated else ""
    shown = [f for f in audit.findings.findings if f.status in ("new", "changed")]
    return Report(
        verdict=base["verdict"],
        headline=base["headline"],
        markdown=markdown,
        check_title=f"Drift Audit: {base['headline']}",
        check_summary=summary,
        check_text=check_text,
        annotations=annotations_of(shown),
        truncated=truncated,
    )


@dataclass(frozen=True)
class _Comment:
    name: str = "markdown"
    media_type: str = "text/markdown"

    def render(self, audit: Audit, ctx: Context) -> str:
        return build_report(audit, ctx).markdown


@dataclass(frozen=True)
class _CheckRun:
    """The check run as GitHub's API takes it: title, summary, text and annotations, as JSON."""

    name: str = "check-run"
    media_type: str = "application/json"

    def render(self, audit: Audit, ctx: Context) -> str:
        import json

        from checks.model import to_dict

        rep = build_report(audit, ctx)
        output = {"title": rep.check_title, "summary": rep.check_summary, "text": rep.check_text,
                  "annotations": to_dict(rep.annotations)}
        return json.dumps({"conclusion": {"pass": "success", "fail": "failure"}.get(rep.verdict, "neutral"),
                           "output": output}, indent=2)


MARKDOWN = _Comment()
CHECK_RUN = _CheckRun()
