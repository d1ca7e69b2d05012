"""Entry points a manifest declares name objects the package's modules define: a script whose function is gone,
or a new script naming a function that is not there, is caught; other settings of the form ``a:b`` are not."""

from __future__ import annotations

from checks.infer import infer
from checks.workspace import Tree
from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

SETUP_CFG = """[metadata]
name = tool

[options.entry_points]
console_scripts =
    tool = tool.__main__:run
    tool-eval = tool.__main__:run_eval
    tool-serve = tool.serve:main

[flake8]
per-file-ignores = tests/*:E501

[tool:pytest]
filterwarnings = ignore:deprecated
plugins = othertool.plugin:hook
"""

MAIN = """import sys

from tool.serve import main as serve_main


def run():
    return 0


def run_eval():
    return run()
"""

SERVE = """def main():
    return 0
"""


def test_a_script_whose_function_is_gone_is_caught(tmp_path):
    r = GitRepo(tmp_path / "tool")
    base = r.commit_files({"setup.cfg": SETUP_CFG, "tool/__init__.py": "", "tool/__main__.py": MAIN,
                           "tool/serve.py": SERVE}, "tool")
    head = r.commit_files({"tool/__main__.py": MAIN.replace("def run_eval():\n    return run()\n", "")},
                          "drop run_eval")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    assert new[0].message.startswith("`tool.__main__:run_eval` is one of the entry points of setup.cfg (setup.cfg:7), "
                                     "but tool/__main__.py defines no `run_eval` at module level."), new[0].message
    # renamed in both places, or kept by an alias: nothing to say
    renamed = r.commit_files({"tool/__main__.py": MAIN.replace("run_eval", "evaluate"),
                              "setup.cfg": SETUP_CFG.replace("run_eval", "evaluate")}, "rename")
    assert inferred(audit(r.path, base, renamed)) == []
    alias = r.commit_files({"tool/__main__.py": MAIN.replace("def run_eval():\n    return run()\n", "run_eval = run\n"),
                            "setup.cfg": SETUP_CFG}, "alias")
    assert inferred(audit(r.path, base, alias)) == []


def test_a_new_script_naming_no_function_and_other_settings(tmp_path):
    r = GitRepo(tmp_path / "tool")
    base = r.commit_files({"setup.cfg": SETUP_CFG, "tool/__init__.py": "", "tool/__main__.py": MAIN,
                           "tool/serve.py": SERVE}, "tool")
    added = SETUP_CFG.replace("    tool-serve", "    tool-bench = tool.bench:main\n    tool-serve")
    head = r.commit_files({"setup.cfg": added, "tool/bench.py": "def run_bench():\n    return 0\n"}, "bench")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1 and "tool/bench.py defines no `main`" in new[0].message, [f.message for f in new]
    # the base's other "a:b" settings (pytest's filterwarnings, a plugin of an installed package) are no entry
    # points: the manifest still holds a belief, and adding more such settings is no drift
    more = SETUP_CFG + "\n[coverage:run]\nplugins = covtool.plugin:setup\n"
    quiet = r.commit_files({"setup.cfg": more}, "settings")
    assert inferred(audit(r.path, base, quiet)) == []


PYPROJECT = """[project]
name = "tool"

[project.scripts]
tool = "tool.cli:main"

[project.entry-points."tool.plugins"]
fast = "tool.plugins:FastPlugin"
"""


def test_pyproject_scripts_under_src_and_a_manifest_that_does_not_hold(tmp_path):
    r = GitRepo(tmp_path / "tool")
    files = {"pyproject.toml": PYPROJECT, "src/tool/__init__.py": "", "src/tool/cli.py": "def main():\n    pass\n",
             "src/tool/plugins.py": "try:\n    from tool._fast import FastPlugin\nexcept ImportError:\n"
                                    "    class FastPlugin:\n        pass\n"}
    base = r.commit_files(files, "tool")
    head = r.commit_files({"src/tool/cli.py": "def cli():\n    pass\n"}, "rename main")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1 and "src/tool/cli.py defines no `main`" in new[0].message, [f.message for f in new]
    # a manifest with one entry point its tree does not define at base holds no belief
    r2 = GitRepo(tmp_path / "broken")
    base2 = r2.commit_files({**files, "src/tool/cli.py": "def cli():\n    pass\n"}, "tool")
    assert [x for x in infer(Tree(str(r2.path), base2)).rules if "entry-points" in x.id] == []
    assert [x for x in infer(Tree(str(r.path), base)).rules if "entry-points" in x.id]  # the sound one holds one
    head2 = r2.commit_files({"src/tool/plugins.py": "X = 1\n"}, "drop the plugin")
    assert inferred(audit(r2.path, base2, head2)) == []


def test_a_sub_projects_manifest_names_its_own_modules(tmp_path):
    """``server/pyproject.toml`` declares scripts into ``server/app_server/``: its module paths start there."""
    r = GitRepo(tmp_path / "engine")
    manifest = '[tool.poetry.scripts]\napp-server = "app_server.cli:app"\n'
    base = r.commit_files({"server/pyproject.toml": manifest, "server/app_server/__init__.py": "",
                           "server/app_server/cli.py": "import typer\n\napp = typer.Typer()\n",
                           "engine/__init__.py": ""}, "server")
    head = r.commit_files({"server/app_server/cli.py": "import typer\n\ncli = typer.Typer()\n"}, "rename")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1 and "server/app_server/cli.py defines no `app`" in new[0].message, [f.message for f in new]
    assert new[0].locations[0].path == "server/pyproject.toml"
    fixed = r.commit_files({"server/pyproject.toml": manifest.replace(":app", ":cli")}, "follow the rename")
    assert inferred(audit(r.path, base, fixed)) == []
