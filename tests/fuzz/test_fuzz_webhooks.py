"""Forged webhooks that GitHub's own schemas accept: seeded payloads generated from the octokit schemas the bot
validates with (``bot/schemas``, byte-identical to ``shared/fixtures/github-webhook-schemas``), signed, through
intake and the queue. Schema-valid is the dangerous kind: nothing rejects it before the job builder.

Each must be answered (202, 400 naming a ``$`` field, or 409 for a body seen before), never raise; every job it
queues loads back and validates (no poison row); a check run or check suite of another app is never re-run; and
what a job carries is what the payload said (repository, SHAs), never a default filled in.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

from bot.app import _intake
from bot.jobs import AuditJob, CollectJob, CommandJob, RerunJob, dump_job, load_job
from bot.payloads import PayloadError, _documents, validate
from bot.queue import DEAD, SqliteJobStore
from bot.security import signature_of
from bot.settings import BotSettings
from runner.actions import run_title

SEED = 8086
PER_EVENT = 40
SECRET = "fuzz secret"
APP_ID = 4242
SHAS = ["a" * 40, "0123456789abcdef" * 2 + "01234567", "A" * 40, "g" * 40, "a" * 39, "", "HEAD", "a" * 41]
STRINGS = ["", " ", "x", "octo-org/octo-repo", "o/r", "../../etc", "a" * 300, "\u202e\u0000", "/audit full",
           "/audit run parity-loader on sm90", "<!-- drift-audit:comment -->", "é", "\U0001f600", "2019-05-15T15:20:21Z",
           "not a date", "workflow_dispatch", "pull_request", ".github/workflows/drift-audit-gpu.yml", "Bot", "User",
           "rerequested", "mg:" + "b" * 40 + ":refs/heads/gh-readonly-queue/main/pr-1", "job:1", "main"]
INTS = [0, 1, 2, 7, 2**31, 2**53 - 1, 2**53, 2**63 - 1, -1, APP_ID, APP_ID + 1]
# (event, schema id) pairs the bot acts on, plus one it ignores; generated payloads stay within the schema
EVENTS = [("pull_request", "pull_request$opened"), ("pull_request", "pull_request$synchronize"),
          ("pull_request", "pull_request$reopened"), ("pull_request", "pull_request$ready_for_review"),
          ("pull_request", "pull_request$edited"),
          ("issue_comment", "issue_comment$created"), ("check_run", "check_run$rerequested"),
          ("check_suite", "check_suite$rerequested"), ("merge_group", "merge_group$checks_requested"),
          ("workflow_run", "workflow_run$completed"), ("installation", "installation$created")]


class Forger:
    """A random instance of a JSON Schema (the subset GitHub's webhook schemas use), biased to hostile values."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.docs = _documents()

    def _resolve(self, ref: str, base: str) -> tuple[dict, str]:
        target = ref if ref.startswith("common/") or not base.startswith("common/") else f"common/{ref}"
        return self.docs[target], target

    def make(self, schema: Any, base: str, depth: int = 0, name: str = "") -> Any:
        rng = self.rng
        if not isinstance(schema, dict):
            return None
        if "$ref" in schema:
            target, where = self._resolve(schema["$ref"], base)
            return self.make(target, where, depth, name)
        if "allOf" in schema:
            out: Any = None
            for part in schema["allOf"]:
                value = self.make(part, base, depth, name)
                out = {**out, **value} if isinstance(out, dict) and isinstance(value, dict) else value
            return out
        for key in ("oneOf", "anyOf"):
            if key in schema:
                return self.make(rng.choice(schema[key]), base, depth, name)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return rng.choice(schema["enum"])
        kind = schema.get("type", "object")
        if isinstance(kind, list):
            kind = rng.choice(kind)
        if kind == "null":
            return None
        if kind == "boolean":
            return rng.random() < (0.2 if name == "draft" else 0.5)
        if kind in ("integer", "number"):
            low = schema.get("minimum", -(2**63))
            return rng.choice([v for v in INTS if v >= low] or [low])
        if kind == "string":  # mostly well-formed where the bot reads a SHA or a repository, so jobs get built
            if name in ("sha", "head_sha", "base_sha", "after", "before"):
                return rng.choice(SHAS[:2]) if rng.random() < 0.8 else rng.choice(SHAS + STRINGS)
            if name == "full_name" and rng.random() < 0.8:
                return "octo-org/octo-repo"
            return rng.choice(SHAS if rng.random() < 0.3 else STRINGS)
        if kind == "array":
            if depth > 6 or "items" not in schema:
                return []
            return [self.make(schema["items"], base, depth + 1, name) for _ in range(rng.choice((0, 1, 1, 2)))]
        obj: dict[str, Any] = {}
        required = set(schema.get("required", []))
        for prop, sub in schema.get("properties", {}).items():
            if prop in required or (depth < 4 and rng.random() < 0.3):
                obj[prop] = self.make(sub, base, depth + 1, prop)
        return obj


def _steer(event: str, payload: dict, rng: random.Random) -> None:
    """Nudge a forged payload toward the branches that build jobs (a PR comment with /audit, our GPU run's title
    and path, our app's id): otherwise almost every forgery would stop at the first "ignored"."""
    if event == "issue_comment" and rng.random() < 0.7:
        payload.setdefault("issue", {})["pull_request"] = {"url": "https://api.github.com/repos/o/r/pulls/1"}
        payload.setdefault("comment", {})["body"] = rng.choice(STRINGS[8:10])
    if event == "workflow_run" and rng.random() < 0.7 and isinstance(payload.get("workflow_run"), dict):
        payload["workflow_run"].update(display_title=run_title("da-" + "a" * 12 + "-0badf00d", "sm90"),
                                       path=".github/workflows/drift-audit-gpu.yml", event="workflow_dispatch")
        if isinstance(payload["workflow_run"].get("head_repository"), dict) and rng.random() < 0.8:
            payload["workflow_run"]["head_repository"]["full_name"] = payload["repository"]["full_name"]
    if event in ("check_run", "check_suite") and rng.random() < 0.5:
        body = payload.get(event)
        if isinstance(body, dict) and isinstance(body.get("app"), dict):
            body["app"]["id"] = APP_ID


def _forgeries(count: int) -> list[tuple[str, dict]]:
    rng = random.Random(SEED)
    forger = Forger(rng)
    out = []
    for event, schema_id in EVENTS:
        for _ in range(count):
            payload = forger.make(forger.docs[schema_id], schema_id)
            _steer(event, payload, rng)
            out.append((event, payload))
    rng.shuffle(out)
    return out


def _schema_valid(event: str, payload: dict) -> bool:
    try:
        validate(event, payload.get("action"), payload)
    except PayloadError:
        return False
    return True


def test_schema_valid_forgeries_are_answered_and_never_poison_the_queue(tmp_path):
    settings = BotSettings(app_id=APP_ID, webhook_secret=SECRET, db=str(tmp_path / "forged.db"))
    store = SqliteJobStore(settings.db)
    answers: Counter[tuple[str, int]] = Counter()
    valid = 0
    queued: set[str] = set()
    unknown_reruns = 0
    for i, (event, payload) in enumerate(_forgeries(PER_EVENT)):
        valid += _schema_valid(event, payload)
        body = json.dumps(payload).encode()
        answer = _intake(settings, store, event, f"forged-{i}", signature_of(SECRET, body), body)  # raises = a 500
        answers[(event, answer.status)] += 1
        assert answer.status in (202, 400, 409), (event, answer.body)
        if answer.status == 400:
            assert answer.body["field"].startswith("$"), answer.body
        unknown_reruns += answer.body.get("reason") == "a re-run of a check run this bot has no record of"
        if answer.status == 202 and "job" in answer.body:
            queued.add(event)
            row = store.get(answer.body["job"])
            assert row is not None and row.job is not None, answer.body
            _carries_what_the_payload_said(event, payload, row.job)
    assert valid > len(EVENTS) * PER_EVENT // 2, valid  # the forger writes what GitHub's schemas accept
    assert {"pull_request", "issue_comment", "merge_group", "workflow_run", "check_run"} <= queued, answers
    # a suite re-run names no check run: with none of ours on record for its commit, nothing is queued
    assert unknown_reruns > 0 and "check_suite" not in queued
    while (row := store.lease("fuzz", 30)) is not None:
        assert row.job is not None
        assert load_job(row.kind, 2, dump_job(row.job)) == row.job  # round-trips
        store.finish(row.id, "fuzz")
    assert store.jobs(DEAD) == []


def _carries_what_the_payload_said(event: str, payload: dict, job: Any) -> None:
    if event == "installation":
        return
    assert job.repo == payload["repository"]["full_name"]
    if isinstance(job, AuditJob) and event == "pull_request":
        pr = payload["pull_request"]
        assert (job.head_sha, job.base_sha, job.pr) == (pr["head"]["sha"], pr["base"]["sha"], pr["number"])
    if isinstance(job, CommandJob):
        assert job.body == payload["comment"]["body"] and job.comment_id == payload["comment"]["id"]
    if isinstance(job, CollectJob):
        assert job.run_id == payload["workflow_run"]["id"]
    if isinstance(job, RerunJob):  # only our own app's runs and suites are ever re-run
        assert payload[event]["app"]["id"] == APP_ID, payload[event]["app"]


def test_another_apps_check_run_or_suite_is_never_rerun():
    from bot.events import Ignored, read_delivery

    rng = random.Random(SEED + 1)
    forger = Forger(rng)
    for event in ("check_run", "check_suite"):
        schema_id = f"{event}$rerequested"
        for _ in range(40):
            payload = forger.make(forger.docs[schema_id], schema_id)
            payload[event]["app"]["id"] = APP_ID + 1
            try:
                decision = read_delivery(event, json.dumps(payload).encode(), app_id=APP_ID)
            except PayloadError:
                continue
            assert isinstance(decision, Ignored), decision
