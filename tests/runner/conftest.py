"""Real temporary git repositories for selection and executor tests."""

from __future__ import annotations

import pytest

from tests.gitrepo import GitRepo


@pytest.fixture
def git_repo(tmp_path):
    return GitRepo(tmp_path / "repo")


try:  # the GitHub REST stand-in, shared with the bot's tests
    from tests.ghstub.fixtures import ghstub  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - only while the stand-in is absent
    if not (exc.name or "").startswith("tests.ghstub"):
        raise
