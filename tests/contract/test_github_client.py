"""bot.github against the stand-in on loopback, with the real PyGithub client: pacing per installation across
clients and threads, and retries that wait as long as GitHub asks (never a real minute: the sleep is injected and
moves the stand-in's clock)."""

from __future__ import annotations

import threading
import time

import pytest
from github import GithubException, RateLimitExceededExceedsMaxWait

from bot.github import GitHubApp, Pacer, rate_limit_wait
from bot.settings import BotSettings
from tests.ghstub import Fault

REPO = "octo/eng"
SHA = "a" * 40


def make_app(base: str, state, **overrides) -> tuple[GitHubApp, list[float]]:
    """A GitHubApp whose waits are recorded and move the stand-in's clock instead of sleeping."""
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(round(seconds, 1))
        state.advance(seconds)

    values = dict(app_id=state.app_id, private_key=state.private_key, webhook_secret="s", github_url=base,
                  seconds_between_requests=0.0, seconds_between_writes=0.0, http_backoff=0.01)
    values.update(overrides)
    return GitHubApp(BotSettings(**values), sleep=sleep, clock=state.now), waits


def seeded(state) -> None:
    state.add_repo(REPO)
    state.add_pull(REPO, 7, head_sha=SHA, base_sha="b" * 40)


def test_writes_are_paced_per_installation_across_clients_and_threads(ghstub):
    """Each job builds its own client; the spacing holds for all of them together, not per client."""
    base, state = ghstub
    seeded(state)
    gap = 0.25
    app = GitHubApp(BotSettings(app_id=state.app_id, private_key=state.private_key, webhook_secret="s",
                                github_url=base, seconds_between_requests=0.0, seconds_between_writes=gap))
    issues = [app.client(1).get_repo(REPO).get_issue(7) for _ in range(3)]  # three jobs, three clients

    def job(issue) -> None:
        for i in range(2):
            issue.create_comment(f"from a job {i}")

    threads = [threading.Thread(target=job, args=(issue,)) for issue in issues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writes = [t for t, m, p in state.timeline if m == "POST" and p.endswith("/issues/7/comments")]
    assert len(writes) == 6 and len(state.comments_on(REPO, 7)) == 6
    gaps = [b - a for a, b in zip(writes, writes[1:])]
    # per-client pacing sends the three clients' writes together (gaps near 0) and spans ~1 gap, not 5
    assert writes[-1] - writes[0] >= 5 * gap * 0.95 and min(gaps) >= gap * 0.5, gaps


def test_reads_are_not_held_to_the_write_spacing(ghstub):
    base, state = ghstub
    seeded(state)
    app = GitHubApp(BotSettings(app_id=state.app_id, private_key=state.private_key, webhook_secret="s",
                                github_url=base, seconds_between_requests=0.0, seconds_between_writes=2.0))
    issue = app.client(1).get_repo(REPO).get_issue(7)
    comment = issue.create_comment("one write")
    t0 = time.monotonic()
    for _ in range(10):
        issue.get_comment(comment.id)
    assert time.monotonic() - t0 < 6  # paced as writes, ten reads would take at least 18 s


def test_pacer_hands_out_ordered_slots():
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)

    pacer = Pacer(0.5, 2.0, sleep=sleep, clock=lambda: now[0])
    assert [pacer.wait(write=w) for w in (False, False, True, True, False)] == [0.0, 0.5, 1.0, 3.0, 3.5]
    assert slept == [0.5, 1.0, 3.0, 3.5]


def test_a_secondary_limit_without_retry_after_waits_at_least_a_minute_then_the_post_is_sent_once(ghstub):
    base, state = ghstub
    seeded(state)
    state.limits.content_per_minute, state.limits.retry_after = 1, False
    app, waits = make_app(base, state)
    issue = app.client(1).get_repo(REPO).get_issue(7)
    issue.create_comment("first")
    issue.create_comment("second")  # refused once (403, no Retry-After), then resent after the minute
    assert waits == [60.0] and state.secondary_refusals == 1
    assert [c["body"] for c in state.comments_on(REPO, 7)] == ["first", "second"]


def test_retry_after_is_honoured_for_429(ghstub):
    base, state = ghstub
    seeded(state)
    state.limits.content_per_minute, state.limits.secondary_status = 1, 429
    app, waits = make_app(base, state)
    repo = app.client(1).get_repo(REPO)
    state.add_commit(REPO, SHA)
    repo.create_check_run(name="Drift Audit", head_sha=SHA)
    state.advance(30)
    repo.create_check_run(name="Drift Audit", head_sha=SHA)
    assert len(waits) == 1 and 29 <= waits[0] <= 31  # what Retry-After said, not the default minute
    assert len(state.check_runs) == 2 and state.secondary_refusals == 1


def test_a_spent_primary_limit_waits_for_x_ratelimit_reset(ghstub):
    base, state = ghstub
    seeded(state)
    state.rate_limit = 3
    app, waits = make_app(base, state, max_rate_limit_wait=3600)
    repo = app.client(1).get_repo(REPO)  # one request of three
    before = state.now()
    repo.get_pull(7)
    repo.get_pull(7)
    repo.get_pull(7)  # the limit is spent here: 403, remaining 0, then it waits for the reset
    reset = int(before // 3600 * 3600 + 3600)
    assert len(waits) == 1 and abs(waits[0] - (reset - before + 1)) < 2
    assert state.count("GET", "/pulls/7", 403) == 1 and state.count("GET", "/pulls/7", 200) == 3


def test_a_wait_over_the_cap_is_not_slept(ghstub):
    base, state = ghstub
    seeded(state)
    state.rate_limit = 2
    app, waits = make_app(base, state, max_rate_limit_wait=30)
    repo = app.client(1).get_repo(REPO)
    repo.get_pull(7)
    state.advance(-(state.now() % 3600) + 60)  # an hour's reset is far off: more than the 30 s cap
    with pytest.raises(RateLimitExceededExceedsMaxWait):
        repo.get_pull(7)
    assert waits == []


def test_a_post_that_may_have_landed_is_not_resent(ghstub):
    """A 502 after GitHub applied the create: resending would duplicate the comment."""
    base, state = ghstub
    seeded(state)
    state.fault = Fault(rate=1.0, kinds=(502,), paths=("/comments",), methods=("POST",), after_apply=True)
    app, waits = make_app(base, state)
    with pytest.raises(GithubException) as err:
        app.client(1).get_repo(REPO).get_issue(7).create_comment("once")
    assert err.value.status == 502
    assert state.arrived("POST", "/issues/7/comments") == 1 and len(state.comments_on(REPO, 7)) == 1


def test_reads_are_retried_through_5xx_and_a_plain_403_is_not(ghstub):
    base, state = ghstub
    seeded(state)
    app, waits = make_app(base, state)
    repo = app.client(1).get_repo(REPO)
    state.fault = Fault(rate=0.5, kinds=(502, 503), seed=1, methods=("GET",))
    assert all(repo.get_pull(7).number == 7 for _ in range(5)) and state.faults_injected > 0
    state.fault = Fault()
    human = state.add_comment(REPO, 7, "mine", user="alice")
    comment = repo.get_issue(7).get_comment(human["id"])
    with pytest.raises(GithubException) as err:
        comment.edit("not yours")
    assert err.value.status == 403 and state.arrived("PATCH", f"/comments/{human['id']}") == 1


def test_rate_limit_wait_reads_githubs_headers():
    clock = lambda: 1000.0  # noqa: E731
    assert rate_limit_wait(403, {"Retry-After": "7"}, b"", clock=clock) == 7.0
    assert rate_limit_wait(429, {}, b"", clock=clock) == 60.0
    assert rate_limit_wait(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1100"}, b"", clock=clock) == 101
    body = b'{"message": "You have exceeded a secondary rate limit."}'
    assert rate_limit_wait(403, {}, body, clock=clock) == 60.0
    assert rate_limit_wait(403, {}, b'{"message": "Resource not accessible by integration"}', clock=clock) is None
    assert rate_limit_wait(502, {"Retry-After": "1"}, b"", clock=clock) is None
