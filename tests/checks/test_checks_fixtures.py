"""Every relation kind and every fixed bug as a fixture directory, like ruff's: config, base tree, head tree
and the expected findings with their states, run as a real two-commit git repo through the checks stage.

    tests/checks/fixtures/<name>/config.toml     the repo config (read as written, not from git)
    tests/checks/fixtures/<name>/base/...        the merge-base tree
    tests/checks/fixtures/<name>/head/...        the head tree
    tests/checks/fixtures/<name>/expected.toml   [[finding]] rule, status, message (a substring),
                                                 locations ("path:line", a subset), pillar, source;
                                                 failing = N; unchecked = ["substring", ...] (all of them);
                                                 or config_error = "substring": the config is refused
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from checks.audit import run_checks
from checks.config import ConfigError, parse_config
from checks.diff import build_changeset
from checks.model import AuditRequest
from checks.packs.sample import commit, init_repo
from checks.workspace import checkout

FIXTURES = Path(__file__).parent / "fixtures"


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def run_fixture(path: Path, tmp: Path):
    repo = init_repo(tmp / path.name)
    base = commit(repo, _tree(path / "base"), "base")
    head = commit(repo, _tree(path / "head"), "head")
    co = checkout(AuditRequest(repo=str(repo), base=base, head=head))
    config = parse_config((path / "config.toml").read_text(), "config.toml")
    return run_checks(co, config, build_changeset(co))


def _matches(want: dict, got) -> bool:
    if want["rule"] != got.rule or want["status"] != got.status or want.get("message", "") not in got.message:
        return False
    if any(want[k] != getattr(got, k) for k in ("pillar", "source", "severity") if k in want):
        return False
    where = {f"{loc.path}:{loc.line}" for loc in got.locations}
    return set(want.get("locations", [])) <= where


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.toml").exists()))
def test_fixture(name, tmp_path):
    path = FIXTURES / name
    expected = tomllib.loads((path / "expected.toml").read_text())
    if "config_error" in expected:
        with pytest.raises(ConfigError) as exc:
            parse_config((path / "config.toml").read_text(), "config.toml")
        assert re.match(r"^config\.toml:\d+: ", str(exc.value)) and expected["config_error"] in str(exc.value), str(exc.value)
        return
    found = run_fixture(path, tmp_path)
    got = list(found.findings)
    shown = [(f.rule, f.status, f.message, [f"{x.path}:{x.line}" for x in f.locations]) for f in got]
    wants = expected.get("finding", [])
    assert len(got) == len(wants), shown
    for want in wants:
        hit = next((f for f in got if _matches(want, f)), None)
        assert hit is not None, (want, shown)
        got.remove(hit)
    assert len(found.failing) == expected.get("failing", 0), shown
    reasons = [f"{u.entry}: {u.reason}" for u in found.unchecked]
    want_unchecked = expected.get("unchecked", [])
    assert len(reasons) == len(want_unchecked), reasons
    for needle in want_unchecked:
        assert any(needle in r for r in reasons), (needle, reasons)
    if "rules_run" in expected:
        assert sorted(found.rules_run) == sorted(expected["rules_run"])
