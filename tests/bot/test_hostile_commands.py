"""Seeded property test of the /audit parser over comments built from markdown's sharp edges: it never raises,
finds at most one plain-text line, never finds one inside code or a quote, parses only well-formed arguments, and
what it answers quotes the commenter inertly."""

from __future__ import annotations

import random
import re
import time

from bot.commands import _PILLAR, _SUITE, MAX_LINE, RUNNER_LABELS, find_command, parse_command
from runner.report.safe import code
from tests.bot.test_bot_commands import _live

SEED = 2718
BODIES = 1500
FRAGMENTS = [
    "/audit", "/AUDIT", "/audits", " full", " run ", "parity-loader", " on ", "sm90", "sm100", " pillars=", "a,b",
    ",", "retry", "help", " ", "\t", "`", "```", "~~~", "> ", "    ", "<!--", "-->", "<b>", "</b>", "[", "](http://e.x)",
    "![i](http://e.x/i.png)", "@octocat", "#12", "\n", "\n\n", "\r\n", "\r", "\x0b", "\x0c", "\x85", "\u2028", "\\",
    "*", "_", "|", "\x00", "é", "\U0001f600", "- ", "1. ", "<!-- drift-audit:comment -->", "&lt;", "x" * 300, "\u202e",
]
_LINE_END = re.compile(r"\r\n|\r|\n")


ARGUMENTS = [" full", " run ", "parity-loader", " on ", "sm90", "sm120", " pillars=", "wiring,runtime", " retry",
             " help", " ", "`", "[", "@octocat", "<b>", "\\", "*", "a;b"]


def _body(rng: random.Random) -> str:
    noise = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 30)))
    if rng.random() < 0.5:
        return noise
    command = "/audit" + "".join(rng.choice(ARGUMENTS) for _ in range(rng.randint(0, 4)))
    return rng.choice(["", "LGTM\n", "x\n\n", "- ", "  "]) + command + rng.choice(["", "\n", "\r\n"]) + noise


def _each_line(body: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in _LINE_END.split(body))


def test_random_comments_parse_safely_and_never_from_code_or_quotes():
    rng = random.Random(SEED)
    found = parsed = 0
    start = time.process_time()
    for _ in range(BODIES):
        body = _body(rng)
        line = find_command(body)
        if line is None:
            continue
        found += 1
        assert line[:6].lower() == "/audit" and (len(line) == 6 or line[6] in " \t"), repr(line)
        assert not _LINE_END.search(line) and len(line) <= MAX_LINE + 1, repr(line)
        cmd = parse_command(line)
        if cmd.replies_with_help:
            lead = f"{code(cmd.text[:200])}: {cmd.error}." if cmd.error else ""
            assert _live(lead) == [], (line, lead)  # what the bot replies renders nothing live
            continue
        parsed += 1
        assert cmd.action in ("audit", "full", "pillars", "run", "retry"), cmd
        assert cmd.wants_gpu == (cmd.action in ("full", "run", "retry"))
        assert all(_SUITE.match(s) for s in cmd.options.suites or [])
        assert all(_PILLAR.match(p) for p in cmd.options.pillars or [])
        assert cmd.options.runner in (None, *RUNNER_LABELS)
        if "`" not in body and "~" not in body:  # inside a fence the same text is never a command
            assert find_command(f"```\n{body}\n```") is None, repr(body)
        assert find_command(_each_line(body, "> ")) is None, repr(body)  # nor inside a block quote
        assert find_command(_each_line(body, "    ")) is None, repr(body)  # nor as indented code
    assert found > BODIES // 20 and parsed > 10, (found, parsed)  # both paths were exercised
    assert time.process_time() - start < 8.0  # linear: a few ms per comment at most
