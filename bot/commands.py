"""The ``/audit`` comment grammar. Anything it does not understand gets the help text back.

/audit                         re-run the audit
/audit full                    run every suite
/audit pillars=wiring,runtime  report only these pillars
/audit run <suite> [on sm90|sm120]
/audit retry                   re-run the suites that failed last time
/audit help
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.token import Token

from checks.model import AuditOptions
from runner.report.safe import code

RUNNER_LABELS = ("sm90", "sm120", "cpu")
HELP = """\
**Drift Audit commands** (one per comment line):

| command | what it does |
|---|---|
| `/audit` | re-run the audit of this PR's head |
| `/audit full` | run every suite, ignoring selection |
| `/audit pillars=wiring,runtime` | report only these pillars |
| `/audit run <suite> [on sm90\\|sm120]` | run one suite, optionally on one runner label |
| `/audit retry` | re-run only the suites that failed last time |
| `/audit help` | this text |

A command starts suites on GPU runners only when its author has write access to the repository.
"""

MAX_BODY = 65_536  # GitHub's own limit on a comment body, in characters
MAX_LINE = 256  # a command line longer than this is answered with help, never parsed further
_OPAQUE = "\x00"  # stands in for inline code, HTML, links and emphasis: such a line is never a command
_SUITE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
_PILLAR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_MARKDOWN = MarkdownIt("commonmark")


@dataclass
class Command:
    action: str  # audit | full | pillars | run | retry | help
    options: AuditOptions = field(default_factory=AuditOptions)
    error: str | None = None  # set when the text was not understood; the reply is the help text (safe markdown)
    text: str = ""

    @property
    def wants_gpu(self) -> bool:
        return self.action in ("full", "run", "retry")

    @property
    def replies_with_help(self) -> bool:
        return self.action == "help" or self.error is not None


def find_command(body: str) -> str | None:
    """The first ``/audit`` line of a comment's paragraph text, as GitHub renders it (CommonMark).

    Fences, indented code, HTML blocks and comments, block quotes (lazy continuation lines
    included) and inline code never carry a command. Lines split only at the line endings
    CommonMark knows, so ``\x0b``, ``\x85`` or ``\u2028`` inside a line do not start a new one.
    Bodies over GitHub's limit are not parsed; the parse itself is linear in the body.
    """
    if not body or len(body) > MAX_BODY or "/audit" not in body.lower():
        return None
    quoted = 0
    for token in _MARKDOWN.parse(body):
        if token.type == "blockquote_open":
            quoted += 1
        elif token.type == "blockquote_close":
            quoted -= 1
        elif token.type == "inline" and not quoted:
            for line in _paragraph_lines(token):
                if _is_command(line):
                    text = line.strip(" \t")
                    return text if len(text) <= MAX_LINE else text[:MAX_LINE] + "…"  # parse_command refuses it
    return None


def _paragraph_lines(inline: Token) -> list[str]:
    """Visible plain text of one paragraph, one string per source line."""
    lines, current = [], []
    for child in inline.children or []:
        if child.type == "text":
            current.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            lines.append("".join(current))
            current = []
        else:
            current.append(_OPAQUE)
    lines.append("".join(current))
    return lines


def _is_command(line: str) -> bool:
    text = line.lstrip(" \t")
    return text[:6].lower() == "/audit" and (len(text) == 6 or text[6] in " \t")


def parse_command(line: str) -> Command:
    """One command line → a Command; linear in the line, which is capped at ``MAX_LINE`` characters."""
    text = (line or "").strip(" \t")
    if not _is_command(text):
        return Command("help", error="not an /audit command", text=text[:MAX_LINE])
    if len(text) > MAX_LINE:
        return Command("help", error=f"the command is longer than {MAX_LINE} characters", text=text[:MAX_LINE])
    if _OPAQUE in text:
        return Command("help", error="write the command as plain text (no code spans, links or HTML)", text=text)
    words = text[6:].split()
    if not words:
        return Command("audit", AuditOptions(run=True), text=text)
    head, rest = words[0].lower(), words[1:]
    if head == "help" and not rest:
        return Command("help", text=text)
    if head == "full" and not rest:
        return Command("full", AuditOptions(run=True, all_suites=True), text=text)
    if head == "retry" and not rest:
        return Command("retry", AuditOptions(run=True, failed_only=True), text=text)
    if head.startswith("pillars=") and not rest:
        ids = [p for p in head.split("=", 1)[1].split(",") if p]
        bad = [p for p in ids if not _PILLAR.match(p)]
        if not ids or bad:
            return Command("help", error=f"`pillars=` needs comma-separated pillar ids, got {code(head[8:100])}", text=text)
        return Command("pillars", AuditOptions(run=True, pillars=ids), text=text)
    if head == "run":
        if len(rest) == 1 or (len(rest) == 3 and rest[1].lower() == "on"):
            suite = rest[0]
            runner = rest[2].lower() if len(rest) == 3 else None
            if not _SUITE.match(suite):
                return Command("help", error=f"{code(suite[:100])} is not a suite id", text=text)
            if runner is not None and runner not in RUNNER_LABELS:
                return Command(
                    "help", error=f"unknown runner {code(runner[:20])} (use {', '.join(RUNNER_LABELS)})", text=text
                )
            return Command("run", AuditOptions(run=True, suites=[suite], runner=runner), text=text)
        return Command("help", error="usage: `/audit run <suite> [on sm90|sm120]`", text=text)
    return Command("help", error=f"unknown option {code(' '.join(words)[:100])}", text=text)
