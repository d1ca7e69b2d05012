"""A clone without some blobs (a partial clone, a mirror without its LFS files) still yields a ChangeSet:
the files whose blobs are absent are listed and mapped by path only; the rest diff as usual. Paths git
C-quotes keep their hunks, and the checked-out head's own .gitattributes cannot make the diff binary."""

from __future__ import annotations

import os

from checks.diff import build_changeset
from checks.model import AuditRequest
from checks.workspace import checkout
from tests.gitrepo import GitRepo


def test_a_missing_blob_is_listed_by_path_and_the_rest_diffs(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    base = repo.commit_files({"pkg/a.py": "x = 1\n"}, "base")
    head = repo.commit_files({"assets/paper.pdf": "%PDF-1.4 not really\n", "pkg/a.py": "x = 2\n"})
    sha = repo.git("rev-parse", f"{head}:assets/paper.pdf").strip()
    os.remove(repo.path / ".git" / "objects" / sha[:2] / sha[2:])  # as a mirror without that file has it
    changes = build_changeset(checkout(AuditRequest(repo=str(repo.path), base=base, head=head)))
    got = {f.path: (f.status, f.binary, [h.added for h in f.hunks]) for f in changes.files}
    assert got == {"assets/paper.pdf": ("added", True, []), "pkg/a.py": ("modified", False, [[1]])}


def _changes(repo, base, head):
    return {f.path: (f.binary, [h.added for h in f.hunks])
            for f in build_changeset(checkout(AuditRequest(repo=str(repo.path), base=base, head=head))).files}


def test_paths_git_quotes_keep_their_hunks(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    names = ["pkg/tab\there.py", 'pkg/quo"te.py', "pkg/caf\u00e9.py"]
    base = repo.commit_files(dict.fromkeys(names, "x = 1\n"), "base")
    head = repo.commit_files(dict.fromkeys(names, "x = 2\n"))
    assert _changes(repo, base, head) == dict.fromkeys(names, (False, [[1]]))


def test_a_heads_gitattributes_cannot_make_the_diff_binary(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    base = repo.commit_files({"pkg/a.py": "x = 1\n"}, "base")
    head = repo.commit_files({".gitattributes": "* -diff\n", "pkg/a.py": "x = 2\n"})  # checked out by commit_files
    assert _changes(repo, base, head)["pkg/a.py"] == (False, [[1]])
