"""Dotted strings that name modules (Registry(locations=[...]), sys.modules keys, mock targets), on real git repos."""

from __future__ import annotations

from tests.selection.plans import selected_tests

BASE = {
    "eng/__init__.py": "from eng.pipe import Pipeline\n",
    "eng/pipe.py": "class Pipeline:\n    def run(self):\n        return 1\n",
    "eng/models/__init__.py": "",
    "eng/models/base.py": "REG = dict(locations=['eng.models.base'])\n\n\ndef get(name):\n    return REG.get(name)\n",
    "eng/kern/__init__.py": "",
    "eng/kern/attn.py": "def attn(x):\n    return x\n",
    "tests/test_base.py": "from eng.models.base import get\n\n\ndef test_g():\n    assert get('x') is None\n",
    "tests/test_attn.py": "import sys\nfrom eng.kern.attn import attn\n\n\ndef test_a():\n"
                          "    sys.modules.pop('eng.kern.attn_iface', None)\n    assert attn(1) == 1\n",
}


def selected(git_repo, files):
    base = git_repo.commit_files(BASE, "base")
    head = git_repo.commit_files(files)
    return selected_tests(git_repo.path, base, head)


def test_a_package_name_in_a_string_is_no_run_of_its_init(git_repo):
    # both tests name a module below eng/ in a string; eng/__init__.py changing Pipeline reaches neither
    assert selected(git_repo, {"eng/pipe.py": "class Pipeline:\n    def run(self):\n        return 2\n"}) == []
