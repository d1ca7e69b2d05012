"""Bare mirrors: fetch exactly the audited commits; the token never lands on disk or in an error."""

from __future__ import annotations

import base64

import pytest

from bot.mirror import MirrorError, Mirrors
from tests.gitrepo import commit, git


def test_fetches_base_and_head_by_sha_and_keeps_them(tmp_path, engine_repo):
    repo_path, base, head = engine_repo
    mirrors = Mirrors(tmp_path / "m")
    path = mirrors.fetch("octo/eng", str(repo_path), [base, head])
    assert git(tmp_path, "-C", path, "cat-file", "-t", head) == "commit"
    assert head in git(tmp_path, "-C", path, "for-each-ref", "refs/drift-audit/")
    newer = commit(repo_path, {"README.md": "more\n"}, "more")
    assert mirrors.fetch("octo/eng", repo_path.as_uri(), [head, newer]) == path  # file:// works too
    with pytest.raises(MirrorError, match="commits not found"):
        mirrors.fetch("octo/eng", str(repo_path), ["0" * 40])
    with pytest.raises(MirrorError, match="refusing"):
        mirrors.path_for("../etc")


def test_token_stays_out_of_errors_and_config(tmp_path):
    token = "ghs_" + "s3cr3t" * 20
    mirrors = Mirrors(tmp_path / "m", timeout=20)
    with pytest.raises(MirrorError) as err:
        mirrors.fetch("octo/eng", "http://127.0.0.1:9/octo/eng.git", ["1" * 40], token=token)
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    assert token not in str(err.value) and basic not in str(err.value)
    config = (mirrors.path_for("octo/eng") / "config").read_text()
    assert token not in config and basic not in config
