"""Real temporary git repositories for selection and executor tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


class GitRepo:
    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")
        self.git("config", "user.email", "t@example.com")
        self.git("config", "user.name", "t")
        self.git("config", "commit.gpgsign", "false")

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.path), *args], check=True, capture_output=True, text=True).stdout

    def write(self, files: dict[str, str | None]) -> None:
        for rel, text in files.items():
            p = self.path / rel
            if text is None:
                self.git("rm", "-q", rel)
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            self.git("add", rel)

    def commit(self, files: dict[str, str | None] | None = None, message: str = "change") -> str:
        if files:
            self.write(files)
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD").strip()


@pytest.fixture
def git_repo(tmp_path):
    return GitRepo(tmp_path / "repo")


try:  # the GitHub REST stand-in, shared with the bot's tests
    from tests.ghstub.fixtures import ghstub  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - only while the stand-in is absent
    if not (exc.name or "").startswith("tests.ghstub"):
        raise
