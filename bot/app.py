"""The webhook service: verify, record, enqueue, answer — well inside GitHub's 10 s.

The request path does no GitHub calls and no git work: it checks the HMAC,
records the delivery GUID and enqueues one job in a single transaction, then
wakes a worker. Everything slow happens in ``bot.worker``.
"""

from __future__ import annotations

import hmac
import json
import logging
from functools import lru_cache

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from bot.events import Ignored, job_for
from bot.queue import JobStore
from bot.security import page_key, verify_signature
from bot.settings import BotSettings

log = logging.getLogger("drift_audit.app")


class _TooLarge(Exception):
    pass


async def _read_capped(request: Request, cap: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


@lru_cache(maxsize=1)
def _pages() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("bot", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        undefined=jinja2.StrictUndefined,
    )


def create_app(settings: BotSettings, store: JobStore, service=None) -> Starlette:
    """``service`` (a ``bot.worker.Service``) is woken on each new job; without one, jobs wait in the store."""

    async def webhook(request: Request) -> JSONResponse:
        try:
            body = await _read_capped(request, settings.max_body_bytes)
        except _TooLarge:
            return JSONResponse({"error": f"payload over {settings.max_body_bytes} bytes"}, status_code=413)
        if not verify_signature(settings.webhook_secret, body, request.headers.get("x-hub-signature-256")):
            return JSONResponse({"error": "bad or missing X-Hub-Signature-256"}, status_code=401)
        event = request.headers.get("x-github-event", "")
        delivery = request.headers.get("x-github-delivery", "")
        if not event or not delivery:
            return JSONResponse({"error": "X-GitHub-Event and X-GitHub-Delivery are required"}, status_code=400)
        try:
            payload = json.loads(body)
            if not isinstance(payload, dict):
                raise ValueError("not an object")
            decision = job_for(event, payload, audit_drafts=settings.audit_drafts, app_id=settings.app_id or None)
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": f"malformed {event} payload: {exc}"[:300]}, status_code=400)
        job = None if isinstance(decision, Ignored) else decision
        new, job_id = await run_in_threadpool(store.accept, delivery, event, job, max_attempts=settings.max_attempts)
        if not new:
            return JSONResponse({"status": "duplicate", "delivery": delivery, "job": job_id}, status_code=200)
        if job is None:
            return JSONResponse({"status": "ignored", "reason": decision.reason}, status_code=202)
        if service is not None:
            service.wake()
        return JSONResponse({"status": "queued", "job": job_id}, status_code=202)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def audit_page(request: Request) -> HTMLResponse:
        """The check run's details link; it carries a key, so ids cannot be enumerated."""
        key = request.path_params["audit_id"]
        record = None
        given = request.query_params.get("key", "")
        if not hmac.compare_digest(given.encode(), page_key(settings.webhook_secret, key).encode()):
            return HTMLResponse(
                _pages().get_template("audit.html.j2").render(missing=key, record=None, audit=None, job=None),
                status_code=404,
            )
        if key.startswith("job-") and key[4:].isdigit():
            record = await run_in_threadpool(store.audit_for_job, int(key[4:]))
            job = await run_in_threadpool(store.get, int(key[4:]))
        else:
            record = await run_in_threadpool(store.audit, key)
            job = await run_in_threadpool(store.get, record.job_id) if record else None
        if record is None and job is None:
            return HTMLResponse(
                _pages().get_template("audit.html.j2").render(missing=key, record=None, audit=None, job=None),
                status_code=404,
            )
        audit = json.loads(record.audit_json) if record else None
        html = _pages().get_template("audit.html.j2").render(missing=None, record=record, audit=audit, job=job)
        return HTMLResponse(html)

    return Starlette(
        routes=[
            Route("/webhook", webhook, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/audits/{audit_id}", audit_page, methods=["GET"]),
        ]
    )
