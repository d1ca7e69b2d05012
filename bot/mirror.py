"""Bare mirrors of audited repos: fetch exactly the base and head commits with the installation token.

The token travels in an ``http.extraHeader`` given through ``GIT_CONFIG_*``
environment variables, so it never lands in the mirror's config, in a process
listing, or in an error message. Fetched commits get a ref under
``refs/drift-audit/`` so ``git gc`` keeps them. A file lock per mirror lets
several workers (and processes) share one mirror directory.
"""

from __future__ import annotations

import base64
import fcntl
import os
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


class MirrorError(RuntimeError):
    """A fetch that failed; the message never contains the token."""


class Mirrors:
    def __init__(self, root: str | os.PathLike, timeout: float = 600.0):
        self.root = Path(root)
        self.timeout = timeout

    def path_for(self, repo: str) -> Path:
        owner, _, name = repo.partition("/")
        if not (_SAFE.match(owner) and _SAFE.match(name)) or {owner, name} & {".", ".."}:
            raise MirrorError(f"refusing repository name {repo!r}")
        return self.root / owner / f"{name}.git"

    @contextmanager
    def _locked(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(path) + ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def fetch(self, repo: str, clone_url: str, shas: list[str], token: str | None = None) -> str:
        """Make sure ``shas`` exist in the repo's mirror; returns the mirror path."""
        path = self.path_for(repo)
        wanted = [s for s in dict.fromkeys(shas) if s]
        for sha in wanted:
            if not re.fullmatch(r"[0-9a-f]{40}", sha):
                raise MirrorError(f"not a commit SHA: {sha!r}")
        with self._locked(path):
            if not (path / "HEAD").exists():
                self._git(["init", "--bare", "--quiet", str(path)], None)
            missing = [s for s in wanted if not self._has(path, s)]
            if missing:
                url = _url(clone_url)
                try:
                    self._git(
                        ["-C", str(path), "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", url, *missing],
                        token,
                    )
                except MirrorError:
                    # servers that refuse SHA wants: take branches and PR heads, then look again
                    self._git(
                        [
                            "-C",
                            str(path),
                            "fetch",
                            "--quiet",
                            "--no-tags",
                            "--force",
                            url,
                            "+refs/heads/*:refs/remotes/origin/*",
                            "+refs/pull/*/head:refs/remotes/pull/*",
                        ],
                        token,
                    )
                still = [s for s in missing if not self._has(path, s)]
                if still:
                    raise MirrorError(f"{repo}: commits not found after fetch: {', '.join(s[:12] for s in still)}")
                for sha in missing:
                    self._git(["-C", str(path), "update-ref", f"refs/drift-audit/{sha}", sha], None)
        return str(path)

    def _has(self, path: Path, sha: str) -> bool:
        res = subprocess.run(
            ["git", "-C", str(path), "cat-file", "-e", f"{sha}^{{commit}}"], capture_output=True, timeout=60
        )
        return res.returncode == 0

    def _git(self, args: list[str], token: str | None) -> None:
        env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="true")
        if token:
            basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
            env.update(
                GIT_CONFIG_COUNT="1",
                GIT_CONFIG_KEY_0="http.extraHeader",
                GIT_CONFIG_VALUE_0=f"Authorization: Basic {basic}",
            )
        try:
            res = subprocess.run(["git", *args], env=env, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise MirrorError(
                f"git {args[2] if len(args) > 2 else args[0]} timed out after {self.timeout:.0f}s"
            ) from None
        if res.returncode != 0:
            err = res.stderr.strip()
            if token:
                basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
                err = err.replace(basic, "***").replace(token, "***")
            raise MirrorError(f"git {' '.join(a for a in args if '://' not in a)[:200]} failed: {err[-500:]}")


def _url(clone_url: str) -> str:
    """A local path becomes a file:// URL (tests and on-prem mirrors); anything else passes as is."""
    if "://" in clone_url or clone_url.startswith("git@"):
        return clone_url
    return Path(clone_url).resolve().as_uri()
