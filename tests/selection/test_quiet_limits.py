"""Inputs too big or too deep for the tables still give a plan, on real git repos with no config: a module with
more statements than MAX_STATEMENTS, or nested deeper than the parser goes, counts as used whole by its importers."""

from __future__ import annotations

import runner.impact
from tests.selection.plans import selected_tests

BASE = {
    "pkg/__init__.py": "",
    "pkg/data.py": "".join(f"A{i} = {i}\n" for i in range(10)),
    "pkg/deep.py": "def f():\n    return 1\n\n\ndef g():\n    return 2\n",
    "tests/test_data.py": "from pkg.data import A0\n\n\ndef test_a():\n    assert A0 == 0\n",
    "tests/test_deep.py": "from pkg.deep import g\n\n\ndef test_g():\n    assert g() == 2\n",
}


def selected(git_repo, files):
    base = git_repo.commit_files(BASE, "base")
    head = git_repo.commit_files(files)
    return selected_tests(git_repo.path, base, head)


def test_a_module_past_the_statement_limit_counts_as_used_whole(git_repo, monkeypatch):
    changed = {"pkg/data.py": BASE["pkg/data.py"].replace("A9 = 9", "A9 = 90")}
    assert selected(git_repo, changed) == []  # A9: nobody uses it
    monkeypatch.setattr(runner.impact, "MAX_STATEMENTS", 5)
    monkeypatch.setattr(runner.impact, "_INFO", {})  # tables built under the lower limit leave with the test
    assert selected(git_repo, {"pkg/data.py": changed["pkg/data.py"].replace("A8 = 8", "A8 = 80")}) == ["tests/test_data.py"]


def test_an_expression_too_deep_to_parse_selects_every_importer(git_repo):
    deep = BASE["pkg/deep.py"].replace("return 1", "return " + "+".join(["1"] * 30000))
    assert selected(git_repo, {"pkg/deep.py": deep}) == ["tests/test_deep.py"]
