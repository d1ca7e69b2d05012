"""Real temporary git repositories for the selection tests."""

from __future__ import annotations

import pytest

from tests.gitrepo import GitRepo


@pytest.fixture
def git_repo(tmp_path):
    return GitRepo(tmp_path / "repo")
