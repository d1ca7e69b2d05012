"""The webhook service: verify, record, enqueue, answer — well inside GitHub's 10 s.

The event loop only moves bytes: headers are checked before the body is read
(a missing or malformed signature, an oversized declared length), the body is
read against a size cap and a deadline, and everything else (the HMAC, JSON,
GitHub's schema, building the job, the database) runs in a worker thread, so
no payload can stall ``/healthz`` or the next delivery. Comment markdown is
parsed later, by the worker. The request path does no GitHub calls and no git
work.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import tempfile
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, BinaryIO

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from bot.events import Ignored, read_delivery
from bot.payloads import PayloadError
from bot.queue import JobRow, JobStore, ReplayedDelivery
from bot.security import page_key, signature_matches, verify_signature
from bot.settings import BotSettings
from checks.model import Audit, from_json

log = logging.getLogger("drift_audit.app")
_SIGNATURE = re.compile(r"^sha256=[0-9a-fA-F]{64}$")


class _TooLarge(Exception):
    pass


async def _read_capped(request: Request, cap: int, in_memory: int) -> BinaryIO:
    """The body, spooled: up to ``in_memory`` bytes in memory, the rest in a temporary file, so bodies with a
    forged signature cost disk for a moment, not memory (16 unsigned 25 MB bodies would be 400 MB)."""
    spool = tempfile.SpooledTemporaryFile(max_size=in_memory)
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise _TooLarge
            spool.write(chunk)
    except BaseException:
        spool.close()
        raise
    return spool  # type: ignore[return-value]


@dataclass
class _Answer:
    status: int
    body: dict[str, Any]
    queued: bool = False


def _intake(settings: BotSettings, store: JobStore, event: str, delivery: str, signature: str, body: bytes) -> _Answer:
    """Everything after the bytes arrive; runs in a worker thread, never on the event loop."""
    if not verify_signature(settings.webhook_secret, body, signature):
        return _Answer(401, {"error": "X-Hub-Signature-256 does not match the body"})
    return _decide(settings, store, event, delivery, body)


def _intake_spooled(settings: BotSettings, store: JobStore, event: str, delivery: str, signature: str,
                    spool: BinaryIO) -> _Answer:
    """``_intake`` for a spooled body: the HMAC is checked block by block, and only GitHub's bodies are loaded."""
    try:
        spool.seek(0)
        if not signature_matches(settings.webhook_secret, iter(lambda: spool.read(1 << 20), b""), signature):
            return _Answer(401, {"error": "X-Hub-Signature-256 does not match the body"})
        spool.seek(0)
        return _decide(settings, store, event, delivery, spool.read())
    finally:
        spool.close()


def _decide(settings: BotSettings, store: JobStore, event: str, delivery: str, body: bytes) -> _Answer:
    try:
        decision = read_delivery(event, body, audit_drafts=settings.audit_drafts, app_id=settings.app_id or None)
    except PayloadError as exc:
        return _Answer(400, {"error": f"malformed {event} payload: {exc}"[:500], "field": exc.field[:200]})
    job = None if isinstance(decision, Ignored) else decision
    try:
        new, job_id = store.accept(delivery, event, job, max_attempts=settings.max_attempts,
                                   body_sha=hashlib.sha256(body).hexdigest())
    except ReplayedDelivery as exc:
        return _Answer(409, {"error": f"{exc}; a replayed delivery is not acted on"})
    if not new:
        return _Answer(200, {"status": "duplicate", "delivery": delivery, "job": job_id})
    if isinstance(decision, Ignored):
        return _Answer(202, {"status": "ignored", "reason": decision.reason})
    if job_id is None:
        reason = "a re-run of a check run this bot has no record of" if event in ("check_run", "check_suite") \
            else "a push older than the pull request's recorded head"
        return _Answer(202, {"status": "ignored", "reason": reason})
    return _Answer(202, {"status": "queued", "job": job_id}, queued=True)


def _job_view(row: JobRow | None) -> SimpleNamespace | None:
    """What the details page shows of a job, including one that was dead-lettered (no typed job)."""
    if row is None:
        return None
    trigger = row.job.trigger if row.job is not None else row.kind
    return SimpleNamespace(
        id=row.id, status=row.status, attempts=row.attempts, max_attempts=row.max_attempts,
        superseded_by=row.superseded_by, error=row.error or row.result,
        job=SimpleNamespace(kind=row.kind, trigger=trigger),
    )


def create_app(settings: BotSettings, store: JobStore, service: Any = None) -> Starlette:
    """``service`` (a ``bot.worker.Service``) is woken on each new job; without one, jobs wait in the store."""

    async def webhook(request: Request) -> Response:
        signature = request.headers.get("x-hub-signature-256", "")
        if not _SIGNATURE.match(signature):  # before a byte of the body is read
            return JSONResponse({"error": "missing or malformed X-Hub-Signature-256 (sha256=<64 hex>)"},
                                status_code=401)
        event = request.headers.get("x-github-event", "")
        delivery = request.headers.get("x-github-delivery", "")
        if not event or not delivery or len(event) > 100 or len(delivery) > 100:
            return JSONResponse({"error": "X-GitHub-Event and X-GitHub-Delivery are required"}, status_code=400)
        cap = settings.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            return JSONResponse({"error": f"payload over {cap} bytes"}, status_code=413)
        try:
            spool = await asyncio.wait_for(_read_capped(request, cap, settings.body_in_memory), settings.body_timeout)
        except _TooLarge:
            return JSONResponse({"error": f"payload over {cap} bytes"}, status_code=413)
        except TimeoutError:
            return JSONResponse({"error": f"body not received within {settings.body_timeout:g} s"}, status_code=408,
                                headers={"connection": "close"})
        except ClientDisconnect:
            log.info("delivery %s: the sender disconnected before the body was complete", delivery[:100])
            return Response(status_code=400)
        answer = await run_in_threadpool(_intake_spooled, settings, store, event, delivery, signature, spool)
        if answer.queued and service is not None:
            service.wake()
        return JSONResponse(answer.body, status_code=answer.status)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def audit_page(request: Request) -> HTMLResponse:
        """The check run's details link; it carries a key, so ids cannot be enumerated."""
        from runner.report.html import details_page

        key = request.path_params["audit_id"]
        given = request.query_params.get("key", "")
        if not hmac.compare_digest(given.encode(), page_key(settings.webhook_secret, key).encode()):
            return HTMLResponse(details_page(None, missing=key[:100]), status_code=404)
        if key.startswith("job-") and key[4:].isdigit() and len(key) < 24:
            record = await run_in_threadpool(store.audit_for_job, int(key[4:]))
            job = _job_view(await run_in_threadpool(store.get, int(key[4:])))
        else:
            record = await run_in_threadpool(store.audit, key)
            job = _job_view(await run_in_threadpool(store.get, record.job_id)) if record else None
        if record is None and job is None:
            return HTMLResponse(details_page(None, missing=key[:100]), status_code=404)
        audit = from_json(Audit, record.audit_json) if record else None
        return HTMLResponse(await run_in_threadpool(details_page, audit, record=record, job=job))

    return Starlette(
        routes=[
            Route("/webhook", webhook, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/audits/{audit_id}", audit_page, methods=["GET"]),
        ]
    )
