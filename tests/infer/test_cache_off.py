"""``DRIFT_AUDIT_CACHE=off`` turns inference's caches off, as it does the fact cache's: no directory named
``off`` appears where the audit runs, and the inferred finding is the same as with a cache."""

from __future__ import annotations

from checks.audit import run_checks
from checks.config import default_config
from checks.diff import build_changeset
from checks.model import AuditRequest
from checks.workspace import checkout
from tests.gitrepo import GitRepo
from tests.infer import engine


def test_cache_off_writes_no_cache_and_still_infers(tmp_path, monkeypatch):
    r = GitRepo(tmp_path / "engine")
    base = r.commit_files(engine.files(), "Engine with five ops")
    head = r.commit_files(engine.files(engine.OPS + ["rope"], registry=engine.OPS), "Add rope")
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("DRIFT_AUDIT_CACHE", "off")
    co = checkout(AuditRequest(repo=str(r.path), base=base, head=head))
    found = run_checks(co, default_config(), build_changeset(co))
    assert [f.source for f in found.with_status("new")] == ["inferred"]
    assert list(work.iterdir()) == []  # before: ./off/infer/<repo key>/ held the inference cache
