"""Fact rows cached on disk per (fact definition, blob): a fresh process parses nothing it has seen, a
changed blob is parsed again, and oversized or binary files never reach tree-sitter."""

from __future__ import annotations

import pytest

from checks import facts, syntax
from checks.config import Fact
from checks.factcache import FactCache
from checks.facts import Limits, extract
from checks.packs.sample import commit, init_repo
from checks.workspace import Tree

FACT = Fact("fns", "python", ["src/*.py"], query="(function_definition name: (identifier) @key parameters: (parameters) @n)",
            options={"len": ["n"]})


def _forget() -> None:
    """What a new process starts with: no rows, parses or results in memory."""
    facts._rows_cache.clear()
    facts._results.clear()
    syntax._cache.clear()


def _no_parse(*_a, **_k):
    raise AssertionError("parsed a blob the disk cache holds")


def test_a_new_process_reads_rows_from_disk_and_parses_only_changed_blobs(tmp_path, monkeypatch):
    repo = init_repo(tmp_path / "r")
    files = {f"src/m{i}.py": f"def f{i}(a, b):\n    return a\n" for i in range(5)}
    first = commit(repo, files, "base")
    limits = Limits(cache=FactCache(tmp_path / "cache"))
    rows = [(r.key, r.values, r.path, r.line) for r in extract(FACT, Tree(str(repo), first), None, limits).rows]
    assert len(rows) == 5

    _forget()
    monkeypatch.setattr(syntax, "parse", _no_parse)
    again = extract(FACT, Tree(str(repo), first), None, Limits(cache=FactCache(tmp_path / "cache")))
    assert [(r.key, r.values, r.path, r.line) for r in again.rows] == rows

    second = commit(repo, {**files, "src/m0.py": "def f0(a):\n    return a\n"}, "push")
    _forget()
    with pytest.raises(AssertionError, match="parsed a blob"):  # the one changed blob must be parsed...
        extract(FACT, Tree(str(repo), second), None, Limits(cache=FactCache(tmp_path / "cache")))
    monkeypatch.undo()
    _forget()
    parsed: list[bytes] = []
    real = syntax.parse
    monkeypatch.setattr(syntax, "parse", lambda lang, data, key=None: parsed.append(data) or real(lang, data, key))
    got = extract(FACT, Tree(str(repo), second), None, Limits(cache=FactCache(tmp_path / "cache")))
    assert parsed == [b"def f0(a):\n    return a\n"]  # ...and only that one
    assert {r.key: r.values["n"] for r in got.rows} == {"f0": 1, "f1": 2, "f2": 2, "f3": 2, "f4": 2}


def test_renamed_blob_from_disk_takes_its_new_path(tmp_path):
    repo = init_repo(tmp_path / "r")
    first = commit(repo, {"src/a.py": "def f(a):\n    pass\n"}, "base")
    cache = tmp_path / "cache"
    extract(FACT, Tree(str(repo), first), None, Limits(cache=FactCache(cache)))
    second = commit(repo, {"src/b.py": "def f(a):\n    pass\n"}, "rename")
    _forget()
    got = extract(FACT, Tree(str(repo), second), None, Limits(cache=FactCache(cache)))
    assert [(r.key, r.path) for r in got.rows] == [("f", "src/b.py")]


def test_size_cap_is_reported_and_binary_content_is_skipped(tmp_path):
    repo = init_repo(tmp_path / "r")
    sha = commit(repo, {"src/big.py": "def big(a):\n    pass\n" + "x = 1\n" * 200, "src/bin.py": "def b(\0):\n",
                        "src/ok.py": "def ok(a):\n    pass\n"}, "base")
    _forget()
    got = extract(FACT, Tree(str(repo), sha), None, Limits(max_bytes=500))
    assert [r.key for r in got.rows] == ["ok"]
    assert len(got.problems) == 1 and got.problems[0].startswith("src/big.py:1: skipped: 1,221 bytes is over the size cap")


def test_parallel_parse_gives_the_rows_a_serial_parse_gives(tmp_path, monkeypatch):
    repo = init_repo(tmp_path / "r")
    files = {f"src/m{i}.py": "".join(f"def f{i}_{j}(a{', b' * (j % 3)}):\n    pass\n" for j in range(20)) for i in range(12)}
    sha = commit(repo, files, "base")
    tree = Tree(str(repo), sha)
    other = Fact("names", "python", ["src/*.py"], query="(function_definition name: (identifier) @key)")
    _forget()
    serial = {f.id: [(r.key, r.values, r.path, r.line) for r in extract(f, tree).rows] for f in (FACT, other)}
    _forget()
    monkeypatch.setattr(facts, "PARALLEL_MIN_BYTES", 0)
    data = facts.prefetch([FACT, other], tree)
    assert facts.parse_parallel([FACT, other], tree, data, workers=2) == 12  # one unit per file, both facts in it
    sigs = [facts.compile_fact(f).signature for f in (FACT, other)]
    assert all((s, p, tree.blob_sha(p)) in facts._rows_cache for s in sigs for p in files)  # rows came from the pool
    parallel = {f.id: [(r.key, r.values, r.path, r.line) for r in extract(f, tree, data).rows] for f in (FACT, other)}
    assert parallel == serial and len(serial[FACT.id]) == 240


def test_a_new_process_takes_rule_findings_from_disk(tmp_path, monkeypatch):
    from dataclasses import replace

    from checks import audit
    from checks.audit import run_checks
    from checks.config import parse_config
    from checks.diff import build_changeset
    from checks.model import AuditRequest
    from checks.rules import REGISTRY
    from checks.workspace import checkout

    repo = init_repo(tmp_path / "r")
    broken = "block = (\n"
    base = commit(repo, {"src/flags.py": "use_fast = True\nblock = 64\n", "src/broken.py": broken}, "base")
    head = commit(repo, {"src/flags.py": "use_fast = False\nblock = 64\n", "src/broken.py": broken}, "head")
    config = parse_config(f'''[settings]\ncache_dir = "{tmp_path / "cache"}"\n
[[fact]]
id = "flags"
lang = "python"
files = ["src/*.py"]
query = "(module (expression_statement (assignment left: (identifier) @key right: (_) @value)))"

[[rule]]
id = "pinned-flags"
kind = "pinned"
facts = ["flags"]
values = {{ use_fast = "True" }}
''', "cfg.toml")
    co = checkout(AuditRequest(repo=str(repo), base=base, head=head))
    first = run_checks(co, config, build_changeset(co))
    _forget()
    audit._rule_cache.clear()

    def boom(rule, rows):
        raise AssertionError("evaluated a rule whose findings the disk cache holds")

    monkeypatch.setitem(REGISTRY, "pinned", replace(REGISTRY["pinned"], evaluate=boom))
    monkeypatch.setattr(syntax, "parse", _no_parse)  # nor are its facts' files parsed
    again = run_checks(co, config, build_changeset(co))
    assert again.unchecked == first.unchecked and again.rules_run == first.rules_run == ["pinned-flags"]
    assert [u.reason for u in first.unchecked] == ["src/broken.py:1: python syntax error; rows of fact 'flags' near it may be missing"]
    assert [(f.rule, f.status, f.message, f.state) for f in again.findings] == \
        [(f.rule, f.status, f.message, f.state) for f in first.findings] == \
        [("pinned-flags", "new", "'use_fast' is False, pinned to True", first.findings[0].state)]


def test_a_cache_over_its_size_bound_starts_over(tmp_path):
    from checks.facts import Row

    big = FactCache(tmp_path / "c")
    big.store("sig", "blob", "f", [Row("f", "k" * 5000, {}, "a.py", 1)], None)
    big.flush()
    assert FactCache(tmp_path / "c").load("sig", ["blob"])
    assert FactCache(tmp_path / "c", max_bytes=1000).load("sig", ["blob"]) == {}
