"""The quick "not inert" proof for modules no test imports agrees with the full statement tables.

Each case edits ``pkg/solo.py`` (imported by no test) in a real git repo; the
plan's inert list must equal what the full ``ast`` tables of both sides say,
and the proof must fire where it saves the work and stay silent where only the
full tables can tell.
"""

from __future__ import annotations

import pytest

from checks.config import load_config
from checks.diff import build_changeset
from checks.model import AuditOptions, AuditRequest, Findings
from checks.pillars import map_pillars
from checks.workspace import Tree, checkout, open_repo
from runner.outline import Outline, touches_kept_definition
from runner.select import changed_names, inert_files, select_tests

SOLO = (
    '"""Solo."""\n\nimport os\n\nDOC = """\ndef kept(x):\n    return 0\n"""\n\nA = 1; B = 2\n\n\n'
    "def kept(x):\n    # note\n    return x + 1\n\n\n@register\ndef plug(x):\n    return x\n\n\n"
    "class Box:\n    size = 3\n"
)

CASES = {
    "body edit": SOLO.replace("return x + 1", "return x + 2"),
    "comment only": SOLO.replace("# note", "# other note"),
    "text inside a string at column 0": SOLO.replace("def kept(x):\n    return 0", "def kept(y):\n    return 0"),
    "semicolon line": SOLO.replace("A = 1; B = 2", "A = 1; B = 3"),
    "registering decorator": SOLO.replace("return x\n", "return x * 2\n"),
    "names only added": SOLO + "\n\ndef fresh(x):\n    return x\n",
    "module-level call added": SOLO + "\nprint(kept(1))\n",
    "environment write": SOLO + "\nos.environ['X'] = '1'\n",
    "broken head": SOLO.replace("return x + 1", "return (x + 1"),
    "crlf head": SOLO.replace("return x + 1", "return x + 2").replace("\n", "\r\n"),
}

BASE = {
    "pkg/__init__.py": "",
    "pkg/used.py": "def f():\n    return 1\n",
    "pkg/solo.py": SOLO,
    "tests/test_used.py": "from pkg.used import f\n\n\ndef test_f():\n    assert f() == 1\n",
}


def _audit(repo, files):
    head = repo.commit_files(files)
    co = checkout(AuditRequest(repo=str(repo.path), base=repo.base, head=head))
    return co, build_changeset(co), Tree(co.repo, co.head_sha)


@pytest.fixture
def repo(git_repo):
    git_repo.base = git_repo.commit_files(BASE, "base")
    return git_repo


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_inert_equals_the_full_tables(repo, case):
    co, changes, tree = _audit(repo, {"pkg/solo.py": CASES[case]})
    config = load_config(open_repo(co.repo), co.base_sha)
    got = select_tests(config, changes, map_pillars(co, config, changes), Findings(), AuditOptions(), tree, "aid")
    full = changed_names(changes, tree)  # no relevance filter: every module by its full tables
    want = inert_files(changes, tree, set(tree.paths()), full)
    assert got.inert == [f"{path}: {why}" for path, why in want.items()]
    assert not any(s.id.endswith("test_used.py") for s in got.suites)


PROOF = {  # case → whether the proof decides alone (False: the full tables must)
    "body edit": True,
    "text inside a string at column 0": True,  # the string's assignment (DOC) is on both sides
    "semicolon line": True,
    "registering decorator": True,
    "module-level call added": True,
    "comment only": False,
    "names only added": False,
    "environment write": True,  # binds "os" on both sides (and the full tables say "all")
    "broken head": False,
    "crlf head": False,
}


@pytest.mark.parametrize("case", sorted(PROOF))
def test_proof_fires_only_where_it_can_tell(repo, case):
    _co, changes, tree = _audit(repo, {"pkg/solo.py": CASES[case]})
    (fc,) = [f for f in changes.files if f.path == "pkg/solo.py"]
    added = [n for h in fc.hunks for n in h.added]
    removed = [n for h in fc.hunks for n in h.removed]
    head = Outline(CASES[case].encode(), None)
    base = Outline(SOLO.encode(), None)
    assert touches_kept_definition(head, base, added, removed) is PROOF[case]


def test_full_tables_agree_that_proved_cases_are_not_inert(repo):
    for case, proved in PROOF.items():
        if not proved:
            continue
        _co, changes, tree = _audit(repo, {"pkg/solo.py": CASES[case]})
        full = changed_names(changes, tree)
        assert "pkg/solo.py" not in inert_files(changes, tree, set(tree.paths()), full), case


def test_outline_names_the_statement_around_a_line():
    outline = Outline(SOLO.encode(), None)
    lines = SOLO.splitlines()
    assert lines[5] == "def kept(x):" and outline.stmt_at(6) == (frozenset({"DOC"}), False)  # inside DOC's string
    assert outline.stmt_at(lines.index("    return x + 1") + 1) == (frozenset({"kept"}), False)
    assert outline.stmt_at(lines.index("    # note") + 1) is None  # comment lines name nothing
    assert outline.binds("Box") and outline.binds("kept") and not outline.binds("size")


USERS = {  # a file outside the tests that uses the name pkg/solo.py adds, each way the full tables see
    "from-import": "from pkg.solo import fresh\n",
    "module attribute": "from pkg import solo\n\n\ndef g():\n    return solo.fresh\n",
    "dotted import": "import pkg.solo\n\n\ndef g():\n    return pkg.solo.fresh(1)\n",
    "through the package": "import pkg\n\n\ndef g():\n    return pkg.solo.fresh\n",
    "star import": "from pkg.solo import *\n",
    "relative": "from .solo import fresh\n",
    "getattr on the module": "from pkg import solo\n\nNAME = 'fre' + 'sh'\nX = getattr(solo, NAME)\n",
    "import_module": "import importlib\n\nM = importlib.import_module('pkg.solo')\nF = M.fresh\n",
    "unparsable": "def broken(:\n",
    "unrelated": "import os\n\n\ndef g():\n    return os.sep\n",
}


@pytest.mark.parametrize("how", sorted(USERS))
def test_inert_scan_skips_only_files_that_cannot_reach_the_module(repo, how, monkeypatch):
    import runner.select as select

    repo.base = repo.commit_files({"pkg/user.py": USERS[how]}, "a user of pkg/solo.py")
    _co, changes, tree = _audit(repo, {"pkg/solo.py": CASES["names only added"]})  # adds fresh()
    full = changed_names(changes, tree)
    got = inert_files(changes, tree, set(tree.paths()), full)
    monkeypatch.setattr(select, "static_bindings", lambda _path, _data: None)  # every file by its full table
    want = inert_files(changes, tree, set(tree.paths()), full)
    assert got == want
    assert ("pkg/solo.py" in got) is (how == "unrelated")
