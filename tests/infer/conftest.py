"""Inference tests: caches go to a directory of this test session, never the user's cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRIFT_AUDIT_CACHE", str(tmp_path / "cache"))
