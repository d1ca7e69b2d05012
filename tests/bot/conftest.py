"""Fixtures for the bot tests: a real git repo, the GitHub stand-in, and the bot served on loopback."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from bot.security import signature_of
from checks.model import Results, SuiteResult
from runner.actions import artifact_name, run_title
from tests.ghstub.fixtures import ghstub  # noqa: F401  (fixture)
from tests.gitrepo import commit, git, init_repo
from tests.webhooks import FIXTURES

SECRET = "It's a Secret to Everybody"
RESULTS_KEY = "the bot's results key"  # DRIFT_AUDIT_RESULTS_KEY: GPU results are verified under it
REPO = "octo-org/octo-repo"


def fixture_payload(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def check_run_pr(number: int, head: str, base: str, repo: str = REPO) -> dict:
    """One entry of ``check_run.pull_requests`` as GitHub sends it."""
    ref = {"id": 1296269, "url": f"https://api.github.com/repos/{repo}", "name": repo.split("/")[1]}
    return {
        "url": f"https://api.github.com/repos/{repo}/pulls/{number}", "id": 1000 + number, "number": number,
        "head": {"ref": "feature", "sha": head, "repo": ref}, "base": {"ref": "main", "sha": base, "repo": ref},
    }


def signed_results(repo: str, label: str, results) -> dict[str, str | bytes]:
    """The artifact files the GPU workflow's recording step uploads: results.json and its signature."""
    from checks.model import to_json
    from runner import signing

    body = to_json(results).encode()
    dispatch = signing.Dispatch(repo, results.audit_id, label, results.head_sha)
    return {"results.json": body, signing.SIG_FILE: signing.sign(body, signing.repo_key(RESULTS_KEY, repo), dispatch)}


def answer_dispatches(state, outcome: str = "failed") -> list[dict]:
    """Each dispatch gets a workflow run whose signed results say ``outcome`` for the sm90 loader suite; the
    test delivers its ``workflow_run`` event. Returns the runs, in dispatch order."""
    runs: list[dict] = []

    def on_dispatch(st, record):
        inputs = record["inputs"]
        run = st.add_run(REPO, head_sha=inputs["head_sha"], display_title=run_title(inputs["audit_id"], inputs["label"]))
        results = Results(inputs["audit_id"], inputs["head_sha"], [SuiteResult("parity-loader", "sm90", outcome)])
        st.add_artifact(run["id"], artifact_name(inputs["audit_id"], inputs["label"]),
                        signed_results(REPO, inputs["label"], results))
        runs.append(run)

    state.on_dispatch = on_dispatch
    return runs


def installation_lite(installation_id: int = 1) -> dict:
    """The ``installation`` object GitHub puts in an app's webhook payloads (both fields are required)."""
    return {"id": installation_id, "node_id": f"MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9u{installation_id}"}


@pytest.fixture
def engine_repo(tmp_path):
    """A small engine-shaped repo: base on main, a PR head that touches the weight loader and the scheduler."""
    repo = init_repo(tmp_path / "engine-src")
    base = commit(
        repo,
        {
            "engine/weights/loader.py": "def load(path):\n    return {}\n",
            "engine/runtime/scheduler.py": "class Scheduler:\n    def step(self):\n        return 1\n",
            "README.md": "engine\n",
        },
        "base",
    )
    git(repo, "checkout", "-q", "-b", "feature")
    head = commit(
        repo,
        {
            "engine/weights/loader.py": "def load(path):\n    scale = 1\n    return {'scale': scale}\n",
            "engine/runtime/scheduler.py": "class Scheduler:\n    def step(self):\n        return 2\n",
        },
        "touch loader and scheduler",
    )
    return repo, base, head


def signed(body: bytes, event: str, delivery: str | None = None, secret: str = SECRET) -> dict:
    return {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": signature_of(secret, body),
        "Content-Type": "application/json",
    }


def pr_payload(
    action: str,
    *,
    number: int,
    head: str,
    base: str,
    repo: str = REPO,
    clone_url: str = "",
    installation: int = 1,
    draft: bool = False,
    fork: str | None = None,
    association: str = "MEMBER",
) -> dict:
    """The real pull_request fixture, re-pointed at our repo and commits."""
    name = f"pull_request.{action}"
    p = fixture_payload(name if (FIXTURES / f"{name}.json").exists() else "pull_request.opened")
    p["action"] = action
    if action == "synchronize":
        p["after"] = head
    p["number"] = number
    p["installation"] = installation_lite(installation)
    p["repository"].update(full_name=repo, name=repo.split("/")[1], clone_url=clone_url)
    pr = p["pull_request"]
    pr.update(number=number, draft=draft, author_association=association)
    pr["head"]["sha"], pr["base"]["sha"] = head, base
    pr["base"]["repo"] = dict(pr["base"]["repo"], full_name=repo)
    pr["head"]["repo"] = dict(pr["head"]["repo"], full_name=fork or repo)
    return p


def serve_deployed(app, settings) -> tuple[str, Callable[[], None]]:
    """``app`` on a free loopback port with the server settings ``drift-audit serve`` uses (bot.server)."""
    import uvicorn

    from bot.server import uvicorn_config

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, settings, "127.0.0.1", port))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"bot:{port}")
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), timeout=10, interval=0.01)
    if not server.started:
        raise RuntimeError("the bot's HTTP server did not start")

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()

    return f"http://127.0.0.1:{port}", stop


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


class Bot:
    """The bot served on loopback against the stand-in, with its store and worker pool."""

    def __init__(
        self, tmp_path: Path, stub_url: str, state, *, workers: int = 1, start_workers: bool = True, **overrides
    ):
        from bot.app import create_app
        from bot.queue import SqliteJobStore
        from bot.settings import BotSettings
        from bot.worker import Service

        self.state = state
        values = dict(
            app_id=state.app_id,
            private_key=state.private_key,
            webhook_secret=SECRET,
            github_url=stub_url,
            db=str(tmp_path / "jobs.db"),
            mirrors=str(tmp_path / "mirrors"),
            lease_seconds=5,
            retry_backoff=0.05,
            seconds_between_requests=0,
            seconds_between_writes=0,
            http_backoff=0.01,
            workers=workers,
            results_key=RESULTS_KEY,
        )
        values.update(overrides)
        self.settings = BotSettings(**values)
        self.store = SqliteJobStore(self.settings.db)
        self.service = Service(self.settings, self.store)
        self.url, self._stop_http = serve_deployed(create_app(self.settings, self.store, self.service), self.settings)
        self.settings.public_url = self.url
        if start_workers:
            self.service.start()
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def deliver(self, event: str, payload: dict | bytes, delivery: str | None = None) -> httpx.Response:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return self.http.post("/webhook", content=body, headers=signed(body, event, delivery))

    def settle(self, timeout: float = 60.0) -> None:
        """Wait until no job is queued or leased."""
        wait_for(lambda: not self.store.jobs("queued") and not self.store.jobs("leased"), timeout)

    def close(self) -> None:
        self.http.close()
        self.service.stop()
        self._stop_http()
        self.store.close()


@pytest.fixture
def bot_factory(tmp_path, ghstub):  # noqa: F811
    base_url, state = ghstub
    made: list[Bot] = []

    def make(**kw) -> Bot:
        b = Bot(tmp_path, base_url, state, **kw)
        made.append(b)
        return b

    yield make, state
    for b in made:
        b.close()


GPU_CONFIG = """\
[[suite]]
id = "parity-loader"
kind = "parity"
command = "pytest tests/test_loader.py"
runners = ["sm90"]
paths = ["engine/weights/**"]
"""


@pytest.fixture
def gpu_repo(tmp_path):
    """A repo whose base config declares an sm90 suite that the PR head's loader change selects."""
    repo = init_repo(tmp_path / "gpu-src")
    base = commit(
        repo,
        {".github/drift-audit.toml": GPU_CONFIG, "engine/weights/loader.py": "def load(path):\n    return {}\n"},
        "base",
    )
    git(repo, "checkout", "-q", "-b", "feature")
    head = commit(repo, {"engine/weights/loader.py": "def load(path):\n    return {'w': 1}\n"}, "loader")
    return repo, base, head


def workflow_run_payload(run: dict, *, repo: str = REPO, installation: int = 1) -> dict:
    """The real workflow_run fixture, re-pointed at a run the stand-in holds."""
    p = fixture_payload("workflow_run.completed")
    p["installation"] = installation_lite(installation)
    p["repository"]["full_name"] = repo
    p["workflow_run"].update({k: run[k] for k in ("id", "head_sha", "display_title", "path", "status", "conclusion",
                                                  "event")})
    p["workflow_run"]["head_repository"] = dict(p["workflow_run"]["head_repository"], full_name=repo)
    return p
