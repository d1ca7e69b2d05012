"""Audit → what people read: one ``Reporter`` protocol, one module per format.

``report(audit, ctx)`` builds the ``Report`` the bot publishes (PR comment,
check-run summary/text, annotations); ``render(audit, fmt, ctx)`` gives any
single format as text (``drift-audit review --format``). Every reporter takes
the same ``Context``, so the CLI, the Action and the bot render the same way.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Protocol

from checks.model import Audit, Checkout, Report


@dataclass(frozen=True)
class Context:
    """What a reporter needs beyond the audit: where things live on GitHub, if anywhere."""

    blob_url: str | None = None  # https://github.com/o/r/blob/<head sha>: file:line links
    details_url: str | None = None  # the check run's details page
    json_hint: str = "the full JSON (`drift-audit review --format json`)"


_REMOTE = re.compile(r"^(?:https?://(?:[^@/]+@)?(?P<host>[^/:]+)(?::\d+)?/|git@(?P<ssh>[^:]+):)(?P<slug>[\w.-]+/[\w.-]+?)(?:\.git)?/?$")


def repo_web_url(checkout: Checkout) -> str | None:
    """The repository's web URL, for file:line links: the Actions environment's when it is set, else
    the ``origin`` remote's when it points at a GitHub host; None for a repo with no such remote."""
    server, slug = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    if server and slug:
        return f"{server.rstrip('/')}/{slug}"
    repo = checkout.git
    try:
        if repo is None:
            import git

            repo = git.Repo(checkout.repo)
        url = repo.remotes.origin.url if "origin" in [r.name for r in repo.remotes] else ""
    except Exception:  # no remote, an odd config: links are a nicety, never a failure
        return None
    m = _REMOTE.match(url)
    if not m:
        return None
    host = m.group("host") or m.group("ssh")
    return f"https://{host}/{m.group('slug')}" if "github" in host else None


def context_for(audit: Audit, details_url: str | None = None) -> Context:
    """The Context a local review renders with: head-blob links when the repo's web URL is known."""
    web = repo_web_url(audit.checkout)
    return Context(blob_url=f"{web}/blob/{audit.checkout.head_sha}" if web else None, details_url=details_url)


class Reporter(Protocol):
    """One output format of an audit."""

    @property
    def name(self) -> str: ...  # the --format value

    @property
    def media_type(self) -> str: ...

    def render(self, audit: Audit, ctx: Context) -> str: ...


def reporters() -> dict[str, Reporter]:
    """Every format by its ``--format`` name. Imported lazily: the HTML and JUnit ones are rarely needed."""
    from runner.report import html, jsonfmt, junit, markdown, sarif

    found: list[Reporter] = [markdown.MARKDOWN, markdown.CHECK_RUN, jsonfmt.JSON, sarif.SARIF, junit.JUNIT, html.HTML]
    return {r.name: r for r in found}


FORMATS = ("markdown", "json", "sarif", "junit", "html", "check-run")


def render(audit: Audit, fmt: str, ctx: Context | None = None) -> str:
    known = reporters()
    if fmt not in known:
        raise ValueError(f"unknown format '{fmt}'; formats: {', '.join(known)}")
    start = time.perf_counter()
    out = known[fmt].render(audit, ctx or Context())
    audit.timings["report"] = round(time.perf_counter() - start, 4)
    return out


def report(audit: Audit, ctx: Context | None = None) -> Report:
    """The comment, the check-run output and its annotations, as the bot publishes them."""
    from runner.report.markdown import build_report

    start = time.perf_counter()
    out = build_report(audit, ctx or Context())
    audit.timings["report"] = round(time.perf_counter() - start, 4)
    return out
