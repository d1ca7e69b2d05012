"""A writer's /audit approves one commit for the self-hosted GPU runners: the PR head the bot knew when the
command arrived. A newer push supersedes the command and the approval does not carry over; re-running an old
head's check run never dispatches the new head."""

from __future__ import annotations

from tests.bot.conftest import REPO, check_run_pr, fixture_payload, installation_lite, pr_payload
from tests.bot.test_bot_flows import _comment_payload
from tests.gitrepo import commit

FORK = "stranger/octo-repo"


def _fork_pr(state, gpu_repo, number: int):
    repo_path, base, head = gpu_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, number, head_sha=head, base_sha=base, head_repo=FORK,
                   author_association="FIRST_TIME_CONTRIBUTOR")
    state.add_workflow(REPO, inputs=["plan", "plan_url", "head_sha", "label", "audit_id"])
    state.set_permission(REPO, "maintainer", "maintain")
    return repo_path, base, head


def _opened(number: int, head: str, base: str, action: str = "opened") -> dict:
    return pr_payload(action, number=number, head=head, base=base, fork=FORK, association="FIRST_TIME_CONTRIBUTOR")


def _approve(bot, state, number: int, body: str = "/audit") -> dict:
    asked = state.add_comment(REPO, number, body, user="maintainer")
    assert bot.deliver("issue_comment", _comment_payload(number, body, "maintainer", asked["id"])).status_code == 202
    return asked


def _replies(state, number: int) -> list[str]:
    return [c["body"] for c in state.comments_on(REPO, number) if "drift-audit:reply" in c["body"]]


def test_the_approved_head_is_the_one_dispatched(bot_factory, gpu_repo):
    make, state = bot_factory
    _, base, head = _fork_pr(state, gpu_repo, 31)
    bot = make()
    bot.deliver("pull_request", _opened(31, head, base))
    bot.settle()
    assert state.dispatches == []
    _approve(bot, state, 31)
    bot.settle()
    (dispatch,) = state.dispatches
    assert dispatch["inputs"]["head_sha"] == head


def test_a_push_before_the_command_runs_is_not_dispatched(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = _fork_pr(state, gpu_repo, 32)
    bot = make(start_workers=False)
    bot.deliver("pull_request", _opened(32, head, base))
    asked = _approve(bot, state, 32)  # approves `head`
    pushed = commit(repo_path, {"engine/weights/loader.py": "import os\nos.system('id')\n"}, "after approval")
    state.pulls[(REPO, 32)]["head"]["sha"] = pushed  # the fork pushes before any worker ran; no webhook yet
    bot.service.start()
    bot.settle()
    assert all(d["inputs"]["head_sha"] != pushed for d in state.dispatches)
    assert state.dispatches == []
    (reply,) = _replies(state, 32)
    assert head[:12] in reply and pushed[:12] in reply and "again" in reply
    assert [r["content"] for r in state.reactions[asked["id"]]] == ["eyes", "confused"]


def test_a_newer_push_supersedes_the_command_and_the_approval_does_not_carry_over(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = _fork_pr(state, gpu_repo, 33)
    bot = make(start_workers=False)
    bot.deliver("pull_request", _opened(33, head, base))
    _approve(bot, state, 33)
    pushed = commit(repo_path, {"engine/weights/loader.py": "def load(path):\n    return {'w': 2}\n"}, "newer")
    state.pulls[(REPO, 33)]["head"]["sha"] = pushed
    bot.deliver("pull_request", _opened(33, pushed, base, action="synchronize"))
    bot.service.start()
    bot.settle()
    assert state.dispatches == []  # neither the approved head (superseded) nor the new one (not approved)
    assert [j.status for j in bot.store.jobs()][-2:] == ["superseded", "done"]
    (newest,) = [c for c in state.check_runs_for(REPO, pushed)]
    assert newest["status"] == "completed"
    _approve(bot, state, 33)  # a writer approves the new head
    bot.settle()
    (dispatch,) = state.dispatches
    assert dispatch["inputs"]["head_sha"] == pushed


def test_a_command_on_a_head_the_bot_never_saw_approves_nothing_until_repeated(bot_factory, gpu_repo):
    make, state = bot_factory
    _, base, head = _fork_pr(state, gpu_repo, 34)
    bot = make()
    _approve(bot, state, 34)  # no pull_request delivery was ever seen for this PR
    bot.settle()
    assert state.dispatches == []
    (comment,) = [c for c in state.comments_on(REPO, 34) if c["body"].startswith("<!-- drift-audit:comment")]
    assert f"again to approve {head[:12]}" in comment["body"]
    _approve(bot, state, 34)
    bot.settle()
    (dispatch,) = state.dispatches
    assert dispatch["inputs"]["head_sha"] == head


def test_rerunning_an_old_heads_check_run_never_dispatches_the_new_head(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = _fork_pr(state, gpu_repo, 35)
    bot = make()
    bot.deliver("pull_request", _opened(35, head, base))
    bot.settle()
    (run,) = state.check_runs_for(REPO, head)
    pushed = commit(repo_path, {"engine/weights/loader.py": "def load(path):\n    return {'w': 3}\n"}, "B")
    state.pulls[(REPO, 35)]["head"]["sha"] = pushed
    rerun = fixture_payload("check_run.rerequested")
    rerun["installation"] = installation_lite(1)
    rerun["repository"]["full_name"] = REPO
    rerun["sender"]["login"] = "maintainer"  # a writer clicks "Re-run" on A's check
    rerun["check_run"].update(id=run["id"], head_sha=head, external_id=run["external_id"],
                              pull_requests=[check_run_pr(35, head, base)])
    rerun["check_run"]["app"]["id"] = state.app_id
    bot.deliver("check_run", rerun)
    bot.settle()
    assert state.dispatches == [] and state.check_runs_for(REPO, pushed) == []
    assert state.check_runs[run["id"]]["conclusion"] == "cancelled"
