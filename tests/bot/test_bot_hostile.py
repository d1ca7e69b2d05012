"""Intake under attack: ReDoS-shaped and 1 MB comments, wrong field types, deep nesting, unsigned floods, slow
clients and disconnects. The bot runs on loopback with the server settings ``drift-audit serve`` uses."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from tests.bot.conftest import SECRET, fixture_payload, installation_lite, pr_payload, signed

GITHUB_TIMEOUT = 10.0  # GitHub gives up on a delivery after 10 s and does not redeliver


def _comment(body: str, number: int = 4) -> dict:
    p = fixture_payload("issue_comment.created")
    p["installation"] = installation_lite(1)
    p["issue"]["pull_request"] = {"url": f"https://api.github.com/repos/o/r/pulls/{number}"}
    p["issue"]["number"] = number
    p["comment"]["body"] = body
    return p


def test_redos_comment_in_flight_does_not_stall_healthz_or_other_deliveries(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    hostile = [json.dumps(dict(_comment("/audit x" + " " * 65_000 + "y"), zen=i)).encode() for i in range(4)]
    answers: dict[str, float] = {}

    def timed(name: str, send) -> None:
        with httpx.Client(base_url=bot.url, timeout=GITHUB_TIMEOUT) as c:
            start = time.perf_counter()
            resp = send(c)
            answers[name] = time.perf_counter() - start
            answers[name + ":status"] = resp.status_code

    pr = json.dumps(pr_payload("opened", number=5, head="1" * 40, base="2" * 40)).encode()
    threads = [
        threading.Thread(target=timed, args=(f"redos{i}", lambda c, b=hostile[i]: c.post(
            "/webhook", content=b, headers=signed(b, "issue_comment")))) for i in range(4)
    ] + [
        threading.Thread(target=timed, args=("healthz", lambda c: c.get("/healthz"))),
        threading.Thread(target=timed, args=("pr", lambda c: c.post(
            "/webhook", content=pr, headers=signed(pr, "pull_request")))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers["healthz:status"] == 200 and answers["pr:status"] == 202
    assert all(answers[f"redos{i}:status"] == 202 for i in range(4)), {k: v for k, v in answers.items() if ":" in k}  # a command job; the worker answers help
    assert max(v for k, v in answers.items() if not k.endswith(":status")) < GITHUB_TIMEOUT / 2, answers


def test_one_megabyte_comment_is_answered_fast(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    body = json.dumps(_comment("/audit full\n" + "a " * (1 << 19))).encode()
    assert len(body) > 1 << 20
    start = time.perf_counter()
    resp = bot.http.post("/webhook", content=body, headers=signed(body, "issue_comment"))
    assert time.perf_counter() - start < 2.0
    assert resp.status_code == 202 and "65536" in resp.json()["reason"]
    assert bot.store.jobs() == []


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda p: p.update(number="2a"), "$.number"),
        (lambda p: p.update(installation=5), "$.installation"),
        (lambda p: p.update(repository="x"), "$.repository"),
        (lambda p: p["pull_request"]["head"].update(sha=7), "$.pull_request.head.sha"),
        (lambda p: p["pull_request"].pop("base"), "$.pull_request"),
        (lambda p: p["pull_request"].update(user="bob"), "$.pull_request.user"),
    ],
)
def test_wrong_field_types_answer_400_naming_the_field(bot_factory, mutate, field):
    make, _ = bot_factory
    bot = make(start_workers=False)
    payload = pr_payload("opened", number=5, head="1" * 40, base="2" * 40)
    mutate(payload)
    resp = bot.deliver("pull_request", payload)
    assert resp.status_code == 400, resp.text
    assert resp.json()["field"] == field and field in resp.json()["error"]
    assert bot.store.jobs() == []


def test_comment_user_as_a_string_and_deep_nesting_answer_400(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    bad = _comment("/audit")
    bad["comment"]["user"] = "bob"
    resp = bot.deliver("issue_comment", bad)
    assert resp.status_code == 400 and resp.json()["field"] == "$.comment.user"
    for depth in (100, 1_000, 100_000):
        deep = b'{"action": "opened", "x": ' + b"[" * depth + b"]" * depth + b"}"
        resp = bot.http.post("/webhook", content=deep, headers=signed(deep, "pull_request"))
        assert resp.status_code == 400 and "nested deeper" in resp.json()["error"], depth
    assert bot.http.get("/healthz").status_code == 200


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _status_of(sock: socket.socket) -> int:
    data = sock.recv(4096)
    return int(data.split(b" ", 2)[1]) if data else 0


def test_unsigned_bodies_are_refused_before_they_are_read(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    for signature in (None, "sha256=00", "sha1=" + "0" * 40, "sha256=" + "z" * 64):
        with _raw(bot.url) as sock:
            sig = f"X-Hub-Signature-256: {signature}\r\n" if signature else ""
            sock.sendall((f"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: ping\r\nX-GitHub-Delivery: d\r\n"
                          f"{sig}Content-Length: {25 * 1024 * 1024}\r\n\r\n").encode())
            start = time.perf_counter()
            assert _status_of(sock) == 401  # answered with none of the 25 MB sent
            assert time.perf_counter() - start < 2.0
    with _raw(bot.url) as sock:  # signed, but declaring more than GitHub ever sends
        sock.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: ping\r\nX-GitHub-Delivery: d\r\n"
                     b"X-Hub-Signature-256: sha256=" + b"0" * 64 + b"\r\nContent-Length: 26214401\r\n\r\n")
        assert _status_of(sock) == 413
    assert bot.store.deliveries() == 0


def test_slow_bodies_and_slow_headers_are_cut_off(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False, body_timeout=1.0, header_timeout=1.0)
    body = json.dumps(fixture_payload("ping")).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in signed(body, "ping").items())
    with _raw(bot.url) as sock:  # a byte of the body every 0.2 s
        sock.sendall(f"POST /webhook HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode())
        start = time.perf_counter()
        status = 0
        for byte in body:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            sock.settimeout(0.2)
            try:
                status = _status_of(sock)
                break
            except TimeoutError:
                continue
        assert status == 408 and time.perf_counter() - start < 4.0
    with _raw(bot.url) as sock:  # headers a byte at a time: the connection is closed
        start = time.perf_counter()
        closed = False
        for byte in b"POST /webhook HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200:
            try:
                sock.sendall(bytes([byte]))
                sock.settimeout(0.1)
                if sock.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert closed and time.perf_counter() - start < 4.0
    assert bot.http.get("/healthz").status_code == 200


def test_a_client_disconnect_is_not_an_error_traceback(bot_factory, caplog):
    make, _ = bot_factory
    bot = make(start_workers=False)
    body = json.dumps(fixture_payload("ping")).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in signed(body, "ping").items())
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            with _raw(bot.url) as sock:
                sock.sendall(f"POST /webhook HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
                             + body[:10])
            time.sleep(0.2)
        assert bot.http.get("/healthz").status_code == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert any("disconnected" in r.getMessage() for r in caplog.records)


def test_a_wrong_secret_is_still_refused_after_the_header_check(bot_factory):
    make, _ = bot_factory
    bot = make(start_workers=False)
    body = json.dumps(fixture_payload("ping")).encode()
    assert bot.http.post("/webhook", content=body, headers=signed(body, "ping", secret="nope")).status_code == 401
    assert bot.http.post("/webhook", content=body, headers=signed(body, "ping", secret=SECRET)).status_code == 202


def test_an_event_without_a_published_schema_is_checked_by_the_typed_reads():
    from bot.events import read_delivery
    from bot.payloads import PayloadError, has_schema

    assert not has_schema("installation_repositories", "added")
    good = {"action": "added", "installation": {"id": 3, "account": {"login": "octo-org"}},
            "repositories_added": [{"full_name": "octo-org/a"}], "repositories_removed": []}
    job = read_delivery("installation_repositories", json.dumps(good).encode())
    assert job.kind == "installation" and "octo-org/a" in job.note
    for field, value, where in (("repositories_added", "x", "$.repositories_added"),
                                ("installation", {"id": "3"}, "$.installation.id"),
                                ("repositories_added", [5], "$.repositories_added[0]")):
        bad = dict(good, **{field: value})
        with pytest.raises(PayloadError) as err:
            read_delivery("installation_repositories", json.dumps(bad).encode())
        assert err.value.field == where


def test_bodies_with_a_forged_signature_are_spooled_not_held_in_memory(bot_factory):
    import tracemalloc

    make, _ = bot_factory
    bot = make(start_workers=False)
    size, clients = 4 * 1024 * 1024, 6
    body = b'{"zen": "' + b"a" * size + b'"}'
    head = (f"POST /webhook HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: ping\r\nX-GitHub-Delivery: d\r\n"
            f"X-Hub-Signature-256: sha256={'0' * 64}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    statuses: list[int] = []

    def send() -> None:
        with _raw(bot.url) as sock:
            sock.sendall(head)
            sock.sendall(body)
            statuses.append(_status_of(sock))

    tracemalloc.start()
    try:
        threads = [threading.Thread(target=send) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert statuses == [401] * clients
    assert peak < clients * size / 2, f"peak {peak / 2**20:.0f} MiB for {clients} x {size / 2**20:.0f} MiB bodies"
