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

from checks.model import AuditOptions

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

_LINE = re.compile(r"^\s*/audit(?:\s+(?P<rest>.*?))?\s*$", re.IGNORECASE)
_SUITE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
_PILLAR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


@dataclass
class Command:
    action: str  # audit | full | pillars | run | retry | help
    options: AuditOptions = field(default_factory=AuditOptions)
    error: str | None = None  # set when the text was not understood; the reply is the help text
    text: str = ""

    @property
    def wants_gpu(self) -> bool:
        return self.action in ("full", "run", "retry")

    @property
    def replies_with_help(self) -> bool:
        return self.action == "help" or self.error is not None


def find_command(body: str) -> str | None:
    """The first ``/audit`` line of a comment (quoted lines and code blocks are ignored)."""
    in_fence = False
    for line in (body or "").splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence or line.lstrip().startswith(">"):
            continue
        if _LINE.match(line):
            return line.strip()
    return None


def parse_command(line: str) -> Command:
    m = _LINE.match(line or "")
    if not m:
        return Command("help", error="not an /audit command", text=line)
    words = (m.group("rest") or "").split()
    text = line.strip()
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
            return Command("help", error=f"`pillars=` needs comma-separated pillar ids, got `{head[8:]}`", text=text)
        return Command("pillars", AuditOptions(run=True, pillars=ids), text=text)
    if head == "run":
        if len(rest) == 1 or (len(rest) == 3 and rest[1].lower() == "on"):
            suite = rest[0]
            runner = rest[2].lower() if len(rest) == 3 else None
            if not _SUITE.match(suite):
                return Command("help", error=f"`{suite[:100]}` is not a suite id", text=text)
            if runner is not None and runner not in RUNNER_LABELS:
                return Command(
                    "help", error=f"unknown runner `{runner[:20]}` (use {', '.join(RUNNER_LABELS)})", text=text
                )
            return Command("run", AuditOptions(run=True, suites=[suite], runner=runner), text=text)
        return Command("help", error="usage: `/audit run <suite> [on sm90|sm120]`", text=text)
    return Command("help", error=f"unknown option `{' '.join(words)[:100]}`", text=text)
