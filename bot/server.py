"""The HTTP server as deployed: uvicorn with bounded waits for a request that is still arriving.

uvicorn has a keep-alive timeout but none for a request whose headers are
still arriving; ``GuardedH11`` adds one (``header_timeout``, counted from the
request's first byte, or from the connection's opening), and the app bounds
the body (``body_timeout``), so a client sending a byte at a time holds a
connection for seconds, not minutes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from bot.settings import BotSettings


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers do not arrive in time."""

    header_timeout = 5.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if not self._waiting_for_headers():
            self._disarm()
        elif self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _expire(self) -> None:
        self._header_deadline = None
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app: Any, settings: BotSettings, host: str, port: int) -> uvicorn.Config:
    """Bounded header and keep-alive waits, bounded header size."""
    protocol = type("GuardedH11", (GuardedH11,), {"header_timeout": settings.header_timeout})
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, http=protocol,
        timeout_keep_alive=5, h11_max_incomplete_event_size=64 * 1024,
    )
