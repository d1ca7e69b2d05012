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
