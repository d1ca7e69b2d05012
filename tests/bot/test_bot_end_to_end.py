"""From a signed webhook to one posted comment and a concluded check run, on a real git repo."""

from __future__ import annotations

from bot.publish import COMMENT_MARKER
from tests.bot.conftest import REPO, pr_payload


def _seed(state, repo_path, base, head, number=7, **kw):
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, number, head_sha=head, base_sha=base, **kw)


def test_pull_request_opened_posts_one_comment_and_concludes_the_check(bot_factory, engine_repo):
    make, state = bot_factory
    repo_path, base, head = engine_repo
    _seed(state, repo_path, base, head)
    bot = make()
    resp = bot.deliver("pull_request", pr_payload("opened", number=7, head=head, base=base, clone_url=str(repo_path)))
    assert resp.status_code == 202 and resp.json()["status"] == "queued"
    bot.settle()
    (comment,) = state.comments_on(REPO, 7)
    assert comment["body"].startswith(COMMENT_MARKER)
    assert "engine/weights/loader.py" in comment["body"].replace("\\", "")
    (run,) = state.check_runs_for(REPO, head, "Drift Audit")
    assert run["status"] == "completed" and run["conclusion"] in ("success", "failure", "neutral")
    assert "/audits/job-1?key=" in run["details_url"]
    page = bot.http.get(run["details_url"])
    assert bot.http.get("/audits/job-1").status_code == 404  # no key, no page
    assert bot.http.get(run["details_url"].replace("job-1", "job-2")).status_code == 404
    assert page.status_code == 200 and head in page.text
    (job,) = bot.store.jobs()
    assert job.status == "done" and job.check_run_id == run["id"]
