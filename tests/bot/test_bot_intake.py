"""Webhook intake: HMAC (GitHub's own test vector), the 25 MB cap, fast acks, redeliveries, real payloads."""

from __future__ import annotations

import json
import threading

import httpx

from bot.events import Ignored, job_for, read_delivery
from bot.jobs import Job
from bot.security import signature_of, verify_signature
from runner.actions import run_title
from tests.bot.conftest import SECRET, check_run_pr, fixture_payload, pr_payload, signed

GITHUB_VECTOR = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_github_documented_hmac_vector():
    assert signature_of(SECRET, b"Hello, World!") == GITHUB_VECTOR
    assert verify_signature(SECRET, b"Hello, World!", GITHUB_VECTOR)
    assert not verify_signature(SECRET, b"Hello, World?", GITHUB_VECTOR)
    assert not verify_signature(SECRET, b"Hello, World!", GITHUB_VECTOR.replace("757", "758"))
    assert not verify_signature(SECRET, b"Hello, World!", None)
    assert not verify_signature("", b"Hello, World!", GITHUB_VECTOR)


def test_webhook_rejects_bad_signatures_and_oversized_bodies(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    body = json.dumps(fixture_payload("ping")).encode()
    headers = signed(body, "ping")
    headers["X-Hub-Signature-256"] = signature_of("wrong secret", body)
    assert bot.http.post("/webhook", content=body, headers=headers).status_code == 401
    del headers["X-Hub-Signature-256"]
    assert bot.http.post("/webhook", content=body, headers=headers).status_code == 401
    big = b"{" + b" " * (25 * 1024 * 1024) + b"}"
    assert bot.http.post("/webhook", content=big, headers=signed(big, "push")).status_code == 413

    def chunks():  # no Content-Length: the stream itself is capped
        for _ in range(26):
            yield b" " * (1024 * 1024)

    streamed = bot.http.post(
        "/webhook",
        content=chunks(),
        headers={"X-GitHub-Event": "push", "X-GitHub-Delivery": "x", "X-Hub-Signature-256": "sha256=" + "0" * 64},
    )
    assert streamed.status_code == 413
    assert bot.store.deliveries() == 0
    assert bot.http.get("/healthz").json() == {"ok": True}


def test_unknown_events_are_acknowledged_and_ignored(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    resp = bot.deliver("workflow_job", fixture_payload("workflow_job.completed.success.with-organization"))
    assert resp.status_code == 202 and resp.json()["status"] == "ignored"
    assert bot.deliver("ping", fixture_payload("ping")).status_code == 202
    assert bot.store.jobs() == []
    bad = b"[1, 2"
    assert bot.http.post("/webhook", content=bad, headers=signed(bad, "pull_request")).status_code == 400


def test_redelivered_and_concurrent_duplicates_enqueue_once(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    payload = pr_payload("opened", number=3, head="1" * 40, base="2" * 40)
    body = json.dumps(payload).encode()
    codes: list[int] = []

    def send():
        with httpx.Client(base_url=bot.url, timeout=10) as c:
            codes.append(c.post("/webhook", content=body, headers=signed(body, "pull_request", "guid-1")).status_code)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200] * 7 + [202]
    assert len(bot.store.jobs()) == 1


def test_every_fixture_maps_to_the_right_job():
    def job_for(event, payload, **kw):  # the whole intake decision: decode, GitHub's schema, the typed job
        return read_delivery(event, json.dumps(payload).encode(), **kw)

    pr = job_for("pull_request", fixture_payload("pull_request.opened"))
    assert isinstance(pr, Job) and pr.kind == "audit" and pr.pr == 2 and pr.installation_id == 1
    assert pr.head_sha == fixture_payload("pull_request.opened")["pull_request"]["head"]["sha"]
    for action in ("synchronize", "reopened", "ready_for_review"):
        assert isinstance(job_for("pull_request", fixture_payload(f"pull_request.{action}")), Job), action
    for name in ("pull_request.closed", "pull_request.labeled", "pull_request.converted_to_draft"):
        assert isinstance(job_for("pull_request", fixture_payload(name)), Ignored), name

    draft = fixture_payload("pull_request.opened")
    draft["pull_request"]["draft"] = True
    assert isinstance(job_for("pull_request", draft), Ignored)
    assert isinstance(job_for("pull_request", draft, audit_drafts=True), Job)

    plain = fixture_payload("issue_comment.created")
    assert isinstance(job_for("issue_comment", plain), Ignored)  # a comment on an issue, not a PR
    on_pr = fixture_payload("issue_comment.created")
    on_pr["issue"]["pull_request"] = {"url": "https://api.github.com/repos/Codertocat/Hello-World/pulls/1"}
    assert isinstance(job_for("issue_comment", on_pr), Ignored)  # no /audit in it
    on_pr["comment"]["body"] = "looks good\n/audit run parity-rmsnorm on sm90\n"
    cmd = job_for("issue_comment", on_pr)
    assert cmd.kind == "command" and cmd.body == on_pr["comment"]["body"] and cmd.pr == 1  # parsed by the worker
    assert isinstance(job_for("issue_comment", fixture_payload("issue_comment.edited")), Ignored)

    mg_payload = fixture_payload("merge_group.checks_requested")
    mg = job_for("merge_group", mg_payload)
    assert mg.kind == "audit" and mg.pr is None and mg.trigger == "merge_group"
    assert mg.head_sha == mg_payload["merge_group"]["head_sha"] and mg.base_sha == mg_payload["merge_group"]["base_sha"]

    rerun = fixture_payload("check_run.rerequested")
    fork_run = job_for("check_run", rerun)  # no PR listed (a fork's head): the store finds it from the run's job
    assert fork_run.kind == "rerun" and fork_run.pr is None and fork_run.check_run_id == rerun["check_run"]["id"]
    rerun["check_run"]["pull_requests"] = [check_run_pr(5, "a" * 40, "b" * 40)]
    again = job_for("check_run", rerun)
    assert again.kind == "rerun" and again.pr == 5 and again.check_run_id == rerun["check_run"]["id"]
    assert again.head_sha == rerun["check_run"]["head_sha"]  # that run's head, never the PR's newer one
    assert isinstance(job_for("check_run", rerun, app_id=999), Ignored)  # another app's check run

    assert isinstance(job_for("workflow_run", fixture_payload("workflow_run.completed")), Ignored)  # not our workflow
    ours = fixture_payload("workflow_run.completed")
    ours["workflow_run"].update(display_title=run_title("da-abc", "sm90"), path=".github/workflows/drift-audit-gpu.yml",
                                event="workflow_dispatch")
    wr = job_for("workflow_run", ours)
    assert (wr.kind, wr.run_id, wr.audit_id, wr.label) == ("collect", ours["workflow_run"]["id"], "da-abc", "sm90")
    inst = job_for("installation", fixture_payload("installation.created"))
    assert inst.kind == "installation" and "Codertocat/Hello-World" in inst.note
    assert isinstance(job_for("check_suite", fixture_payload("check_suite.requested")), Ignored)
    suite = fixture_payload("check_suite.requested")
    suite["action"] = "rerequested"  # "Re-run all checks": the suite's head, the run found by the store
    again = job_for("check_suite", suite)
    assert (again.kind, again.head_sha, again.check_run_id) == ("rerun", suite["check_suite"]["head_sha"], None)


def test_forks_and_first_timers_are_untrusted():
    assert not job_for("pull_request", pr_payload("opened", number=1, head="1" * 40, base="2" * 40)).untrusted
    fork = pr_payload("opened", number=1, head="1" * 40, base="2" * 40, fork="someone/octo-repo")
    assert job_for("pull_request", fork).untrusted
    first = pr_payload("opened", number=1, head="1" * 40, base="2" * 40, association="FIRST_TIME_CONTRIBUTOR")
    assert job_for("pull_request", first).untrusted


def test_a_title_edit_is_ignored_before_the_schema_runs_and_a_new_base_is_validated():
    """``pull_request.edited`` is acted on only for a new base: the common edit (title, body) is turned away at
    the cheap filter, so even a body the schema would refuse is ignored; a retarget is validated like any PR."""
    from bot.payloads import PayloadError

    junk = {"action": "edited", "changes": {"title": {"from": "old"}}, "pull_request": "not an object"}
    assert isinstance(read_delivery("pull_request", json.dumps(junk).encode()), Ignored)
    retarget = dict(junk, changes={"base": {"ref": {"from": "dev"}, "sha": {"from": "0" * 40}}})
    try:
        read_delivery("pull_request", json.dumps(retarget).encode())
    except PayloadError:
        pass
    else:
        raise AssertionError("a retarget with a malformed pull_request was not validated")
