"""The vendored webhook schemas are GitHub's, unchanged, and cover every event and action the bot acts on."""

from __future__ import annotations

from importlib import resources

import pytest

from bot.events import ACTED_ON
from bot.payloads import has_schema, validate
from tests.bot.conftest import fixture_payload
from tests.webhooks import FIXTURES

UPSTREAM = FIXTURES.parent / "github-webhook-schemas" / "api.github.com"


def _vendored() -> dict[str, bytes]:
    return {e.name: e.read_bytes() for e in resources.files("bot.schemas").iterdir() if e.name.endswith(".json")}


def test_vendored_schemas_are_byte_identical_to_upstream():
    if not UPSTREAM.is_dir():
        pytest.skip(f"{UPSTREAM} is not beside this checkout")
    vendored = _vendored()
    assert len(vendored) == 40
    for name, data in vendored.items():
        assert (UPSTREAM / name.replace(".", "/", 1)).read_bytes() == data, name


def test_every_acted_on_event_has_a_schema_and_githubs_examples_pass_it():
    for event, actions in ACTED_ON.items():
        for action in actions:
            assert has_schema(event, action), (event, action)
    assert has_schema("ping", None) and has_schema("installation", "created")
    for name in ("pull_request.opened", "pull_request.synchronize", "pull_request.reopened",
                 "pull_request.ready_for_review", "issue_comment.created", "check_run.rerequested",
                 "merge_group.checks_requested", "workflow_run.completed", "installation.created", "ping"):
        payload = fixture_payload(name)
        event = name.split(".")[0]
        validate(event, payload.get("action"), payload)  # raises PayloadError on any mismatch
