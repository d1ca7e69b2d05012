"""The /audit grammar: every form, and help (never silence) for anything else."""

from __future__ import annotations

import pytest

from bot.commands import HELP, find_command, parse_command


def test_each_form():
    assert parse_command("/audit").action == "audit"
    full = parse_command("/audit full")
    assert full.action == "full" and full.options.all_suites and full.wants_gpu
    pillars = parse_command("/audit pillars=wiring,runtime")
    assert pillars.options.pillars == ["wiring", "runtime"] and not pillars.wants_gpu
    run = parse_command("/audit run parity-rmsnorm on sm120")
    assert run.options.suites == ["parity-rmsnorm"] and run.options.runner == "sm120" and run.wants_gpu
    assert parse_command("/audit run decode-v3").options.runner is None
    assert parse_command("/audit retry").options.failed_only
    assert parse_command("/AUDIT help").action == "help" and parse_command("/audit help").error is None


@pytest.mark.parametrize(
    "text",
    [
        "/audit fulll",
        "/audit run",
        "/audit run x on sm100",
        "/audit run a b c d",
        "/audit pillars=",
        "/audit retry now",
        "/audit pillars=a;rm -rf",
    ],
)
def test_unknown_forms_get_help(text):
    cmd = parse_command(text)
    assert cmd.replies_with_help and cmd.error
    assert "/audit run <suite>" in HELP


def test_find_command_skips_quotes_and_code():
    assert find_command("> /audit full\nthanks") is None
    assert find_command("```\n/audit full\n```") is None
    assert find_command("please\n  /audit retry  \n") == "/audit retry"
    assert find_command("see /audit docs") is None  # only a line that starts with /audit


@pytest.mark.parametrize(
    "body",
    [
        "~~~\n/audit full\n~~~",
        "```\n/audit full\n```",
        "intro\n\n    /audit full\n",  # indented code
        "<!--\n/audit full\n-->",
        "text <!-- \n/audit full\n --> more",  # an HTML comment inside a paragraph
        "> quoted\n/audit full",  # a lazy continuation line belongs to the quote
        "> > nested\n> /audit full",
        "- item\n\n      /audit full",  # code inside a list item
        "`/audit full`",
        "[/audit full](https://example.com)",
        "<details>\n/audit full\n</details>",
    ],
)
def test_commands_inside_code_quotes_comments_and_html_are_not_commands(body):
    assert find_command(body) is None


@pytest.mark.parametrize("separator", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_only_commonmark_line_endings_split_lines(separator):
    assert find_command(f"thanks{separator}/audit full") is None  # one line that does not start with /audit
    assert find_command("thanks\r\n/audit full") == "/audit full"
    assert find_command("thanks\r/audit full") == "/audit full"


def test_paragraph_text_is_acted_on():
    assert find_command("LGTM\n\n/audit run parity-loader on sm90") == "/audit run parity-loader on sm90"
    assert find_command("- /audit full") == "/audit full"  # a list item's paragraph
    assert find_command("first line\n/audit retry") == "/audit retry"
    assert parse_command(find_command("/audit run `parity-loader`")).error  # code spans are never arguments


def test_parsing_is_linear_and_capped():
    import time

    clock = time.process_time  # CPU seconds: what a hostile comment costs, whatever else the machine runs
    redos = "/audit x" + " " * 65_000 + "y"
    start = clock()
    line = find_command(redos)
    cmd = parse_command(line)
    assert clock() - start < 0.5
    assert cmd.replies_with_help and "longer than 256" in cmd.error
    for hostile in ("/audit " + "[" * 60_000, "/audit " + "*a_" * 20_000, "> " * 30_000 + "/audit", "/audit\n" * 9000):
        start = clock()
        found = find_command(hostile)
        assert clock() - start < 3.0, hostile[:20]  # markdown-it is linear; 65 KB at most
        if found:
            parse_command(found)
    megabyte = "/audit full\n" + "x" * (1 << 20)
    start = clock()
    assert find_command(megabyte) is None  # over GitHub's own 65,536-character limit: not a comment GitHub sends
    assert clock() - start < 0.1


def _live(markdown: str) -> list[str]:
    """Links, images, raw HTML and @mentions that would render live (outside code) on GitHub."""
    from markdown_it import MarkdownIt

    found = []
    for block in MarkdownIt("commonmark").parse(markdown):
        for tok in block.children or []:
            if tok.type in ("link_open", "image", "html_inline"):
                found.append(tok.type)
            elif tok.type == "text" and "@octocat" in tok.content:
                found.append("mention")
        if block.type == "html_block":
            found.append("html_block")
    return found


@pytest.mark.parametrize(
    "line",
    [
        "/audit run a`[x](javascript:alert(1))`@octocat",
        "/audit run x on sm9`0 @octocat [y](http://e.x)`",
        "/audit pillars=a``,`@octocat <img src=x>",
        "/audit ``` @octocat [z](http://e.x)",
    ],
)
def test_errors_quote_the_commenters_text_as_inert_code(line):
    cmd = parse_command(line)
    assert cmd.error
    assert _live(f"{cmd.error}.") == []
