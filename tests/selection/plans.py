"""The test plan a zero-config review of one commit range makes (the selection stage alone)."""

from __future__ import annotations

from pathlib import Path

from checks.config import load_config
from checks.diff import build_changeset
from checks.model import AuditOptions, AuditRequest, Findings, TestPlan
from checks.pillars import map_pillars
from checks.workspace import Tree, checkout, open_repo
from runner.select import select_tests


def plan_for(repo: str | Path, base: str, head: str) -> TestPlan:
    """The base commit's config (the built-in default when it has none), no findings, default options."""
    co = checkout(AuditRequest(repo=str(repo), base=base, head=head))
    config = load_config(open_repo(co.repo), co.base_sha)
    changes = build_changeset(co)
    return select_tests(config, changes, map_pillars(co, config, changes), Findings(), AuditOptions(),
                        Tree(co.repo, co.head_sha), "aid")


def selected_tests(repo: str | Path, base: str, head: str) -> list[str]:
    """The test files the plan runs, sorted."""
    return sorted(s.id.removeprefix("pytest:") for s in plan_for(repo, base, head).suites)


def selected_reasons(git_repo, tree: dict[str, str], files: dict[str, str]) -> dict[str, str]:
    """Commit ``tree`` as the base and ``files`` over it as the head: each test the plan runs, with its first reason."""
    base = git_repo.commit_files(tree, "base")
    head = git_repo.commit_files(files)
    return {s.id.removeprefix("pytest:"): s.reasons[0] for s in plan_for(git_repo.path, base, head).suites}
