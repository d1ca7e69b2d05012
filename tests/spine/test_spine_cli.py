"""`drift-audit review` as a user runs it: formats, output file, exit codes, clear errors."""

import json
import subprocess
import sys

from checks.model import Audit, from_json


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "bot.cli", *args], capture_output=True, text=True, cwd=cwd)


def make_range(repo):
    repo.write("engine/model.py", "def forward(x):\n    return x\n")
    repo.commit("base")
    repo.write("engine/model.py", "def forward(x):\n    return x + 1\n")
    repo.commit("head")


def test_defaults_review_head_against_its_parent(repo):
    make_range(repo)
    res = cli("review", str(repo.root))
    assert res.returncode == 0, res.stderr
    assert "<!-- drift-audit:comment -->" in res.stdout and "`engine/model.py`" in res.stdout
    assert res.stderr == ""  # quiet when not on a terminal


def test_json_output_file_loads_back(repo, tmp_path):
    make_range(repo)
    out = tmp_path / "audit.json"
    res = cli("review", str(repo.root), "--base", "HEAD~1", "--format", "json", "--output", str(out))
    assert res.returncode == 0, res.stderr
    audit = from_json(Audit, out.read_text())
    assert audit.changes.files[0].path == "engine/model.py"
    assert json.loads(out.read_text())["report"]["verdict"] == "pass"


def test_not_a_repo(tmp_path):
    res = cli("review", str(tmp_path))
    assert res.returncode == 2 and "not a git repository" in res.stderr


def test_unknown_revision(repo):
    make_range(repo)
    res = cli("review", str(repo.root), "--base", "no-such-rev")
    assert res.returncode == 2 and "unknown revision 'no-such-rev'" in res.stderr


def test_bad_config_names_file_and_line(repo):
    repo.write(".github/drift-audit.toml", '[[pillar]]\nid = "a"\npaths = "x"\ntitel = "typo"\n')
    make_range(repo)
    res = cli("review", str(repo.root), "--base", "HEAD~1")
    assert res.returncode == 2
    assert ".github/drift-audit.toml@" in res.stderr and ":4: [[pillar]] #1, key 'titel'" in res.stderr


def test_root_commit_without_base_says_what_to_do(repo):
    repo.write("a.py", "x = 1\n")
    repo.commit("root")
    res = cli("review", str(repo.root))
    assert res.returncode == 2 and "--base" in res.stderr
