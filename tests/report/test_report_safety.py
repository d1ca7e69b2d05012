"""Markdown breakout: text from the PR (paths, symbols, messages, suite output) never becomes a link,
an image, raw HTML or a live @mention / #reference in the rendered comment.

The comment is parsed as GitHub would (CommonMark + GFM tables and autolinks, by markdown-it-py) and its
tokens are checked, over seeded random payloads built from the constructs that break out.
"""

from __future__ import annotations

import random
import re
from html.parser import HTMLParser

import pytest
from linkify_it import LinkifyIt
from markdown_it import MarkdownIt

from checks.model import (
    Audit,
    AuditRequest,
    CaseResult,
    ChangeSet,
    Checkout,
    DeviceFingerprint,
    Finding,
    Findings,
    Location,
    PillarHit,
    PillarMap,
    PlannedSuite,
    Results,
    SuiteResult,
    Touch,
    Unchecked,
)
from checks.model import (
    TestPlan as Plan,
)
from runner.report import Context, report
from runner.report.safe import ZWSP, code, html_text, text

BLOB = "https://github.com/o/r/blob/" + "b" * 40
DETAILS = "https://audit.example/audits/da-1"
ALLOWED_TAGS = {"details", "summary", "sub", "br"}
PAYLOADS = [
    "[click](javascript:alert(1))", "![img](http://e.example/x.png)", "<img src=x onerror=alert(1)>", "<script>",
    "<a href='http://e.example'>", "</details>", "<details>", "<!--", "-->", "@octocat", "@org/team", "#123",
    "GH-42", "owner/repo#7", "http://e.example/p", "https://e.example", "www.example.com", "a@b.com",
    "<https://e.example>", "[ref]: http://e.example", "[ref]", "`", "``", "```", "````", "~~~", "|", "\n", "\r\n",
    "\u2028", "\x0b", "\\", "*", "_", "**", "&#64;octocat", "&lt;img&gt;", "$x$", "\t", "    indented", "> quote",
    "- item", "1. item", "# head", "---", "===", ":smile:", "]", ")", "(", "[", "!", "<", ">", "&", '"', "'",
]


def payload(rng: random.Random) -> str:
    return "".join(rng.choice(PAYLOADS) + rng.choice(["", " ", "x", "y/z.py"]) for _ in range(rng.randint(1, 6)))


def fuzzed_audit(rng: random.Random) -> Audit:
    p = lambda: payload(rng)  # noqa: E731
    path = f"engine/{p()}.py"
    findings = [
        Finding(p(), "wiring", "error", p(), [Location(path, 3, note=p()), Location(p(), 9)], status="new",
                source="inferred", evidence=[p(), p()]),
        Finding(p(), "wiring", "warning", p(), [Location(path, 4)], status="changed", source="cochange",
                evidence=[p()]),
        Finding(p(), "weights", "error", p(), [Location(p(), 1, note=p())], status="pre-existing"),
        Finding(p(), "wiring", "note", p(), [Location(p(), 2)], status="improved"),
    ]
    unchecked = [Unchecked(f"fact '{p()}'", p()), Unchecked(f"rule '{p()}'", p())]
    touch = Touch(path, "symbol", p(), [p(), p()], [3])
    pillars = PillarMap([PillarHit("wiring", p(), [path, p()], [f"{path}::{p()}"], [touch]),
                         PillarHit("weights", "Weights", [], [], [])])
    plan = Plan("da-1", "b" * 40, [PlannedSuite(p(), "parity", "pytest", "sm90", reasons=[p(), p()]),
                                       PlannedSuite(p(), "unit", "pytest", "cpu", reasons=[p()])], not_affected=[p()])
    results = Results("da-1", "b" * 40, [
        SuiteResult(plan.suites[0].id, "sm90", "failed", 1.0, reason=p(), output_tail=p() + "\n" + p(),
                    cases=[CaseResult(p(), "failed", 0.1, p(), {"max_abs": 1.0, "first_divergence": p()})],
                    metrics={"max_abs": p(), "first_divergence": 3, "near_tie_margin": p()}),
        SuiteResult(p(), "cpu", "not-runnable", reason=p()),
        SuiteResult(p(), "cpu", "skipped", reason=p()),
    ], devices=[DeviceFingerprint("sm90", gpu=p(), compute_capability=p(), driver=p())])
    co = Checkout("/r", "a" * 40, "b" * 40, "a" * 40)
    return Audit(AuditRequest("/r", "a", "b"), co, p(), ChangeSet("a" * 40, "b" * 40, "a" * 40), pillars,
                 Findings(findings, unchecked, rules_run=["r1"], inferred=[p(), p()]), plan, results,
                 timings={"diff": 0.1})


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.comments: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag if not attrs else f"{tag} with {attrs}")

    def handle_endtag(self, tag):
        self.tags.append(tag)

    def handle_comment(self, data):
        self.comments.append(data)


MENTION = re.compile(r"(?<![\w`])@[A-Za-z0-9]")
REFERENCE = re.compile(r"(?<![\w&])#\d|\bGH-\d")
# GitHub's extended autolinks (cmark-gfm): www. and e-mail. linkify-it is looser (it links any
# "label.com", and reads a zero-width space as part of an international domain name), so these two
# are matched as GitHub does and linkify-it is left with the scheme links (http://, https://, mailto:).
WWW = re.compile(r"\bwww\.[A-Za-z0-9\-]")
EMAIL = re.compile(r"[\w.+\-]@[A-Za-z0-9\-_]+\.[A-Za-z0-9]")


def _parser() -> MarkdownIt:
    md = MarkdownIt("gfm-like")
    md.linkify = LinkifyIt().set({"fuzzy_link": False, "fuzzy_email": False})
    return md


def _live_text(piece: str, where: str) -> list[str]:
    found = [f"mention {m!r} in {where}" for m in MENTION.findall(piece)]
    found += [f"reference {m!r} in {where}" for m in REFERENCE.findall(piece)]
    found += [f"autolink {m!r} in {where}" for m in WWW.findall(piece) + EMAIL.findall(piece)]
    return found


def breakouts(markdown: str) -> list[str]:
    """Everything live in the rendered markdown that the templates did not put there."""
    found: list[str] = []
    for tok in _parser().parse(markdown):
        if tok.type == "html_block":
            found += _html(tok.content)
        if tok.type != "inline":
            continue
        joined = []  # the inline's text as GitHub's text filters see it: one run between non-text nodes
        for child in tok.children or []:
            if child.type == "text":
                joined.append(child.content)
                continue
            joined.append("\x00")
            if child.type == "image":
                found.append(f"image {child.attrs}")
            elif child.type == "link_open":
                href = str(child.attrs.get("href", ""))
                if not (href.startswith(BLOB + "/") or href == DETAILS):
                    found.append(f"link {href}")
            elif child.type == "html_inline":
                found += _html(child.content)
        found += _live_text("".join(joined), repr(tok.content[:80]))
    return found


def _html(content: str) -> list[str]:
    tags = _Tags()
    tags.feed(content)
    bad = [t for t in tags.tags if t not in ALLOWED_TAGS]
    bad += [c for c in tags.comments if c.strip() != "drift-audit:comment"]
    found = [f"html {b!r} in {content[:80]!r}" for b in bad]
    for piece in re.split(r"<[^>]*>", content):  # text inside raw HTML still goes through GitHub's filters
        found += _live_text(piece, repr(content[:80]))
    return found


def test_fuzzed_comment_has_no_live_user_markup():
    rng = random.Random(1234)
    for _ in range(60):
        audit = fuzzed_audit(rng)
        rep = report(audit, Context(blob_url=BLOB, details_url=DETAILS))
        for body in (rep.markdown, rep.check_summary):
            assert breakouts(body) == [], body
        assert len(rep.markdown) <= 65_536


def test_the_checker_catches_what_it_looks_for():
    """The token check is not vacuous: the raw payloads, unescaped, are caught."""
    raw = "[click](http://e.example) ![i](x.png) <img src=x> @octocat #12 www.example.com a@b.com"
    found = " ".join(breakouts(raw))
    for kind in ("link http://e.example", "image", "html \"img with", "mention", "reference",
                 "autolink 'www.e'", "autolink 'a@b.c'"):
        assert kind in found, found
    assert breakouts(text(raw)) == [] and breakouts(code(raw)) == []
    assert breakouts(f"<details><summary>{html_text(raw)}</summary>\n\n</details>\n") == []


def test_issue_14_file_name_stays_code():
    name = "engine/x``y [click](javascript:alert(1)) @octocat ``z.py"
    span = code(name)
    assert span == "```engine/x``y [click](javascript:alert(1)) @octocat ``z.py```"
    tokens = MarkdownIt("gfm-like").parseInline(span)[0].children
    assert [t.type for t in tokens] == ["code_inline"] and tokens[0].content == name


@pytest.mark.parametrize("value", ["`", "``a", "a`", " a ", "a ` b", "````", "x|y", "", " ", "a\nb"])
def test_code_span_round_trips(value):
    tokens = MarkdownIt("gfm-like").parseInline(code(value))[0].children
    assert [t.type for t in tokens] == ["code_inline"]
    expected = value.replace("\n", " ") or " "
    assert tokens[0].content == expected


def test_code_span_round_trips_fuzzed():
    rng = random.Random(99)
    alphabet = "`` ` a|b\\*_<>[]()@#\t"
    for _ in range(500):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        if not value.strip(" "):
            continue
        tokens = MarkdownIt("gfm-like").parseInline(code(value))[0].children
        assert [t.type for t in tokens] == ["code_inline"], value
        assert tokens[0].content == value, value


def test_text_reads_the_same():
    rendered = MarkdownIt("gfm-like").render(text("see @bob, #12 and [x](y) <b>"))
    plain = re.sub(r"<[^>]+>", "", rendered).replace(ZWSP, "").strip()
    import html

    assert html.unescape(plain) == "see @bob, #12 and [x](y) <b>"
