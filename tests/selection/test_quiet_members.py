"""A class changed only in some methods reaches only code that spells one of them, on real git repos with no config.

The changed members are closed over the members that call them (``self._sample()`` in ``generate``); a test
that spells none of them, and imports no module that does (a helper calling ``p.generate()``), does not run.
A change to ``__init__``, ``forward``, a base or a class-level statement other than an assignment keeps the
whole class changed.
"""

from __future__ import annotations

import pytest

from tests.selection.plans import selected_tests

BASE = {
    "pkg/__init__.py": "",
    "pkg/pipe.py": "class Pipeline:\n    def __init__(self):\n        self.n = 1\n\n    def generate(self):\n"
                   "        return self._sample() + 1\n\n    def _sample(self):\n        return self.n\n\n"
                   "    def tokenize(self, s):\n        return s.split()\n\n\ndef make():\n    return Pipeline()\n",
    "pkg/runner.py": "def run(p):\n    return p.generate()\n",
    "tests/test_gen.py": "from pkg.pipe import Pipeline\n\n\ndef test_g():\n    assert Pipeline().generate() == 2\n",
    "tests/test_tok.py": "from pkg.pipe import Pipeline\n\n\ndef test_t():\n    assert Pipeline().tokenize('a b')\n",
    "tests/test_run.py": "from pkg.pipe import make\nfrom pkg.runner import run\n\n\ndef test_r():\n"
                         "    assert run(make()) == 2\n",
}


@pytest.fixture
def repo(git_repo):
    git_repo.base = git_repo.commit_files(BASE, "base")
    return git_repo


def selected(repo, old, new):
    head = repo.commit_files({"pkg/pipe.py": BASE["pkg/pipe.py"].replace(old, new, 1)})
    return selected_tests(repo.path, repo.base, head)


def test_a_changed_helper_reaches_the_tests_spelling_the_methods_that_call_it(repo):
    # _sample changed → generate calls it; test_run reaches generate through pkg/runner.py
    assert selected(repo, "return self.n", "return self.n * 1") == ["tests/test_gen.py", "tests/test_run.py"]


def test_a_method_nobody_else_calls_reaches_only_its_speller(repo):
    assert selected(repo, "return s.split()", "return s.split(' ')") == ["tests/test_tok.py"]


def test_a_constructor_change_keeps_the_whole_class(repo):
    assert selected(repo, "self.n = 1", "self.n = 2") == ["tests/test_gen.py", "tests/test_run.py",
                                                            "tests/test_tok.py"]


def test_forward_is_called_by_the_framework_so_its_change_keeps_the_whole_class(git_repo):
    files = {**BASE, "pkg/pipe.py": BASE["pkg/pipe.py"].replace(
        "    def tokenize", "    def forward(self, x):\n        return x\n\n    def tokenize")}
    base = git_repo.commit_files(files, "base")  # nobody spells forward: nn.Module.__call__ calls it
    head = git_repo.commit_files({"pkg/pipe.py": files["pkg/pipe.py"].replace("return x\n", "return x * 1\n")})
    assert selected_tests(git_repo.path, base, head) == ["tests/test_gen.py", "tests/test_run.py",
                                                          "tests/test_tok.py"]


def test_a_module_calling_members_by_name_reaches_every_member(git_repo):
    files = {**BASE, "pkg/hooks.py": "def call(obj, name):\n    return getattr(obj, name)()\n",
             "tests/test_hook.py": "from pkg.hooks import call\nfrom pkg.pipe import Pipeline\n\n\ndef test_h():\n"
                                   "    assert call(Pipeline(), '_sam' + 'ple') == 1\n"}
    base = git_repo.commit_files(files, "base")  # test_hook spells no member; its helper calls one by name
    head = git_repo.commit_files({"pkg/pipe.py": BASE["pkg/pipe.py"].replace("return self.n", "return self.n * 1")})
    assert selected_tests(git_repo.path, base, head) == ["tests/test_gen.py", "tests/test_hook.py",
                                                          "tests/test_run.py"]
