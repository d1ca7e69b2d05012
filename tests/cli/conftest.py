import pytest

from tests.gitrepo import GitRepo


@pytest.fixture
def repo(tmp_path):
    return GitRepo(tmp_path / "repo")


@pytest.fixture
def two_commits(repo):
    """A repo whose HEAD changes engine/model.py; returns (repo, base sha, head sha)."""
    repo.write("engine/model.py", "def forward(x):\n    return x\n")
    base = repo.commit("base")
    repo.write("engine/model.py", "def forward(x):\n    return x + 1\n")
    head = repo.commit("head")
    return repo, base, head
