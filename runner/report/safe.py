"""Markdown that user- and code-derived text cannot break out of.

Paths, symbol names, messages, suite reasons and test output come from the
PR's code. On GitHub that text must never become a link, an image, raw HTML,
an @mention that pings someone, or a #123 reference. Two helpers cover every
use: ``code()`` for a literal code span and ``text()`` for prose; ``html_text()`` is
``text()`` for the few places that are raw HTML (``<summary>`` lines).
"""

from __future__ import annotations

import html
import re
from urllib.parse import quote

ZWSP = "\u200b"  # zero-width space: breaks GitHub's mention / reference / autolink detection, invisible
_BACKTICKS = re.compile(r"`+")
# Every ASCII punctuation mark that can open markdown or HTML syntax inline. CommonMark lets any
# ASCII punctuation be backslash-escaped, so the escape is always literal.
_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#!|~&$])")
# Where GitHub would make a live mention, issue/PR reference or bare-URL autolink: a ZWSP goes here.
# A mention needs no word character before the @; an e-mail autolink needs a dotted domain after it.
_BREAKS = re.compile(
    r"(?<!\w)@(?=[\w\-])|(?<=[\w.+\-])@(?=[\w.\-]*\.\w)|#(?=\d)|\bGH-(?=\d)|(?<=[A-Za-z]):(?=//)|\bwww\.",
    re.IGNORECASE,
)
_LINE_BREAKS = re.compile(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f]")


def _flat(value: object) -> str:
    """One line, no control characters: a value never opens a block of its own."""
    return _CONTROL.sub("\ufffd", _LINE_BREAKS.sub(" ", str(value)))


def text(value: object) -> str:
    """Prose from user-controlled text: every markdown/HTML opener escaped, mentions, references and
    bare-URL autolinks broken with a zero-width space. Reads the same; renders nothing live."""
    broken = _BREAKS.sub(lambda m: m.group(0) + ZWSP, _flat(value))
    return _SPECIAL.sub(r"\\\1", broken)


def html_text(value: object) -> str:
    """Text inside raw HTML (a ``<summary>`` line is an HTML block, where markdown escapes do not
    apply): entity-escaped, with mentions, references and autolinks broken as in ``text()``."""
    return html.escape(_BREAKS.sub(lambda m: m.group(0) + ZWSP, _flat(value)), quote=False)


def code(value: object, *, table: bool = False) -> str:
    """A literal code span of ``value``: fenced by a backtick run longer than any run inside it, padded
    when the value starts or ends with a backtick or a space (CommonMark strips one pad each side).
    ``table=True`` escapes ``|``, which GFM splits table cells on even inside code spans."""
    body = _flat(value)
    if table:
        body = body.replace("|", "\\|")
    if not body:
        return "` `"
    longest = max((len(run) for run in _BACKTICKS.findall(body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if body.strip(" ") and (body[0] in "` " or body[-1] in "` ") else ""  # all-space spans keep theirs
    return f"{fence}{pad}{body}{pad}{fence}"


def link(label: str, url: str) -> str:
    """``[label](url)`` for a URL we built (blob, details); ``label`` must already be safe markdown."""
    return f"[{label}](<{url}>)" if " " in url else f"[{label}]({url})"


def blob_link(blob_url: str, path: str, line: int | None = None) -> str:
    """file:line linked to the head commit's blob; the path is quoted so it cannot end the URL."""
    anchor = f"#L{line}" if line else ""
    label = text(f"{path}:{line}" if line else path)
    return f"[{label}]({blob_url.rstrip('/')}/{quote(path, safe='/')}{anchor})"


def clip(value: object, limit: int) -> str:
    """At most ``limit`` characters of one line, with an ellipsis when cut (before escaping)."""
    flat = _flat(value)
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"
