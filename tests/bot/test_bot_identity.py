"""Who the bot is and who counts as a writer: its own comments by its app's login, custom repository roles by
the base permission GitHub reports for them."""

from __future__ import annotations

import re

from bot.publish import COMMENT_MARKER
from tests.bot.conftest import REPO, pr_payload
from tests.bot.test_bot_approvals import _approve, _fork_pr, _opened

OTHER_APP = 777


def test_another_bots_comment_with_our_marker_is_never_edited(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 41, head_sha=head, base_sha=base)
    decoy = state.add_comment(REPO, 41, f"{COMMENT_MARKER}\nI am another app", app_id=OTHER_APP)
    assert decoy["user"]["type"] == "Bot"
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=41, head=head, base=base))
    bot.settle()
    assert state.comments[decoy["id"]]["body"] == f"{COMMENT_MARKER}\nI am another app"
    ours = [c for c in state.comments_on(REPO, 41) if c["id"] != decoy["id"] and COMMENT_MARKER in c["body"]]
    assert len(ours) == 1 and ours[0]["user"]["login"] == f"{state.app_slug}[bot]"
    assert state.count("PATCH", f"/issues/comments/{decoy['id']}") == 0
    assert [j.status for j in bot.store.jobs()] == ["done"]  # no 403, no retry


def test_a_custom_role_with_write_access_counts_as_a_writer(bot_factory, gpu_repo):
    make, state = bot_factory
    _, base, head = _fork_pr(state, gpu_repo, 42)
    state.set_permission(REPO, "maintainer", "security-engineer", base="write")
    bot = make()
    bot.deliver("pull_request", _opened(42, head, base))
    bot.settle()
    _approve(bot, state, 42)
    bot.settle()
    (dispatch,) = state.dispatches
    assert dispatch["inputs"]["head_sha"] == head


def test_a_custom_role_without_write_access_does_not(bot_factory, gpu_repo):
    make, state = bot_factory
    _, base, head = _fork_pr(state, gpu_repo, 43)
    state.set_permission(REPO, "maintainer", "release-notes-editor", base="triage")
    bot = make()
    bot.deliver("pull_request", _opened(43, head, base))
    bot.settle()
    asked = _approve(bot, state, 43, "/audit full")
    bot.settle()
    assert state.dispatches == []
    assert [r["content"] for r in state.reactions[asked["id"]]] == ["eyes", "confused"]


def test_a_malformed_base_config_is_a_neutral_check_with_its_line_not_retries(bot_factory, tmp_path):
    from tests.gitrepo import commit, git, init_repo

    make, state = bot_factory
    repo = init_repo(tmp_path / "bad-config")
    base = commit(repo, {".github/drift-audit.toml": "[settings]\nfail_on = \"new-error\"\n[[suite]\nid = 3\n",
                         "engine/x.py": "x = 1\n"}, "base")
    git(repo, "checkout", "-q", "-b", "feature")
    head = commit(repo, {"engine/x.py": "x = 2\n"}, "head")
    state.add_repo(REPO, str(repo))
    state.add_pull(REPO, 44, head_sha=head, base_sha=base)
    bot = make()
    bot.deliver("pull_request", pr_payload("opened", number=44, head=head, base=base))
    bot.settle()
    (job,) = bot.store.jobs()
    assert job.status == "done" and job.attempts == 1
    (run,) = state.check_runs_for(REPO, head)
    assert run["conclusion"] == "neutral" and run["output"]["title"] == "The audit could not run"
    assert re.search(r"drift-audit\.toml\S*:3: invalid TOML", run["output"]["summary"])  # file:line
