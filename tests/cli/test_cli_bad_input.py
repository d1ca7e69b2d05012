"""The CLI says no clearly: bad input exits 2 with one line naming the known values or the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bot.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_usage_error(code: int, err: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("drift-audit: ") and err.count("\n") == 1


def test_unknown_pillar_lists_the_known_ones(capsys, two_commits):
    repo, base, _ = two_commits
    code, out, err = run(capsys, "review", str(repo.root), "--base", base, "--pillars", "foo,topology")
    assert_clean_usage_error(code, err)
    assert "unknown pillar 'foo'" in err and "known pillars: " in err and "topology" in err and "wiring" in err
    assert out == ""  # never "No files changed"


def test_unknown_runner_label_lists_the_known_ones(capsys, two_commits):
    repo, base, _ = two_commits
    code, _, err = run(capsys, "review", str(repo.root), "--base", base, "--runner", "sm999")
    assert_clean_usage_error(code, err)
    assert "unknown runner label 'sm999'; known labels: cpu, sm100, sm120, sm90" in err


def test_unknown_suite_lists_the_known_ones(capsys, repo):
    repo.write(".github/drift-audit.toml", '[[suite]]\nid = "unit"\nkind = "unit"\ncommand = "true"\n'
               'runners = ["cpu"]\npaths = ["**"]\n')
    repo.write("a.py", "x = 1\n")
    base = repo.commit("base")
    repo.write("a.py", "x = 2\n")
    repo.commit("head")
    code, _, err = run(capsys, "review", str(repo.root), "--base", base, "--run", "--suite", "nosuch")
    assert_clean_usage_error(code, err)
    assert "unknown suite 'nosuch'; known suites: unit" in err


def test_output_into_a_missing_directory_is_refused_before_the_audit(capsys, two_commits, tmp_path):
    repo, base, _ = two_commits
    target = tmp_path / "missing" / "dir" / "x.md"
    code, out, err = run(capsys, "review", str(repo.root), "--base", base, "-o", str(target))
    assert_clean_usage_error(code, err)
    assert f"directory {target.parent} does not exist" in err and not target.parent.exists()
    code, _, err = run(capsys, "review", str(repo.root), "--base", base, "-o", str(tmp_path))
    assert_clean_usage_error(code, err)
    assert "is a directory" in err


def test_empty_bare_repository_names_its_path(capsys, tmp_path):
    bare = tmp_path / "empty.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    code, _, err = run(capsys, "review", str(bare))
    assert_clean_usage_error(code, err)
    assert f"{bare}: a bare repository with no commits yet" in err


def test_bare_clone_with_history_is_reviewed(capsys, two_commits, tmp_path):
    repo, base, head = two_commits
    bare = tmp_path / "clone.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo.root), str(bare)], check=True)
    code, out, err = run(capsys, "review", str(bare), "--base", base)
    assert code == 0, err
    assert head[:12] in out and "`engine/model.py`" in out


def test_reversed_range_says_swap(capsys, two_commits):
    repo, base, head = two_commits
    code, out, err = run(capsys, "review", str(repo.root), "--base", head, "--head", base)
    assert_clean_usage_error(code, err)
    assert f"reversed range: base {head[:12]} is a descendant of head {base[:12]}" in err
    assert f"--base {base} --head {head}" in err and out == ""


def test_facts_into_a_closed_pipe_has_no_traceback(two_commits):
    repo, _, _ = two_commits
    for i in range(300):
        repo.write(f"pkg/m{i}.py", "\n".join(f"v{j} = {j}" for j in range(40)) + "\n")
    repo.commit("many rows")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "facts", str(repo.root), "--query", "(identifier) @key", "--lang", "python",
         "--files", "**/*.py"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()  # what `| head -1` reads, then it goes away
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert first.startswith(b"# adhoc:")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code == 141


@pytest.mark.parametrize("fmt", ["xml", "text"])
def test_unknown_format_is_an_argparse_error(capsys, fmt):
    with pytest.raises(SystemExit) as exc:
        main(["review", "--format", fmt])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_shallow_clone_says_how_to_fetch_the_history_it_lacks(capsys, two_commits, tmp_path):
    repo, base, head = two_commits
    repo.write("engine/model.py", "def forward(x):\n    return x + 2\n")
    repo.commit("third")
    clone = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo.root}", str(clone)], check=True)
    code, out, err = run(capsys, "review", str(clone))  # default base HEAD~1: named by HEAD, not held here
    assert_clean_usage_error(code, err)
    assert "outside this shallow clone" in err and "git fetch --unshallow" in err and "fetch-depth: 0" in err, err
    assert out == ""
    subprocess.run(["git", "-C", str(clone), "fetch", "-q", "--deepen=1"], check=True)
    code, out, err = run(capsys, "review", str(clone), "--format", "json")  # enough history now: a real review
    assert code == 0, err
    assert "engine/model.py" in out
