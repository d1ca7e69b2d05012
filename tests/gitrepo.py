"""Real git repositories in temporary directories, for tests that need history.

Git runs in the sample pack's sealed environment (a fixed identity, no user or system config), the
same one the demo and the checks benchmark build their repositories in.
"""

from __future__ import annotations

import os
from pathlib import Path

from checks.packs.sample import commit_over as commit
from checks.packs.sample import git, init_repo

__all__ = ["GitRepo", "commit", "git", "init_repo"]


class GitRepo:
    def __init__(self, root: Path):
        self.root = init_repo(Path(root))

    @property
    def path(self) -> Path:
        return self.root

    def git(self, *args: str) -> str:
        return git(self.root, *args)

    def write(self, path: str, content: str | bytes) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)

    def rm(self, path: str) -> None:
        self.git("rm", "-q", path)

    def mv(self, old: str, new: str) -> None:
        (self.root / new).parent.mkdir(parents=True, exist_ok=True)
        self.git("mv", old, new)

    def chmod_x(self, path: str) -> None:
        os.chmod(self.root / path, 0o755)

    def commit(self, message: str = "change") -> str:
        """Commit whatever the work tree holds now."""
        return commit(self.root, {}, message)

    def commit_files(self, files: dict[str, str | None] | None = None, message: str = "change") -> str:
        return commit(self.root, files or {}, message)
