"""The PR comment and the check-run output (summary, overflow text, annotations), in GitHub markdown.

The comment must fit GitHub's 65 536-character limit even for a 150-file PR, so
it is rendered at decreasing levels of detail until it fits; whatever the
comment leaves out goes to the check-run text, and the full record stays in
the JSON.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import jinja2

from checks.model import Annotation, Audit, Finding, Location, PillarHit, PlannedSuite, Report, SuiteResult, Unchecked
from runner.report import Context
from runner.report.safe import blob_link, clip, code, html_text, text

COMMENT_MARKER = "<!-- drift-audit:comment -->"
COMMENT_LIMIT = 65_536
CHECK_LIMIT = 65_535
FAILED_OUTCOMES = {"failed", "error", "timeout", "segfault", "abort", "cuda-error"}

# Levels of detail, most to least: files / symbols listed per pillar, findings, failed cases, places per
# finding, evidence lines per finding. Even the first level caps lists: a comment is read, not searched.
_LEVELS = [
    {"files": 25, "symbols": 8, "findings": 1000, "cases": 1000, "places": 20, "evidence": 10},
    {"files": 10, "symbols": 5, "findings": 200, "cases": 50, "places": 10, "evidence": 5},
    {"files": 5, "symbols": 3, "findings": 50, "cases": 10, "places": 5, "evidence": 3},
    {"files": 3, "symbols": 2, "findings": 15, "cases": 3, "places": 3, "evidence": 1},
]
SYMBOL_BUDGET = 160  # characters of symbol names on one line of the pillar detail
LINE_BUDGET = 400  # characters of prose items (suite reasons) on one line
SEVERITY_ICON = {"error": "🔴", "warning": "🟡", "note": "🔵"}
OUTCOME_ICON = {"passed": "✅", "failed": "❌", "error": "❌", "timeout": "⏱️", "segfault": "💥", "abort": "💥",
                "cuda-error": "💥", "skipped": "⏭️", "not-run": "⚪", "not-runnable": "🚫"}
NOT_RUN = ("skipped", "not-run", "not-runnable")
_BLOCKED = re.compile(r"fact '([^']+)'")


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
    env.filters["html"] = html_text
    env.filters["code"] = code
    env.filters["cell"] = lambda v: code(v, table=True)
    env.filters["clip"] = clip
    env.filters["seconds"] = _seconds
    env.filters["fenced"] = fenced
    env.filters["joined"] = joined
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
    """(verdict, headline). ``audit.findings.failing`` (the repo's fail_on) and failed suites fail;
    suites that are not runnable here never do."""
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
    other = next((p for p in audit.pillars.pillars if p.id == "other" and p.files), None)
    if touched or other is None:
        bits = [f"{_plural(len(touched), 'pillar')} touched"]
    else:  # "0 pillars touched" above a Pillars list that shows Other's files reads like a contradiction
        bits = [f"only Other touched ({_plural(len(other.files), 'file')})"]
    if not rules_configured(audit):
        bits.append("no drift rules configured or inferred" if audit.findings.inference
                    else "no drift rules configured")
    elif not audit.findings.rules_run and not audit.findings.findings and audit.findings.inferred:
        bits.append("no inferred rule could be checked")  # the folded list says which file each one lost
    elif not audit.findings.rules_run and not audit.findings.findings:
        bits.append("drift rules could not run")
    else:
        new = [f for f in audit.findings.findings if f.status in ("new", "changed")]
        bits.append(_plural(len(new), "new warning") if new else "no new drift")
    passed = [s for s in suites if s.outcome == "passed"]
    if passed:
        bits.append(f"{_plural(len(passed), 'suite')} passed")
    return "pass", ", ".join(bits)


def rules_configured(audit: Audit) -> bool:
    """Some rule ran (``rules_run``), or something shows one exists: a finding, an entry not checked, or an
    inferred invariant (listed even where this PR left it nothing to check)."""
    f = audit.findings
    return bool(f.rules_run or f.findings or f.unchecked or f.inferred)


def warnings_of(audit: Audit) -> list[str]:
    """Lines under the headline: states that make a green verdict mean less than it says."""
    out = []
    if audit.head_config_error:
        out.append(f"This PR's {code('.github/drift-audit.toml')} does not load, so this audit used the base's; "
                   f"after the merge every audit stops on it: {text(clip(audit.head_config_error, 400))}")
    if not rules_configured(audit) and audit.findings.inference:
        out.append("Nothing was checked for drift: no rules configured, none inferred (see Findings).")
    elif not rules_configured(audit):
        out.append(f"No drift rules configured: nothing was checked for drift. {code('drift-audit init')} "
                   "proposes rules from this repository's code.")
    notes = dedupe_notes(audit.findings.unchecked)
    if notes:
        more = f" (and {len(notes) - 1} more, folded below)" if len(notes) > 1 else ""
        out.append(f"The config could not be fully checked: {notes[0]}{more}.")
    return out


def dedupe_notes(notes: list[Unchecked]) -> list[str]:
    """One line per distinct problem. A rule blocked by a broken fact points at that fact's line
    instead of repeating its reason ("fact 'a' … fact 'a' …")."""
    fact_reasons: dict[str, str] = {}
    for n in notes:
        m = _BLOCKED.match(n.entry)
        if m and n.entry.startswith("fact "):
            fact_reasons.setdefault(m.group(1), n.reason)
    seen: dict[tuple[str, str], int] = {}
    for n in notes:
        reason = _own_prefix(n.entry).sub("", n.reason, count=1)  # "fact 'a' (…): fact 'a' (line 1): …"
        if not n.entry.startswith("fact "):
            for fid, why in fact_reasons.items():
                reason = reason.replace(f"fact '{fid}' {why}", f"fact '{fid}' (see its entry)")
        key = (n.entry, reason)
        seen[key] = seen.get(key, 0) + 1
    return [f"{text(entry)}: {text(clip(reason, 400))}" + (f" (×{count})" if count > 1 else "")
            for (entry, reason), count in seen.items()]


def _own_prefix(entry: str) -> re.Pattern[str]:
    m = re.match(r"(fact|rule|suite|pillar) '([^']*)'", entry)
    if not m:
        return re.compile(r"(?!)")
    return re.compile(rf"^{re.escape(m.group(0))}(?: \([^)]*\))?: ")


def joined(items: list[str], cap: int, budget: int = LINE_BUDGET) -> str:
    """Prose items on one line, "; "-separated: at most ``cap`` of them and about ``budget`` characters,
    the rest counted ("; … 3 more"), so no line outgrows a screen."""
    shown: list[str] = []
    used = 0
    for item in items[:cap]:
        piece = clip(item, max(budget - used, 80))
        if shown and used + len(piece) > budget:
            break
        shown.append(text(piece))
        used += len(piece) + 2
    hidden = len(items) - len(shown)
    return "; ".join(shown) + (f"; … {hidden} more" if hidden else "")


def fenced(body: str) -> str:
    """A fenced code block that nothing in ``body`` can close: the fence outruns every backtick run."""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(4, longest + 1)
    return f"{fence}text\n{body.rstrip()}\n{fence}"


@dataclass
class _Touch:
    path: str
    symbols: str  # markdown
    why: str  # markdown


@dataclass
class _PillarRow:
    id: str
    title: str
    files: int
    symbols: int
    findings: int  # new or changed: what this PR did to the pillar
    pre: int  # pre-existing: also on the base, shown apart so they are not read as the PR's
    suites: int
    touches: list[_Touch] = field(default_factory=list)
    more: int = 0  # touches not listed at this level of detail


def _fit(names: list[str], cap: int, budget: int = SYMBOL_BUDGET) -> str:
    shown: list[str] = []
    used = 0
    for name in names[:cap]:
        if shown and used + len(name) > budget:
            break
        shown.append(code(name))
        used += len(name) + 2
    hidden = len(names) - len(shown)
    return ", ".join(shown) + (f" +{hidden} more" if hidden else "")


def _suites_for(p: PillarHit, plan_suites: list[PlannedSuite]) -> int:
    files = set(p.files)
    return len({s.id for s in plan_suites
                if any(f"pillar '{p.id}'" in r or any(path in r for path in files) for r in s.reasons)})


def _pillar_rows(audit: Audit, limits: dict) -> list[_PillarRow]:
    plan_suites = audit.plan.suites if audit.plan else []
    rows = []
    for p in audit.pillars.pillars:
        touches = []
        for t in p.touches[: limits["files"]]:
            why = "no pillar glob" if t.reason == "fallback" else f"{t.reason} {code(t.pattern)}"
            touches.append(_Touch(t.path, _fit(t.symbols, limits["symbols"]), why))
        rows.append(_PillarRow(
            id=p.id, title=p.title, files=len(p.files), symbols=len(p.symbols),
            findings=sum(1 for f in audit.findings.findings if f.pillar == p.id and f.status in ("new", "changed")),
            pre=sum(1 for f in audit.findings.findings if f.pillar == p.id and f.status == "pre-existing"),
            suites=_suites_for(p, plan_suites), touches=touches, more=len(p.touches) - len(touches),
        ))
    return rows


@dataclass
class _View:
    """Everything the templates show, computed once: templates only lay it out."""

    audit: Audit
    blob_url: str | None
    limits: dict
    severity_icon: dict = field(default_factory=lambda: SEVERITY_ICON)
    outcome_icon: dict = field(default_factory=lambda: OUTCOME_ICON)

    def __post_init__(self) -> None:
        a, findings = self.audit, self.audit.findings.findings
        self.shown = [f for f in findings if f.status in ("new", "changed")]
        self.changed = sum(1 for f in self.shown if f.status == "changed")
        self.pre = [f for f in findings if f.status == "pre-existing"]
        self.fixed = [f for f in findings if f.status == "fixed"]
        self.soft = [f for f in findings if f.status in ("improved", "no-baseline")]
        improved = sum(1 for f in self.soft if f.status == "improved")
        parts = [f"{improved} improved by this PR" if improved else "",
                 f"{len(self.soft) - improved} with no baseline (the rule could not run on the base)"
                 if len(self.soft) > improved else ""]
        self.soft_title = f"{_plural(len(self.soft), 'finding')}: " + ", ".join(p for p in parts if p)
        self.rules_configured = rules_configured(a)
        self.rules_run = len(a.findings.rules_run)
        self.notes = dedupe_notes(a.findings.unchecked)
        self.pillars = _pillar_rows(a, self.limits)
        results: list[SuiteResult] = a.results.suites if a.results else []
        self.ran = [r for r in results if r.outcome not in NOT_RUN]
        self.ran_runners = list(dict.fromkeys(r.runner for r in self.ran))
        self.not_run = [r for r in results if r.outcome in NOT_RUN]
        done = {(r.suite, r.runner) for r in results}
        self.filtered = a.plan.filtered if a.plan else []
        runner = a.request.options.runner or ""
        self.filter_note = (f"left out by {code('--runner ' + runner)}" if a.request.trigger == "cli"
                            else f"left out: only {text(runner)} was asked for")
        self.pending = [s for s in (a.plan.suites if a.plan else []) if (s.id, s.runner) not in done]
        counts: dict[str, int] = {}
        for r in results:
            label = "not runnable here" if r.outcome == "not-runnable" else r.outcome
            counts[label] = counts.get(label, 0) + 1
        self.test_counts = " · ".join(f"{OUTCOME_ICON.get(k, '')} {n} {k}".strip() for k, n in counts.items())

    def where(self, loc: Location) -> str:
        if self.blob_url:
            return blob_link(self.blob_url, loc.path, loc.line)
        return code(f"{loc.path}:{loc.line}")

    @staticmethod
    def run_hint(suite: str, runner: str) -> str:
        on = f" on {runner}" if runner != "cpu" else ""
        return f"{code('/audit run ' + suite + on)} · {code('drift-audit review --run --suite ' + suite)}"


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
    warnings = warnings_of(audit)
    icon = {"pass": "⚠️" if warnings else "✅", "fail": "❌"}.get(verdict, "⚪")
    return {
        "audit": audit,
        "verdict": verdict,
        "headline": headline,
        "icon": icon,
        "warnings": warnings,
        "blob_url": ctx.blob_url,
        "details_url": ctx.details_url,
        "marker": COMMENT_MARKER,
        "version": _version(),
    }


def render_at(audit: Audit, ctx: Context, level: int, template: str = "comment.md.j2", truncated: bool = False) -> str:
    limits = _LEVELS[level]
    base = _context(audit, ctx)
    view = _View(audit, ctx.blob_url, limits)
    return environment().get_template(template).render(**base, v=view, limits=limits, truncated=truncated)


def build_report(audit: Audit, ctx: Context) -> Report:
    verdict, headline = verdict_of(audit)
    full = render_at(audit, ctx, 0)
    markdown, truncated = full, False
    if len(full) > COMMENT_LIMIT:
        truncated = True
        for level in range(1, len(_LEVELS)):
            markdown = render_at(audit, ctx, level, truncated=True)
            if len(markdown) <= COMMENT_LIMIT:
                break
        pointer = f"**Comment cut at GitHub's size limit.** The rest is in the check run and in {ctx.json_hint}."
        markdown = _cut(markdown, COMMENT_LIMIT, pointer)

    summary = render_at(audit, ctx, 2, "check_summary.md.j2")
    summary = _cut(summary, CHECK_LIMIT, f"Summary cut at GitHub's size limit; see {ctx.json_hint}.")
    check_text = _cut(full, CHECK_LIMIT, f"Cut at GitHub's size limit; see {ctx.json_hint}.") if truncated else ""
    shown = [f for f in audit.findings.findings if f.status in ("new", "changed")]
    return Report(
        verdict=verdict,  # type: ignore[arg-type]
        headline=headline,
        markdown=markdown,
        check_title=f"Drift Audit: {headline}",
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
