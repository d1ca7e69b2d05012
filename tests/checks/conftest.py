"""A real git repo in the persistent-kernel shape: base, a clean change, and one commit per seeded drift."""

from __future__ import annotations

import pytest

from checks.packs import sample as shape


@pytest.fixture(autouse=True, scope="session")
def _fact_cache(tmp_path_factory):
    """Fact rows cached on disk go to a directory of this test session, never the user's cache."""
    import os

    old = os.environ.get("DRIFT_AUDIT_CACHE")
    os.environ["DRIFT_AUDIT_CACHE"] = str(tmp_path_factory.mktemp("fact-cache"))
    yield
    if old is None:
        os.environ.pop("DRIFT_AUDIT_CACHE", None)
    else:
        os.environ["DRIFT_AUDIT_CACHE"] = old


@pytest.fixture(scope="session")
def shape_repo(tmp_path_factory):
    repo = shape.init_repo(tmp_path_factory.mktemp("shape") / "engine")
    base_files = shape.base_files()
    shas = {"base": shape.commit(repo, base_files, "Engine with five tasks")}
    shas["clean"] = shape.commit(repo, shape.clean_change(base_files), "Add the topk_softmax task")
    for kind, (_, apply) in shape.DRIFTS.items():
        shape.git(repo, "checkout", "-q", "--detach", shas["base"])
        shas[kind] = shape.commit(repo, apply(base_files), f"Seed {kind}")
    shape.git(repo, "checkout", "-q", "--detach", shas["base"])
    shas["all-drifts"] = shape.commit(repo, shape.all_drifts(base_files), "Every drift at once")
    shape.git(repo, "checkout", "-q", "main")
    return repo, shas
