"""Deliveries an attacker can shape: a captured delivery replayed under a new GUID or another event name (neither
header is signed), an approval that arrives after a push, bytes that are not UTF-8 or JSON strings that are not
Unicode, and /audit where it is not a command. Each gets a clear 4xx or is ignored, and nothing is lost."""

from __future__ import annotations

import copy
import json
import random
import time

from bot.app import _intake
from bot.events import Ignored, read_delivery
from bot.queue import DEAD, SqliteJobStore
from bot.security import signature_of
from bot.settings import BotSettings
from tests.bot.conftest import REPO, SECRET, fixture_payload, installation_lite, pr_payload, signed
from tests.bot.test_bot_approvals import _fork_pr, _opened
from tests.bot.test_bot_flows import _comment_payload
from tests.gitrepo import commit


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _pushed(number: int, head: str, base: str, at: float, action: str = "synchronize") -> dict:
    p = _opened(number, head, base, action=action)
    p["pull_request"]["updated_at"] = _iso(at)
    return p


def test_a_replayed_approval_approves_nothing_new(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = _fork_pr(state, gpu_repo, 61)
    bot = make()
    bot.deliver("pull_request", _pushed(61, head, base, time.time() - 60, action="opened"))
    asked = state.add_comment(REPO, 61, "/audit", user="maintainer")
    captured = json.dumps(_comment_payload(61, "/audit", "maintainer", asked["id"])).encode()
    assert bot.deliver("issue_comment", captured).status_code == 202
    bot.settle()
    (dispatch,) = state.dispatches
    assert dispatch["inputs"]["head_sha"] == head

    pushed = commit(repo_path, {"engine/weights/loader.py": "import os\nos.system('id')\n"}, "after approval")
    state.pulls[(REPO, 61)]["head"]["sha"] = pushed
    bot.deliver("pull_request", _pushed(61, pushed, base, time.time()))
    bot.settle()
    jobs = len(bot.store.jobs())
    for event in ("issue_comment", "pull_request"):  # a new GUID, and another event name: neither is signed
        resp = bot.deliver(event, captured)
        assert resp.status_code == 409 and "replay" in resp.json()["error"], (event, resp.text)
    assert bot.deliver("ping", captured).status_code == 400  # not a ping by GitHub's schema
    assert bot.deliver("issue_comment", captured, delivery="d-redelivered").status_code == 409
    bot.settle()
    assert len(bot.store.jobs()) == jobs and len(state.dispatches) == 1  # the new head was never dispatched


def test_an_approval_written_before_the_push_it_arrives_after_approves_nothing(bot_factory, gpu_repo):
    make, state = bot_factory
    repo_path, base, head = _fork_pr(state, gpu_repo, 62)
    bot = make(start_workers=False)
    t0 = time.time() - 600
    bot.deliver("pull_request", _pushed(62, head, base, t0, action="opened"))
    asked = state.add_comment(REPO, 62, "/audit", user="maintainer")
    late = _comment_payload(62, "/audit", "maintainer", asked["id"])
    late["comment"]["created_at"] = _iso(t0 + 60)  # the writer approved `head` ...
    pushed = commit(repo_path, {"engine/weights/loader.py": "import os\nos.system('id')\n"}, "pushed later")
    state.pulls[(REPO, 62)]["head"]["sha"] = pushed
    bot.deliver("pull_request", _pushed(62, pushed, base, t0 + 120))  # ... then the fork pushed ...
    bot.deliver("issue_comment", late)  # ... and the approval's delivery came late (or was redelivered)
    bot.service.start()
    bot.settle()
    assert state.dispatches == []
    (comment,) = [c for c in state.comments_on(REPO, 62) if c["body"].startswith("<!-- drift-audit:comment")]
    assert f"written before {pushed[:12]} was pushed" in comment["body"]
    assert [r["content"] for r in state.reactions[asked["id"]]] == ["eyes", "confused"]

    again = state.add_comment(REPO, 62, "/audit", user="maintainer")  # written now: approves `pushed`
    bot.deliver("issue_comment", _comment_payload(62, "/audit", "maintainer", again["id"]))
    bot.settle()
    (dispatch,) = state.dispatches
    assert dispatch["inputs"]["head_sha"] == pushed


def test_bytes_that_are_not_utf8_and_strings_that_are_not_unicode_answer_400(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    merge = fixture_payload("merge_group.checks_requested")
    good = json.dumps(merge).encode()
    lone = copy.deepcopy(merge)
    lone["merge_group"]["head_ref"] = "refs/heads/gh-readonly-queue/main/\ud800"  # was a 500 (SQLite cannot store it)
    key = dict(copy.deepcopy(merge), **{"\udc80": 1})
    bodies = {
        "invalid UTF-8": good.replace(b'"checks_requested"', b'"checks_\xff\xferequested"'),
        "lone surrogate": json.dumps(lone).encode(),
        "lone surrogate key": json.dumps(key).encode(),
        "UTF-16": json.dumps(merge).encode("utf-16"),
        "NUL bytes": b"\x00" * 64,
        "not an object": b'["merge_group"]',
        "huge integer": good.replace(b'"checks_requested"', b'"checks_requested", "n": 1' + b"0" * 5000),
    }
    for name, body in bodies.items():
        resp = bot.http.post("/webhook", content=body, headers=signed(body, "merge_group"))
        assert resp.status_code == 400 and resp.json()["field"] == "$", (name, resp.text)
    assert bot.store.jobs() == [] and bot.http.get("/healthz").status_code == 200
    assert bot.deliver("merge_group", merge).status_code == 202  # the well-formed one still goes through


def test_audit_outside_a_new_pr_comment_by_a_person_is_no_command():
    comment = fixture_payload("issue_comment.created")
    comment["installation"] = installation_lite(1)
    comment["issue"]["pull_request"] = {"url": f"https://api.github.com/repos/{REPO}/pulls/1"}
    comment["comment"]["body"] = "/audit full"
    assert read_delivery("issue_comment", json.dumps(comment).encode()).kind == "command"
    edited = copy.deepcopy(comment)
    edited["action"] = "edited"  # an edit can turn any old comment into a command: never acted on
    edited["changes"] = {"body": {"from": "thanks"}}
    assert isinstance(read_delivery("issue_comment", json.dumps(edited).encode()), Ignored)
    by_bot = copy.deepcopy(comment)
    by_bot["comment"]["user"] = dict(by_bot["comment"]["user"], login="other-app[bot]", type="Bot")
    assert isinstance(read_delivery("issue_comment", json.dumps(by_bot).encode()), Ignored)
    on_issue = copy.deepcopy(comment)
    del on_issue["issue"]["pull_request"]
    assert isinstance(read_delivery("issue_comment", json.dumps(on_issue).encode()), Ignored)

    pr = pr_payload("opened", number=1, head="1" * 40, base="2" * 40)
    pr["pull_request"]["body"] = "/audit full\n/audit run parity-loader on sm90"  # the PR's own text
    job = read_delivery("pull_request", json.dumps(pr).encode())
    assert job.kind == "audit" and not job.options.all_suites and not job.options.suites


def test_flipped_bytes_of_signed_deliveries_are_answered_never_raised(tmp_path):
    """Seeded: bytes of GitHub's examples flipped, cut or spliced, then signed; in process, no 500, no poison."""
    settings = BotSettings(app_id=4242, webhook_secret=SECRET, db=str(tmp_path / "bytes.db"))
    store = SqliteJobStore(settings.db)
    rng = random.Random(6161)
    comment = fixture_payload("issue_comment.created")
    comment["issue"]["pull_request"] = {"url": "https://api.github.com/repos/Codertocat/Hello-World/pulls/1"}
    comment["comment"]["body"] = "/audit run parity-loader on sm90"
    sources = [("pull_request", fixture_payload("pull_request.opened")), ("issue_comment", comment),
               ("merge_group", fixture_payload("merge_group.checks_requested"))]
    noise = [b"\xff", b"\xc3", b"\\ud800", b"\\udfff", b"\x00", b'"', b"\\", b"{", b"]", b"\xed\xa0\x80", b"\\u0000"]
    statuses: dict[int, int] = {}
    for i in range(400):
        event, payload = rng.choice(sources)
        body = bytearray(json.dumps(payload).encode())
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(body))
            op = rng.random()
            if op < 0.4:
                body[at:at + 1] = rng.choice(noise)
            elif op < 0.6:
                del body[at:at + rng.randint(1, 50)]
            else:
                body[at:at] = rng.choice(noise)
        data = bytes(body)
        answer = _intake(settings, store, event, f"bytes-{i}", signature_of(SECRET, data), data)
        statuses[answer.status] = statuses.get(answer.status, 0) + 1
    assert set(statuses) <= {202, 400, 409} and statuses.get(400, 0) > 200, statuses
    while (row := store.lease("w", 30)) is not None:
        assert row.job is not None
        store.finish(row.id, "w")
    assert store.jobs(DEAD) == []


def test_a_late_push_of_an_older_head_does_not_supersede_the_current_one(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    old, new, base = "1" * 40, "2" * 40, "3" * 40
    t = time.time()
    assert bot.deliver("pull_request", _pushed(63, new, base, t)).json()["status"] == "queued"
    late = bot.deliver("pull_request", _pushed(63, old, base, t - 30, action="opened"))  # redelivered late
    assert late.status_code == 202 and late.json()["status"] == "ignored" and "older" in late.json()["reason"]
    (job,) = bot.store.jobs()
    assert job.head_sha == new and job.status == "queued" and job.superseded_by is None
    assert bot.store.known_head(REPO, 63) == new
    assert bot.deliver("pull_request", _pushed(63, old, base, t + 30)).json()["status"] == "queued"  # a real push


def test_only_the_gpu_workflow_file_itself_reports_results():
    from runner.actions import run_of_event, run_title

    def run(path: str) -> dict:
        return {"workflow_run": {"id": 7, "display_title": run_title("da-abc", "sm90"), "path": path}}

    assert run_of_event(run(".github/workflows/drift-audit-gpu.yml")) == (7, "da-abc", "sm90")
    for other in (".github/workflows/not-drift-audit-gpu.yml", ".github/workflows/drift-audit-gpu.yml.bak",
                  "sub/.github/workflows/drift-audit-gpu.yml", ".github/workflows/x/drift-audit-gpu.yml"):
        assert run_of_event(run(other)) is None, other  # a writer's other workflow titled like ours
