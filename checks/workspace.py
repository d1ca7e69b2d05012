"""Resolve an AuditRequest to a Checkout and read files from git objects, never a work tree.

Reading blobs straight from the object database means the base config and the
base side of every check are exactly what was committed, whatever the work tree
holds, and lets parses be cached by blob SHA.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import git
from git.exc import BadName, GitCommandError, InvalidGitRepositoryError, NoSuchPathError

from checks.model import AuditRequest, Checkout


class WorkspaceError(RuntimeError):
    """Not a repository, or a revision that does not resolve: a user error, not a crash."""


def open_repo(path: str | Path) -> git.Repo:
    try:
        return git.Repo(path, search_parent_directories=True)
    except (InvalidGitRepositoryError, NoSuchPathError):
        raise WorkspaceError(f"{path}: not a git repository (run inside a repo or pass its path)") from None


def resolve(repo: git.Repo, rev: str) -> str:
    try:
        return repo.commit(rev).hexsha
    except (BadName, ValueError, GitCommandError):
        raise WorkspaceError(f"unknown revision '{rev}' in {repo.working_dir}") from None


def default_base(repo: git.Repo, head: str = "HEAD") -> str:
    """The merge-base with the default branch when head is off it, else head's first parent."""
    head_sha = resolve(repo, head)
    for name in ("origin/HEAD", "origin/main", "origin/master", "main", "master"):
        try:
            branch_sha = repo.commit(name).hexsha
        except (BadName, ValueError, GitCommandError):
            continue
        if branch_sha != head_sha:
            bases = repo.merge_base(branch_sha, head_sha)
            if bases and bases[0].hexsha != head_sha:
                return bases[0].hexsha
        break
    parents = repo.commit(head_sha).parents
    if not parents:
        raise WorkspaceError(f"{head} is a root commit and no default branch differs from it; pass --base")
    return parents[0].hexsha


def _has_commit(repo: git.Repo, sha: str) -> bool:
    try:
        repo.git.cat_file("-e", f"{sha}^{{commit}}")
    except GitCommandError:
        return False
    return True


def merge_base_of(repo: git.Repo, base: str, head: str) -> str:
    """The merge base of two resolved commits, or a WorkspaceError saying which history is missing.

    A shallow clone (actions/checkout fetches one commit by default) names parents it does not hold: the
    default base HEAD~1 resolves, then every git command on it fails."""
    where = repo.working_dir or repo.git_dir
    shallow = Path(repo.git_dir, "shallow").is_file()
    for role, sha in (("head", head), ("base", base)):
        if not _has_commit(repo, sha):
            if shallow:
                depth = sum(1 for _ in repo.iter_commits(head)) if _has_commit(repo, head) else 0
                raise WorkspaceError(
                    f"{role} {sha[:12]} is outside this shallow clone of {where} ({depth} commit(s) of history "
                    "here); fetch more history first: `git fetch --deepen=50` or `git fetch --unshallow` "
                    "(actions/checkout: `fetch-depth: 0`)")
            raise WorkspaceError(f"{role} {sha[:12]} is not a commit of {where} (its object is missing); fetch it first")
    try:
        bases = repo.merge_base(base, head)
    except GitCommandError as exc:
        hint = " (a shallow clone: `git fetch --unshallow` gives the history a merge base needs)" if shallow else ""
        raise WorkspaceError(f"no merge base of {base[:12]} and {head[:12]} in {where}: "
                             f"{(exc.stderr or str(exc)).strip()[:300]}{hint}") from None
    return bases[0].hexsha if bases else base


def checkout(request: AuditRequest) -> Checkout:
    repo = open_repo(request.repo)
    head = resolve(repo, request.head)
    base = resolve(repo, request.base) if request.base else default_base(repo, head)
    merge_base = merge_base_of(repo, base, head)
    return Checkout(repo=str(repo.working_dir or repo.git_dir), base_sha=base, head_sha=head, merge_base_sha=merge_base)


@dataclass(frozen=True)
class Tree:
    """One side of a change, for checks: list paths and read blobs, with a per-blob cache."""

    repo_path: str
    sha: str

    @property
    def repo(self) -> git.Repo:
        return _repo(self.repo_path)

    def paths(self) -> list[str]:
        return _paths(self.repo_path, self.sha)

    def blob_sha(self, path: str) -> str | None:
        return _blob_index(self.repo_path, self.sha).get(path)

    def read(self, path: str) -> bytes | None:
        sha = self.blob_sha(path)
        return read_blob(self.repo_path, sha) if sha else None


_REPOS_PER_THREAD = 8
_local = threading.local()


def _repo(path: str) -> git.Repo:
    """One open Repo per (thread, path).

    A Repo keeps long-lived ``git cat-file --batch`` pipes; two threads of the bot's worker pool writing
    requests into one pipe interleave their answers or block forever reading it, so no Repo is shared
    across threads. A few per thread stay open, the oldest closed first.
    """
    repos: dict[str, git.Repo] | None = getattr(_local, "repos", None)
    if repos is None:
        repos = _local.repos = {}
    repo = repos.get(path)
    if repo is None:
        if len(repos) >= _REPOS_PER_THREAD:
            repos.pop(next(iter(repos))).close()
        repo = repos[path] = git.Repo(path)
    return repo


def close_repos() -> None:
    """Close this thread's open Repos (their git processes); the next read opens them again."""
    repos: dict[str, git.Repo] = getattr(_local, "repos", None) or {}
    while repos:
        repos.pop(next(iter(repos))).close()


@lru_cache(maxsize=16)
def _blob_index(repo_path: str, sha: str) -> dict[str, str]:
    """path → blob sha for a whole tree, in one `git ls-tree -r` call."""
    out = _repo(repo_path).git.ls_tree("-r", "-z", "--full-tree", sha)
    index: dict[str, str] = {}
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob":
            index[path] = blob
    return index


@lru_cache(maxsize=16)
def _paths(repo_path: str, sha: str) -> list[str]:
    return sorted(_blob_index(repo_path, sha))


@lru_cache(maxsize=4096)
def read_blob(repo_path: str, blob_sha: str) -> bytes:
    return _repo(repo_path).odb.stream(bytes.fromhex(blob_sha)).read()
