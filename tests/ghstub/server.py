"""Serve the stand-in with uvicorn on a free loopback port, in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from tests.ghstub.app import build_app
from tests.ghstub.state import StubState


def serve_in_thread(app, *, host: str = "127.0.0.1") -> tuple[str, Callable[[], None]]:
    """Start ``app`` on a free port; return its root URL and a stop function."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"uvicorn:{port}")
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("HTTP server did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()

    return f"http://{host}:{port}", stop


def start_stub(state: StubState | None = None, *, prefix: str = "") -> tuple[str, StubState, Callable[[], None]]:
    """(base_url, state, stop). Pass ``base_url`` to PyGithub as ``base_url``; ``prefix="/api/v3"`` mimics GHE."""
    state = state or StubState()
    root, stop = serve_in_thread(build_app(state, prefix=prefix))
    return root + prefix, state, stop
