"""Co-change history on a real git repo: a file that always changed with another is reported when a PR
changes one alone, as a warning with the past commits as evidence, and the mined history is kept per repo."""

from __future__ import annotations

from checks import cochange
from checks.audit import run_checks
from checks.config import default_config, parse_config
from checks.diff import build_changeset
from checks.model import AuditRequest
from checks.workspace import checkout
from tests.gitrepo import GitRepo


def coupled_repo(path, n=10):
    r = GitRepo(path)
    r.commit_files({"kernels/attn.cu": "// v0\n", "kernels/attn.py": "V = 0\n", "README.md": "x\n"}, "Initial")
    shas = []
    for i in range(1, n + 1):
        shas.append(r.commit_files({"kernels/attn.cu": f"// v{i}\n", "kernels/attn.py": f"V = {i}\n"}, f"attn: tile {i}"))
    return r, shas


def audit(r, base, head, config=None):
    co = checkout(AuditRequest(repo=str(r.path), base=base, head=head))
    return run_checks(co, config or default_config(), build_changeset(co))


def test_changing_one_side_of_a_strong_pair_gives_a_warning_with_past_commits(tmp_path):
    r, shas = coupled_repo(tmp_path / "repo")
    head = r.commit_files({"kernels/attn.cu": "// v9\n"}, "attn: new tile, wrapper forgotten")
    found = audit(r, shas[-1], head)
    notes = [f for f in found.findings if f.rule == "co-change"]
    assert len(notes) == 1, [f.message for f in found.findings]
    n = notes[0]
    assert n.source == "cochange" and n.severity == "warning" and n.status == "new"
    assert "likely missed: kernels/attn.py" in n.message and "11 of the last 11 commits" in n.message
    assert len(n.evidence) == 5 and n.evidence[0].endswith("attn: tile 10") and n.evidence[0][:12] == shas[-1][:12]
    assert not found.failing  # a warning never fails the check by default


def test_changing_both_sides_gives_no_note(tmp_path):
    r, shas = coupled_repo(tmp_path / "repo")
    head = r.commit_files({"kernels/attn.cu": "// v9\n", "kernels/attn.py": "V = 9\n"}, "attn: both")
    assert [f for f in audit(r, shas[-1], head).findings if f.rule == "co-change"] == []


def test_too_little_history_gives_no_note(tmp_path):
    r, shas = coupled_repo(tmp_path / "repo", n=8)  # 9 commits changed both: one short of the default support
    head = r.commit_files({"kernels/attn.cu": "// v9\n"}, "attn only")
    assert [f for f in audit(r, shas[-1], head).findings if f.rule == "co-change"] == []


def test_config_can_make_a_missed_co_change_fail(tmp_path):
    r, shas = coupled_repo(tmp_path / "repo")
    head = r.commit_files({"kernels/attn.cu": "// v9\n"}, "attn only")
    config = parse_config('[settings]\ncochange = true\ncochange_severity = "error"\n')
    found = audit(r, shas[-1], head, config)
    assert [f.rule for f in found.failing] == ["co-change"]


def test_history_is_cached_per_repo_and_extended_incrementally(tmp_path):
    r, shas = coupled_repo(tmp_path / "repo")
    cache = tmp_path / "cache"
    first = cochange.history(str(r.path), shas[2], cache_dir=cache)
    assert [c.sha for c in first.commits][:3] == [shas[2], shas[1], shas[0]]
    assert (cache / f"cochange-v{cochange.CACHE_VERSION}.json").is_file()
    later = cochange.history(str(r.path), shas[-1], cache_dir=cache)
    assert [c.sha for c in later.commits][:2] == [shas[-1], shas[-2]]
    assert len(later.commits) == len(first.commits) + len(shas) - 3  # the commits after shas[2], added on top
    assert later.commits[0].files == ["kernels/attn.cu", "kernels/attn.py"]


def test_a_rewritten_history_is_mined_again_not_extended(tmp_path):
    r, shas = coupled_repo(tmp_path / "repo")
    cache = tmp_path / "cache"
    cochange.history(str(r.path), shas[-1], cache_dir=cache)
    r.git("checkout", "-q", "--detach", shas[1])
    other = r.commit_files({"README.md": "another line of history\n"}, "elsewhere")
    hist = cochange.history(str(r.path), other, cache_dir=cache)
    assert [c.sha for c in hist.commits][:3] == [other, shas[1], shas[0]]
    assert shas[-1] not in {c.sha for c in hist.commits}  # the cached head is not an ancestor: no stale commits


def test_a_test_or_lock_file_changed_alone_gives_no_note(tmp_path):
    r = GitRepo(tmp_path / "repo")
    r.commit_files({"ops/moe.py": "V = 0\n", "tests/test_moe.py": "T = 0\n", "uv.lock": "0\n",
                    "pyproject.toml": "0\n"}, "Initial")
    last = ""
    for i in range(1, 12):
        last = r.commit_files({"ops/moe.py": f"V = {i}\n", "tests/test_moe.py": f"T = {i}\n", "uv.lock": f"{i}\n",
                               "pyproject.toml": f"{i}\n"}, f"moe {i}")
    head = r.commit_files({"tests/test_moe.py": "T = 9\n", "uv.lock": "9\n"}, "A new test case; lock refreshed")
    assert [f.message for f in audit(r, last, head).findings if f.rule == "co-change"] == []
    assert cochange.follower("tests/test_moe.py") and cochange.follower("uv.lock") and not cochange.follower("ops/moe.py")
    # The code changed alone still gets its note: the test usually moves with it.
    code = r.commit_files({"ops/moe.py": "V = 9\n"}, "moe: new tile, nothing else")
    missed = {f.message.split(" — ")[0] for f in audit(r, head, code).findings if f.rule == "co-change"}
    assert "likely missed: tests/test_moe.py" in missed
