"""Load and fault benchmark of the bot service, on loopback against the GitHub REST stand-in.

    PYTHONPATH=. python benchmarks/bot_load.py [--deliveries 1000] [--concurrency 8] [--audits 8] [--kills 5]

Three tables, each with its anchor measured in the same run:

1. intake: deliveries/s and p50/p99 ack latency of signed ``pull_request``
   webhooks, against ``GET /healthz`` on the same server (the HTTP floor);
2. kill -9: the service process is SIGKILLed mid-audit N times and restarted;
   every audit must complete exactly once (one comment, one concluded check
   run per head), against the same audits with no kills;
3. faults: 20 % of the stand-in's answers are 5xx or 403 secondary rate limits;
   every audit must still complete exactly once, against 0 % faults.

The service runs as ``python -m bot.cli serve`` in a child process, as deployed.
PyGithub's request pacing is set to 0 here (production keeps its defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.publish import COMMENT_MARKER  # noqa: E402
from bot.queue import SqliteJobStore  # noqa: E402
from bot.security import signature_of  # noqa: E402
from tests.ghstub import Fault, start_stub  # noqa: E402
from tests.gitrepo import commit, git, init_repo  # noqa: E402
from tests.webhooks import FIXTURES  # noqa: E402

SECRET = "bench-secret"
REPO = "octo-org/engine"
FIXTURE = FIXTURES / "pull_request.opened.json"


# --------------------------------------------------------------------------- fixtures


def make_repo(root: Path, prs: int) -> tuple[Path, str, list[str]]:
    """A base commit with an engine layout and one head commit per PR, each touching different pillars."""
    repo = init_repo(root / "engine-src")
    files = {
        "engine/weights/loader.py": "def load(path):\n    return {}\n",
        "engine/runtime/scheduler.py": "class Scheduler:\n    def step(self):\n        return 1\n",
        "engine/model/attention.py": "def mla(q, kv):\n    return q\n",
        "kernels/rmsnorm.py": "def rmsnorm(x):\n    return x\n",
    }
    base = commit(repo, files, "base")
    heads = []
    names = sorted(files)
    for i in range(prs):
        git(repo, "checkout", "-q", "-B", f"pr-{i}", base)
        rel = names[i % len(names)]
        (repo / rel).write_text(files[rel] + f"\n# change {i}\nVALUE_{i} = {i}\n")
        git(repo, "commit", "-q", "-am", f"pr {i}")
        heads.append(git(repo, "rev-parse", "HEAD"))
    git(repo, "checkout", "-q", "main")
    return repo, base, heads


def pr_payload(number: int, head: str, base: str) -> bytes:
    p = json.loads(FIXTURE.read_text())
    p["number"] = number
    p["installation"] = {"id": 1}
    p["repository"].update(full_name=REPO, name=REPO.split("/")[1], clone_url="")
    pr = p["pull_request"]
    pr["number"] = number
    pr["head"]["sha"], pr["base"]["sha"] = head, base
    pr["base"]["repo"] = dict(pr["base"]["repo"], full_name=REPO)
    pr["head"]["repo"] = dict(pr["head"]["repo"], full_name=REPO)
    return json.dumps(p).encode()


def headers(body: bytes, event: str = "pull_request") -> dict[str, str]:
    return {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": signature_of(SECRET, body),
        "Content-Type": "application/json",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """``drift-audit serve`` as a child process."""

    def __init__(self, work: Path, stub_url: str, state, *, workers: int, lease: float = 2.0, attempts: int = 12):
        key = work / "app.pem"
        key.write_text(state.private_key)
        self.db = work / "jobs.db"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.settings = work / "bot.toml"
        self.settings.write_text(
            f'app_id = {state.app_id}\nprivate_key_file = "{key}"\ngithub_url = "{stub_url}"\n'
            f'db = "{self.db}"\nmirrors = "{work / "mirrors"}"\nlease_seconds = {lease}\nretry_backoff = 0.1\n'
            f"max_attempts = {attempts}\nseconds_between_requests = 0\nseconds_between_writes = 0\n"
            f'http_backoff = 0.01\nhttp_retries = 8\npublic_url = "{self.url}"\n'
        )
        self.proc: subprocess.Popen | None = None
        self.log = open(work / "service.log", "ab")

    def start(self) -> float:
        t0 = time.perf_counter()
        env = dict(os.environ, DRIFT_AUDIT_WEBHOOK_SECRET=SECRET, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bot.cli",
                "serve",
                "--settings",
                str(self.settings),
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=self.log,
        )
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.05)

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.log.close()


# --------------------------------------------------------------------------- 1. intake


def hammer(url: str, n: int, concurrency: int, make) -> tuple[float, list[float], int]:
    """Send n requests with `concurrency` client threads; (wall s, latencies s, non-2xx count)."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    counter = iter(range(n))

    def client() -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                method, path, body, hdrs = make(i)
                t0 = time.perf_counter()
                r = c.request(method, path, content=body, headers=hdrs)
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    if r.status_code >= 300:
                        errors[0] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, latencies, errors[0]


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def bench_intake(work: Path, n: int, concurrency: int) -> list[tuple]:
    stub_url, state, stop = start_stub()
    svc = Service(work, stub_url, state, workers=0)
    svc.start()
    try:
        bodies = [pr_payload(1000 + i, f"{i:040x}", "f" * 40) for i in range(64)]
        # warm-up
        hammer(svc.url, 50, concurrency, lambda i: ("GET", "/healthz", None, {}))
        wall_h, lat_h, err_h = hammer(svc.url, n, concurrency, lambda i: ("GET", "/healthz", None, {}))

        def webhook(i: int):
            body = bodies[i % len(bodies)]
            return "POST", "/webhook", body, headers(body)

        wall_w, lat_w, err_w = hammer(svc.url, n, concurrency, webhook)
        queued = len(SqliteJobStore(str(svc.db)).jobs())
    finally:
        svc.stop()
        stop()
    rows = [
        ("GET /healthz (anchor)", n, n / wall_h, pct(lat_h, 50) * 1e3, pct(lat_h, 99) * 1e3, err_h, "-", 1.0),
        (
            "POST /webhook (signed PR)",
            n,
            n / wall_w,
            pct(lat_w, 50) * 1e3,
            pct(lat_w, 99) * 1e3,
            err_w,
            queued,
            (n / wall_w) / (n / wall_h),
        ),
    ]
    return rows


# --------------------------------------------------------------------------- 2 & 3. audits under kills / faults


def run_audits(work: Path, audits: int, *, kills: int = 0, fault_rate: float = 0.0, seed: int = 7) -> dict:
    work.mkdir(parents=True)
    repo, base, heads = make_repo(work, audits)
    stub_url, state, stop = start_stub()
    state.add_repo(REPO, str(repo))
    for i, head in enumerate(heads):
        state.add_pull(REPO, i + 1, head_sha=head, base_sha=base)
    state.fault = Fault(rate=fault_rate, kinds=(500, 502, 503, 403), retry_after=0, seed=seed)
    svc = Service(work, stub_url, state, workers=2)
    rng = random.Random(seed)
    done_kills = 0
    t0 = time.perf_counter()
    try:
        svc.start()
        for i, head in enumerate(heads):
            body = pr_payload(i + 1, head, base)
            r = httpx.post(svc.url + "/webhook", content=body, headers=headers(body), timeout=30)
            assert r.status_code == 202, r.text
        store = SqliteJobStore(str(svc.db))
        while done_kills < kills:
            time.sleep(rng.uniform(0.3, 1.5))
            if all(j.status in ("done", "failed") for j in store.jobs()):
                break  # nothing left in flight to kill
            svc.kill9()
            done_kills += 1
            svc.start()
        deadline = time.monotonic() + 300
        while not all(j.status in ("done", "failed") for j in store.jobs()):
            if time.monotonic() > deadline:
                raise RuntimeError("audits did not finish within 300 s")
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        jobs = store.jobs()
        store.close()
    finally:
        svc.stop()
        stop()
    once = 0
    for i, head in enumerate(heads):
        marked = [c for c in state.comments_on(REPO, i + 1) if c["body"].startswith(COMMENT_MARKER)]
        runs = state.check_runs_for(REPO, head)
        if len(marked) == 1 and len(runs) == 1 and runs[0]["status"] == "completed":
            once += 1
    return {
        "audits": audits,
        "kills": done_kills,
        "fault_rate": fault_rate,
        "wall": wall,
        "done": sum(j.status == "done" for j in jobs),
        "failed": sum(j.status == "failed" for j in jobs),
        "once": once,
        "attempts": sum(j.attempts for j in jobs),
        "faults": state.faults_injected,
        "requests": len(state.requests),
        "comment_posts": sum(1 for m, p in state.arrivals if m == "POST" and p.endswith("/comments")),
    }


def table(title: str, header: list[str], rows: list[tuple]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(h)), *(len(_fmt(r[i])) for r in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(str(h).ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(_fmt(v).ljust(w) for v, w in zip(r, widths)) + " |")


def _fmt(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deliveries", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--audits", type=int, default=8)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--fault-rate", type=float, default=0.2)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}; service = `python -m bot.cli serve`")
    with tempfile.TemporaryDirectory(prefix="bot-bench-") as tmp:
        work = Path(tmp)
        (work / "intake").mkdir()
        rows = bench_intake(work / "intake", args.deliveries, args.concurrency)
        table(
            f"1. intake on loopback ({args.deliveries} requests, {args.concurrency} concurrent clients)",
            ["endpoint", "requests", "req/s", "p50 ms", "p99 ms", "errors", "jobs queued", "rate vs anchor"],
            rows,
        )

        anchor = run_audits(work / "anchor", args.audits)
        killed = run_audits(work / "kills", args.audits, kills=args.kills)
        faulty = run_audits(work / "faults", args.audits, fault_rate=args.fault_rate)
        header = [
            "scenario",
            "audits",
            "kill -9",
            "faults injected",
            "API requests",
            "done",
            "failed",
            "exactly once",
            "comment POSTs",
            "attempts",
            "wall s",
            "wall vs anchor",
        ]

        def row(name: str, r: dict) -> tuple:
            return (
                name,
                r["audits"],
                r["kills"],
                r["faults"],
                r["requests"],
                r["done"],
                r["failed"],
                r["once"],
                r["comment_posts"],
                r["attempts"],
                r["wall"],
                r["wall"] / anchor["wall"],
            )

        table(
            "2./3. audits to completion (2 worker threads, lease 2 s)",
            header,
            [
                row("no kills, no faults (anchor)", anchor),
                row(f"kill -9 x{args.kills} mid-audit", killed),
                row(f"{args.fault_rate:.0%} injected 5xx/403", faulty),
            ],
        )
        ok = all(r["once"] == r["audits"] and r["failed"] == 0 for r in (anchor, killed, faulty))
        print(f"\nevery audit completed exactly once in every scenario: {'yes' if ok else 'NO'}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
