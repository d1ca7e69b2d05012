"""kill -9 of the real service process mid-audit: after a restart the audit completes once, posted once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bot.publish import COMMENT_MARKER
from bot.queue import SqliteJobStore
from tests.bot.conftest import REPO, SECRET, pr_payload, signed, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """``drift-audit serve`` in a child process, as deployed."""

    def __init__(self, tmp_path: Path, stub_url: str, state, **extra: float):
        key = tmp_path / "app.pem"
        key.write_text(state.private_key)
        self.db = tmp_path / "jobs.db"
        self.settings = tmp_path / "bot.toml"
        self._settings_text = (
            f'app_id = {state.app_id}\nprivate_key_file = "{key}"\ngithub_url = "{stub_url}"\n'
            f'db = "{self.db}"\nmirrors = "{tmp_path / "mirrors"}"\nlease_seconds = 1.5\nretry_backoff = 0.1\n'
            f"seconds_between_requests = 0\nseconds_between_writes = 0\nhttp_backoff = 0.01\nworkers = 1\n"
            + "".join(f"{k} = {v}\n" for k, v in extra.items())
        )
        self._use_port(_free_port())
        self.proc: subprocess.Popen | None = None
        self.log = tmp_path / "service.log"  # every start appends to it

    def _use_port(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.settings.write_text(self._settings_text + f'public_url = "{self.url}"\n')

    def log_tail(self, limit: int = 4000) -> str:
        return self.log.read_bytes()[-limit:].decode(errors="replace") if self.log.exists() else "(no log)"

    def start(self) -> None:
        for _ in range(3):
            try:
                return self._start()
            except AssertionError as exc:
                # Another process (parallel test workers) took the free port between its probe and the bind.
                if self.proc is None or self.proc.poll() is None or "address already in use" not in str(exc).lower():
                    raise
                self._use_port(_free_port())
        self._start()

    def _start(self) -> None:
        # The repo goes first on the import path; whatever the environment already has there (a
        # ``pip install --target`` of the dependencies, say) stays after it.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, DRIFT_AUDIT_WEBHOOK_SECRET=SECRET, PYTHONPATH=path)
        # The service's output goes to a file, never to an unread pipe that would block it once full.
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bot.cli", "serve", "--settings", str(self.settings), "--port", str(self.port)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=log,
            )

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the service exited with {self.proc.returncode} at start; "
                                     f"{self.log}:\n{self.log_tail()}")
            try:
                return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_for(up, timeout=60, interval=0.1)  # a loaded machine (many test workers) starts it slowly
        except AssertionError as exc:
            if "at start" in str(exc):
                raise
            raise AssertionError(f"{exc}; the service did not answer /healthz; {self.log}:\n{self.log_tail()}") from None

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill9()


@pytest.mark.parametrize("kill_at", ["POST /check-runs", "POST /issues/12/comments"])
def test_kill9_mid_audit_completes_exactly_once(tmp_path, ghstub, engine_repo, kill_at):
    stub_url, state = ghstub
    repo_path, base, head = engine_repo
    state.add_repo(REPO, str(repo_path))
    state.add_pull(REPO, 12, head_sha=head, base_sha=base)
    state.delays[kill_at] = 1.0  # the request reaches GitHub (and is applied) but the bot dies before the answer
    svc = ServiceProcess(tmp_path, stub_url, state)
    svc.start()
    try:
        body = pr_payload("opened", number=12, head=head, base=base)
        raw = json.dumps(body).encode()
        assert httpx.post(svc.url + "/webhook", content=raw, headers=signed(raw, "pull_request")).status_code == 202
        method, fragment = kill_at.split(" ", 1)
        wait_for(lambda: state.arrived(method, fragment), timeout=30)
        svc.kill9()
        del state.delays[kill_at]
        time.sleep(1.1)  # let the stand-in apply the orphaned request
        svc.start()
        store = SqliteJobStore(str(svc.db))
        wait_for(lambda: store.jobs()[0].status == "done", timeout=60)
        (job,) = store.jobs()
        assert job.attempts == 2
        marked = [c for c in state.comments_on(REPO, 12) if c["body"].startswith(COMMENT_MARKER)]
        assert len(marked) == 1
        (run,) = state.check_runs_for(REPO, head)
        assert run["status"] == "completed" and job.check_run_id == run["id"]
        store.close()
    finally:
        svc.stop()
