"""Name-level selection on real git repos: a change reaches the tests that use what changed, not every importer."""

from __future__ import annotations

import pytest

from checks.config import load_config
from checks.diff import build_changeset
from checks.model import AuditOptions, AuditRequest, Findings
from checks.pillars import map_pillars
from checks.workspace import Tree, checkout, open_repo
from runner.select import select_tests

CONFIG = '''
[[pillar]]
id = "kernels"
title = "Kernels"
paths = ["pkg/**"]

[[suite]]
id = "parity"
kind = "parity"
command = "python -m pkg.parity"
runners = ["sm90"]
paths = ["pkg/norm.py"]
'''

BASE = {
    ".github/drift-audit.toml": CONFIG,
    "pkg/__init__.py": "",
    "pkg/norm.py": (
        '"""Norms."""\n\nimport math\n\nEPS = 1e-6\n\n\ndef rms(x):\n    return x / math.sqrt(EPS + 1)\n\n\n'
        "def unused_helper(x):\n    return x * 2\n\n\ndef scale(x):\n    # a comment\n    return x * 3\n"
    ),
    "pkg/ops.py": "from pkg.norm import rms\n\nOPS = {'rms': rms}\n\n\ndef other():\n    return 1\n",
    "pkg/registry.py": "REG = {}\n\n\ndef register(fn):\n    REG[fn.__name__] = fn\n    return fn\n",
    "pkg/plugins.py": "from pkg.registry import register\n\n\n@register\ndef plug(x):\n    return x + 1\n",
    "tests/test_rms.py": "from pkg.norm import rms\n\n\ndef test_rms():\n    assert rms(1.0)\n",
    "tests/test_scale.py": "import pkg.norm\n\n\ndef test_scale():\n    assert pkg.norm.scale(1) == 3\n",
    "tests/test_ops.py": "from pkg.ops import OPS\n\n\ndef test_ops():\n    assert 'rms' in OPS\n",
    "tests/test_other.py": "from pkg.ops import other\n\n\ndef test_other():\n    assert other() == 1\n",
    "tests/test_registry.py": "import pkg.plugins\nfrom pkg.registry import REG\n\n\ndef test_reg():\n    assert REG\n",
    "tests/fix/conftest.py": "import pytest\nfrom pkg.ops import other\n\n\n@pytest.fixture(autouse=True)\ndef o():\n"
                             "    return other()\n",
    "tests/fix/test_fix.py": "def test_f():\n    pass\n",
}


@pytest.fixture
def repo(git_repo):
    git_repo.base = git_repo.commit_files(BASE, "base")
    return git_repo


def plan(repo, files):
    head = repo.commit_files(files)
    co = checkout(AuditRequest(repo=str(repo.path), base=repo.base, head=head))
    config = load_config(open_repo(co.repo), co.base_sha)
    changes = build_changeset(co)
    return select_tests(config, changes, map_pillars(co, config, changes), Findings(), AuditOptions(),
                        Tree(co.repo, co.head_sha), "aid")


def ids(p):
    return sorted({s.id.removeprefix("pytest:") for s in p.suites})


def norm(old, new):
    return {"pkg/norm.py": BASE["pkg/norm.py"].replace(old, new)}


def test_function_change_selects_its_users_only(repo):
    got = plan(repo, norm("return x / math.sqrt(EPS + 1)", "return x / math.sqrt(EPS + 2)"))
    # rms → OPS (module-level dict) → test_ops; not test_scale (imports the module, never touches rms)
    assert ids(got) == ["parity", "tests/test_ops.py", "tests/test_rms.py"]
    reasons = {s.id: s.reasons for s in got.suites}
    assert reasons["pytest:tests/test_ops.py"] == ["imports: tests/test_ops.py → pkg/ops.py → pkg/norm.py"]


def test_module_attribute_use_counts(repo):
    assert ids(plan(repo, norm("return x * 3", "return x * 4"))) == ["parity", "tests/test_scale.py"]


def test_constant_change_reaches_the_functions_that_read_it(repo):
    assert ids(plan(repo, norm("EPS = 1e-6", "EPS = 1e-5"))) == ["parity", "tests/test_ops.py", "tests/test_rms.py"]


def test_comment_only_change_selects_nothing(repo):
    assert ids(plan(repo, norm("# a comment", "# another comment"))) == []


def test_removing_an_unused_helper_selects_nothing_not_even_by_path(repo):
    text = BASE["pkg/norm.py"].replace("def unused_helper(x):\n    return x * 2\n\n\n", "")
    got = plan(repo, {"pkg/norm.py": text})
    assert ids(got) == []
    assert got.inert == ["pkg/norm.py: only adds or removes unused_helper, which nothing uses"]


def test_removing_a_used_name_selects_its_users(repo):
    text = BASE["pkg/norm.py"].replace("def rms(x):\n    return x / math.sqrt(EPS + 1)\n\n\n", "")
    assert ids(plan(repo, {"pkg/norm.py": text})) == ["parity", "tests/test_ops.py", "tests/test_rms.py"]


def test_deleted_module_with_no_importers_selects_nothing(repo):
    assert ids(plan(repo, {"pkg/registry_unused.py": "X = 1\n"})) == []
    repo.base = repo.commit_files({}, "noop")
    assert ids(plan(repo, {"pkg/registry_unused.py": None})) == []


def test_registering_decorator_makes_the_whole_module_changed(repo):
    got = plan(repo, {"pkg/plugins.py": BASE["pkg/plugins.py"].replace("x + 1", "x + 2")})
    assert ids(got) == ["tests/test_registry.py"]  # it reads REG, never names plug


def test_conftest_users_are_reached(repo):
    got = plan(repo, {"pkg/ops.py": BASE["pkg/ops.py"].replace("return 1", "return 2")})
    assert ids(got) == ["tests/fix/test_fix.py", "tests/test_other.py"]


def test_a_module_run_in_a_subprocess_is_used_whole(repo):
    files = {
        "pkg/cli.py": "def main():\n    return 0\n\n\ndef other():\n    return 1\n",
        "tests/test_cli.py": "import subprocess\nimport sys\n\n\ndef test_cli():\n"
                             "    subprocess.run([sys.executable, '-m', 'pkg.cli'], check=True)\n",
        "tests/test_code.py": "import subprocess\nimport sys\n\nCODE = 'from pkg.cli import main; main()'\n\n\n"
                              "def test_code():\n    subprocess.run([sys.executable, '-c', CODE], check=True)\n",
        "tests/test_words.py": "def test_words():\n    assert 'pkg.nothing' != 'x.y'\n",
    }
    repo.base = repo.commit_files(files, "cli")
    got = plan(repo, {"pkg/cli.py": files["pkg/cli.py"].replace("return 1", "return 2")})
    assert ids(got) == ["tests/test_cli.py", "tests/test_code.py"]


def test_a_module_passed_around_as_a_value_is_followed(repo):
    files = {
        "pkg/kinds/__init__.py": "from pkg.kinds import a, b\n\nREGISTRY = {m.KIND: m for m in (a, b)}\n",
        "pkg/kinds/a.py": "def check():\n    return 1\n\n\nKIND = ('a', check)\n",
        "pkg/kinds/b.py": "KIND = ('b', None)\n",
        "tests/test_kinds.py": "from pkg.kinds import REGISTRY\n\n\ndef test_k():\n    assert REGISTRY\n",
    }
    repo.base = repo.commit_files(files, "kinds")
    got = plan(repo, {"pkg/kinds/a.py": files["pkg/kinds/a.py"].replace("return 1", "return 2")})
    assert ids(got) == ["tests/test_kinds.py"]


def test_a_submodule_reached_as_a_package_attribute(repo):
    files = {
        "lib/__init__.py": "from lib import ops\n",
        "lib/ops.py": "def f():\n    return 1\n\n\ndef g():\n    return 2\n",
        "tests/test_attr.py": "import lib\n\n\ndef test_f():\n    assert lib.ops.f() == 1\n",
        "tests/test_other_attr.py": "import lib\n\n\ndef test_g():\n    assert lib.ops.g() == 2\n",
    }
    repo.base = repo.commit_files(files, "lib")
    got = plan(repo, {"lib/ops.py": files["lib/ops.py"].replace("return 1", "return 3")})
    assert ids(got) == ["tests/test_attr.py"]
    # removing f is not inert: lib.ops.f is read through the package
    repo.base = repo.commit_files({}, "noop")
    got = plan(repo, {"lib/ops.py": "def g():\n    return 2\n"})
    assert ids(got) == ["tests/test_attr.py"]


def test_a_module_docstring_edit_selects_only_where_doc_is_read(repo):
    files = {
        "tool/__init__.py": "",
        "tool/quiet.py": '"""Quiet."""\n\n\ndef run():\n    return 1\n',
        "tool/loud.py": '"""Loud."""\n\nimport argparse\n\n\ndef main():\n'
                        '    return argparse.ArgumentParser(description=__doc__)\n',
        "tests/test_tool.py": "from tool.loud import main\nfrom tool.quiet import run\n\n\ndef test_t():\n"
                              "    assert main() and run()\n",
    }
    repo.base = repo.commit_files(files, "tool")
    assert ids(plan(repo, {"tool/quiet.py": files["tool/quiet.py"].replace("Quiet.", "Very quiet.")})) == []
    repo.base = repo.commit_files({}, "noop")
    assert ids(plan(repo, {"tool/loud.py": files["tool/loud.py"].replace("Loud.", "Very loud.")})) == [
        "tests/test_tool.py"]


REEXPORT = {
    "lib/__init__.py": '__version__ = "1"\n\nfrom lib.iface import (\n    run_a,\n    run_b,\n)\n\n'
                       '__all__ = ["run_a", "run_b"]\n',
    "lib/iface.py": "def run_a(x):\n    return x\n\n\ndef run_b(x):\n    return -x\n",
    "tests/test_a.py": "from lib import run_a\n\n\ndef test_a():\n    assert run_a(1) == 1\n",
    "tests/test_b.py": "from lib import run_b\n\n\ndef test_b():\n    assert run_b(1) == -1\n",
    "tests/test_mod.py": "import lib\n\n\ndef test_m():\n    assert lib.run_b(2) == -2\n",
}


def test_a_package_re_export_passes_on_each_name_alone(tmp_path):
    """``pkg/__init__.py`` re-exports several names in one import; a change to one selects its users only."""
    from tests.gitrepo import GitRepo

    repo = GitRepo(tmp_path / "re")
    repo.base = repo.commit_files(REEXPORT, "base")
    got = plan(repo, {"lib/iface.py": REEXPORT["lib/iface.py"].replace("return x\n", "return x + 0\n")})
    assert ids(got) == ["tests/test_a.py"]
    assert {s.id: s.reasons for s in got.suites}["pytest:tests/test_a.py"] == [
        "imports: tests/test_a.py → lib/__init__.py → lib/iface.py"]
    repo.base = repo.git("rev-parse", "HEAD")
    got = plan(repo, {"lib/iface.py": REEXPORT["lib/iface.py"].replace("return x\n", "return x + 0\n")
                      .replace("return -x\n", "return 0 - x\n")})
    assert ids(got) == ["tests/test_b.py", "tests/test_mod.py"]
