"""Seeded fuzzing of intake with mutated copies of GitHub's own example payloads: no 500s, no poison jobs.

Every mutated payload is signed, so it passes the HMAC and reaches the decoder, GitHub's schema and the job
builder. Each must be answered 200/202/400 (never an exception, which the server would turn into a 500),
and every job it enqueues must load back and validate, so no row can stall the queue.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter

import httpx

from bot.app import _intake
from bot.queue import DEAD, SqliteJobStore
from bot.security import signature_of
from bot.settings import BotSettings
from runner.actions import run_title
from tests.bot.conftest import SECRET, check_run_pr, fixture_payload, installation_lite, signed

SEED = 1414
IN_PROCESS = 2000
OVER_HTTP = 100
WEIRD = ["2a", 5, -1, 0, 2**63, None, True, False, [], {}, 1.5, "", "x" * 5000, [1, "a"], {"id": "1"},
         "../../../etc/passwd", "\u0000\u202e", "a" * 40, "/audit full"]


def _sources() -> list[tuple[str, dict]]:
    """GitHub's examples for every event and action the bot acts on, shaped as an installed app gets them."""
    out = []
    for action in ("opened", "synchronize", "reopened", "ready_for_review"):
        out.append(("pull_request", fixture_payload(f"pull_request.{action}")))
    comment = fixture_payload("issue_comment.created")
    comment["installation"] = installation_lite(1)
    comment["issue"]["pull_request"] = {"url": "https://api.github.com/repos/Codertocat/Hello-World/pulls/1"}
    comment["comment"]["body"] = "thanks\n/audit run parity-loader on sm90"
    out.append(("issue_comment", comment))
    rerun = fixture_payload("check_run.rerequested")
    rerun["check_run"]["pull_requests"] = [check_run_pr(2, "a" * 40, "b" * 40, repo="Codertocat/Hello-World")]
    out.append(("check_run", rerun))
    fork_run = fixture_payload("check_run.rerequested")  # a fork's head: no pull request listed
    out.append(("check_run", fork_run))
    suite = fixture_payload("check_suite.requested")
    suite["action"] = "rerequested"
    out.append(("check_suite", suite))
    out.append(("merge_group", fixture_payload("merge_group.checks_requested")))
    run = fixture_payload("workflow_run.completed")
    run["installation"] = installation_lite(1)
    run["workflow_run"].update(display_title=run_title("da-abc", "sm90"), path=".github/workflows/drift-audit-gpu.yml",
                               event="workflow_dispatch")
    out.append(("workflow_run", run))
    out.append(("installation", fixture_payload("installation.created")))
    out.append(("ping", fixture_payload("ping")))
    return out


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _mutate(payload: dict, rng: random.Random) -> dict:
    p = copy.deepcopy(payload)
    for _ in range(rng.randint(1, 3)):
        paths = [q for q in _paths(p) if q]
        path = rng.choice(paths)
        parent = p
        for step in path[:-1]:
            parent = parent[step]
        key = path[-1]
        op = rng.random()
        if op < 0.15 and isinstance(parent, dict):
            del parent[key]
        elif op < 0.25:
            parent[key] = [parent[key]]
        elif op < 0.3:
            deep: object = 1
            for _ in range(rng.choice((70, 500))):
                deep = [deep]
            parent[key] = deep
        else:
            parent[key] = copy.deepcopy(rng.choice(WEIRD))
    return p


def test_mutated_github_payloads_never_500_and_never_poison_the_queue(tmp_path):
    settings = BotSettings(app_id=4242, webhook_secret=SECRET, db=str(tmp_path / "fuzz.db"))
    store = SqliteJobStore(settings.db)
    rng = random.Random(SEED)
    sources = _sources()
    statuses: Counter[int] = Counter()
    accepted: set[bytes] = set()
    for i in range(IN_PROCESS):
        event, original = rng.choice(sources)
        body = json.dumps(_mutate(original, rng)).encode()
        answer = _intake(settings, store, event, f"fuzz-{i}", signature_of(SECRET, body), body)  # raises = a 500
        statuses[answer.status] += 1
        if answer.status == 400:
            assert answer.body["field"].startswith("$"), answer.body
        assert (answer.status == 409) == (body in accepted), answer.body  # a body seen under another GUID
        if answer.status == 202:
            accepted.add(body)
    assert set(statuses) <= {202, 400, 409}, statuses
    assert statuses[400] > IN_PROCESS // 4 and statuses[202] > IN_PROCESS // 20  # both paths were exercised

    leased = 0
    while (row := store.lease("fuzz-worker", 30)) is not None:
        assert row.job is not None
        row.job.validate()
        store.finish(row.id, "fuzz-worker")
        leased += 1
    assert store.jobs(DEAD) == []  # zero poison jobs
    assert leased == len(store.jobs()) > 0
    print(f"fuzz: {IN_PROCESS} mutated payloads, answers {dict(statuses)}, {leased} jobs, 0 dead")


def test_mutated_payloads_over_http_never_answer_500(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    rng = random.Random(SEED + 1)
    sources = _sources()
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=bot.url, timeout=10) as client:
        for _ in range(OVER_HTTP):
            event, original = rng.choice(sources)
            body = json.dumps(_mutate(original, rng)).encode()
            statuses[client.post("/webhook", content=body, headers=signed(body, event)).status_code] += 1
    assert set(statuses) <= {202, 400, 409}, statuses
    assert bot.store.jobs(DEAD) == [] and all(r.job is not None for r in bot.store.jobs())
