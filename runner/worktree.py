"""A temporary ``git worktree`` of the head commit, for running suites against exactly that tree.

Suites must run against the commit under review, not whatever the user's work
tree holds. A detached worktree shares the object database (no clone, no
network) and is removed afterwards even when a suite crashed.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class WorktreeError(RuntimeError):
    pass


def _git(repo: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)


@contextmanager
def head_worktree(repo, sha: str) -> Iterator[str]:
    """Yield the path of a detached worktree of ``sha`` in ``repo`` (a path or a git.Repo)."""
    repo_path = str(getattr(repo, "working_dir", None) or getattr(repo, "git_dir", None) or repo)
    probe = _git(repo_path, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}")
    if probe.returncode != 0:
        raise WorktreeError(f"{repo_path}: '{sha}' is not a commit in this repository")
    full = probe.stdout.strip()
    parent = tempfile.mkdtemp(prefix="drift-audit-head-")
    path = str(Path(parent) / full[:12])
    added = _git(repo_path, "worktree", "add", "--detach", "--quiet", path, full)
    if added.returncode != 0:
        shutil.rmtree(parent, ignore_errors=True)
        raise WorktreeError(f"git worktree add failed for {full[:12]}: {added.stderr.strip()}")
    try:
        yield path
    finally:
        removed = _git(repo_path, "worktree", "remove", "--force", path)
        shutil.rmtree(parent, ignore_errors=True)
        if removed.returncode != 0:
            _git(repo_path, "worktree", "prune")
