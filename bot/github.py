"""PyGithub clients for a GitHub App: JWT → installation token, refreshed before it expires.

Tokens are cached per installation and treated as opaque strings (GitHub is
changing their format and length). ``base_url`` points at GitHub Enterprise
when set.

Two things follow GitHub's published guidance rather than PyGithub's defaults:

- **Pacing is per installation, process-wide.** Each job builds its own
  client, so PyGithub's per-client spacing let N workers write N times as fast
  as configured. One ``Pacer`` per (API root, installation) hands out request
  slots to every client of that installation, in order.
- **Retries do what GitHub asks.** A rate-limited answer (403 or 429) is retried
  after ``Retry-After`` when given, after ``x-ratelimit-reset`` when the primary
  limit is spent, and after at least a minute otherwise (secondary limits).
  Those answers mean the request was not applied, so POSTs are retried too. A
  POST that failed in a way that may have landed (5xx, a read timeout) is never
  resent blindly; ``bot.publish`` checks whether it landed first. The sleep and
  the clock are injectable, so tests move a stand-in's clock instead of waiting.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from github import Auth, Github, GithubIntegration, GithubRetry, RateLimitExceededExceedsMaxWait
from github.Auth import Auth as _AuthBase
from github.Requester import Requester
from urllib3.util.retry import Retry

from bot.settings import BotSettings

IDEMPOTENT_METHODS = ("GET", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE")
WRITE_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})
SECONDARY_WAIT = 60.0  # GitHub: without Retry-After, "wait for at least one minute before retrying"
RATE_LIMITED = (403, 429)

Sleep = Callable[[float], None]
Clock = Callable[[], float]


@dataclass
class _Token:
    value: str
    expires_at: float  # epoch seconds


# --------------------------------------------------------------------------- pacing


class Pacer:
    """Request slots for one installation, shared by every client and thread of this process.

    A caller reserves the next slot under the lock and sleeps outside it, so
    concurrent callers queue up at the configured spacing instead of all
    seeing the same "last request" and firing together.
    """

    def __init__(self, between_requests: float, between_writes: float, *, sleep: Sleep = time.sleep,
                 clock: Clock = time.monotonic):
        self.between_requests, self.between_writes = between_requests, between_writes
        self._sleep, self._clock = sleep, clock
        self._lock = threading.Lock()
        self._last_any = float("-inf")
        self._last_write = float("-inf")

    def wait(self, write: bool) -> float:
        """Block until this request may go; returns the seconds waited."""
        with self._lock:
            now = self._clock()
            slot = max(now, self._last_any + self.between_requests)
            if write:
                slot = max(slot, self._last_write + self.between_writes)
                self._last_write = slot
            self._last_any = slot
        delay = slot - now
        if delay > 0:
            self._sleep(delay)
        return max(delay, 0.0)


_PACERS: dict[tuple[str, int], Pacer] = {}
_PACERS_LOCK = threading.Lock()


def pacer_for(github_url: str, installation_id: int, settings: BotSettings, *, sleep: Sleep = time.sleep) -> Pacer:
    """The process-wide pacer of one installation (created on first use, then shared)."""
    key = (github_url, installation_id)
    with _PACERS_LOCK:
        pacer = _PACERS.get(key)
        if pacer is None:
            pacer = _PACERS[key] = Pacer(settings.seconds_between_requests, settings.seconds_between_writes,
                                         sleep=sleep)
        else:  # the latest settings win (a test or a reload may change them)
            pacer.between_requests = settings.seconds_between_requests
            pacer.between_writes = settings.seconds_between_writes
        return pacer


def _verb_of_request(default: str = "POST") -> str:
    """The HTTP method of the request PyGithub is authenticating.

    PyGithub asks its ``Auth`` for the header from the one function every
    request passes through, whose ``verb`` argument names the method; that is
    the only per-request hook it offers. When it cannot be found (a PyGithub
    that changed), the request is treated as a write: slower, never faster.
    """
    frame = sys._getframe(1)
    for _ in range(4):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            break
        verb = frame.f_locals.get("verb")
        if isinstance(verb, str) and verb in {"GET", "HEAD", *WRITE_METHODS}:
            return verb
    return default


class _InstallationAuth(_AuthBase):
    """Authorization that asks the token cache on every request (a long audit never uses a stale token) and
    takes the installation's next request slot first."""

    def __init__(self, app: GitHubApp, installation_id: int, pacer: Pacer | None = None):
        self._app, self._installation_id, self._pacer = app, installation_id, pacer

    @property
    def token_type(self) -> str:
        return "token"

    @property
    def token(self) -> str:
        return self._app.installation_token(self._installation_id)

    def authentication(self, headers: dict) -> None:
        if self._pacer is not None:
            self._pacer.wait(write=_verb_of_request() in WRITE_METHODS)
        super().authentication(headers)


# --------------------------------------------------------------------------- retries


def rate_limit_wait(status: int, headers: Any, body: bytes | str | None, *, clock: Clock = time.time,
                    secondary_wait: float = SECONDARY_WAIT) -> float | None:
    """Seconds GitHub asks a client to wait before resending, or None when the answer is no rate limit.

    ``Retry-After`` wins; a spent primary limit (``x-ratelimit-remaining: 0``) waits until
    ``x-ratelimit-reset``; any other rate-limit answer is a secondary limit: at least ``secondary_wait``.
    """
    if status not in RATE_LIMITED:
        return None
    retry_after = headers.get("Retry-After")
    if retry_after is not None and str(retry_after).strip().isdigit():
        return float(retry_after)
    if str(headers.get("x-ratelimit-remaining", "")).strip() == "0":
        reset = str(headers.get("x-ratelimit-reset", "")).strip()
        if reset.isdigit():
            return max(int(reset) - clock(), 0.0) + 1.0  # the reset happens somewhere inside that second
        return secondary_wait
    if status == 429:
        return secondary_wait
    try:
        message = json.loads(body or b"{}").get("message", "")
    except (ValueError, AttributeError):
        message = ""
    if isinstance(message, str) and Requester.isRateLimitError(message):
        return secondary_wait
    return None  # a plain 403 (permissions, ownership): resending cannot help


class GitHubRetry(GithubRetry):
    """``GithubRetry`` with GitHub's own waiting rules, POST-safety and an injectable sleep and clock."""

    def __init__(self, *, sleep: Sleep = time.sleep, clock: Clock = time.time,
                 secondary_rate_wait: float = SECONDARY_WAIT, resend_posts: bool = False, **kwargs: Any):
        forced = list(kwargs.pop("status_forcelist", range(500, 600)))
        kwargs["status_forcelist"] = sorted(set(forced) | {429})  # GithubRetry adds 403
        super().__init__(secondary_rate_wait=secondary_rate_wait, **kwargs)
        self._sleeper, self._clock = sleep, clock
        self.resend_posts = resend_posts  # True only where a repeated POST is harmless (minting a token)
        self._rate_wait: float | None = None

    def new(self, **kw: Any) -> GitHubRetry:
        kw.update(sleep=self._sleeper, clock=self._clock, resend_posts=self.resend_posts)
        return super().new(**kw)

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if method == "POST" and not self.resend_posts and status_code not in RATE_LIMITED:
            return False  # a 5xx POST may have been applied; the caller checks before sending it again
        return super().is_retry(method, status_code, has_retry_after)

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None):
        if method == "POST" and not self.resend_posts and error is not None and not self._is_connection_error(error):
            raise error.with_traceback(_stacktrace)  # the POST may have reached GitHub: never resend it blindly
        if response is None or response.status not in RATE_LIMITED:
            return super().increment(method, url, response, error, _pool, _stacktrace)
        body = self.get_content(response, url or "") if response.status == 403 else b""
        wait = rate_limit_wait(response.status, response.headers, body, clock=self._clock,
                               secondary_wait=self.secondary_rate_wait)
        if wait is None:
            raise Requester.createException(response.status, dict(response.headers), _json(body))
        if self.max_rate_limit_wait is not None and wait > self.max_rate_limit_wait:
            raise RateLimitExceededExceedsMaxWait(response.status, _json(body), dict(response.headers), wait=wait)
        retry = Retry.increment(self, method, url, response, error, _pool, _stacktrace)  # count it; raise when spent
        assert isinstance(retry, GitHubRetry)
        retry._rate_wait = max(wait, retry.get_backoff_time())
        return retry

    def sleep(self, response=None) -> None:
        wait = self._rate_wait
        if wait is None and response is not None and self.respect_retry_after_header:
            wait = self.get_retry_after(response)
        if wait is None:
            wait = self.get_backoff_time()
        if wait > 0:
            self._sleeper(wait)


def _json(body: bytes | str | None) -> Any:
    try:
        return json.loads(body or b"{}")
    except ValueError:
        return {"message": body.decode(errors="replace") if isinstance(body, bytes) else body}


# --------------------------------------------------------------------------- the app


class GitHubApp:
    def __init__(self, settings: BotSettings, *, sleep: Sleep = time.sleep, clock: Clock = time.time):
        settings.require_app()
        self.settings = settings
        self._sleep, self._clock = sleep, clock
        self._tokens: dict[int, _Token] = {}
        self._issued: list[str] = []  # every token this process minted, newest last: redacted from error text
        self._lock = threading.Lock()
        self._app_auth = Auth.AppAuth(settings.app_id, settings.private_key)

    def retry(self, *, post: bool = False) -> GitHubRetry:
        """Bounded retries; POST always retries rate-limit answers, and anything else only with ``post=True``
        (token requests, where minting twice is harmless)."""
        s = self.settings
        return GitHubRetry(
            total=s.http_retries,
            backoff_factor=s.http_backoff,
            backoff_max=30,
            max_rate_limit_wait=s.max_rate_limit_wait,
            allowed_methods=frozenset({*IDEMPOTENT_METHODS, "POST"}),
            sleep=self._sleep,
            clock=self._clock,
            resend_posts=post,
        )

    def integration(self) -> GithubIntegration:
        return GithubIntegration(
            auth=self._app_auth,
            base_url=self.settings.github_url,
            retry=self.retry(post=True),
            seconds_between_requests=self.settings.seconds_between_requests,
            seconds_between_writes=self.settings.seconds_between_writes,
        )

    def installation_token(self, installation_id: int) -> str:
        margin = self.settings.token_refresh_margin
        with self._lock:
            tok = self._tokens.get(installation_id)
            if tok is None or tok.expires_at - margin <= time.time():
                auth = self.integration().get_access_token(installation_id)
                tok = _Token(auth.token, auth.expires_at.timestamp())
                self._tokens[installation_id] = tok
                self._issued = [*self._issued[-255:], tok.value]
            return tok.value

    def issued_tokens(self) -> list[str]:
        """Installation tokens minted by this process (the last 256), for ``bot.security.Redactor``."""
        with self._lock:
            return list(self._issued)

    def installation_for(self, repo: str) -> int:
        owner, name = repo.split("/", 1)
        return self.integration().get_repo_installation(owner, name).id

    def pacer(self, installation_id: int) -> Pacer:
        return pacer_for(self.settings.github_url, installation_id, self.settings, sleep=self._sleep)

    def client(self, installation_id: int) -> Github:
        """A client for one job; its requests share the installation's process-wide pacing."""
        return Github(
            auth=_InstallationAuth(self, installation_id, self.pacer(installation_id)),
            base_url=self.settings.github_url,
            retry=self.retry(),
            seconds_between_requests=None,  # paced by the installation's Pacer instead
            seconds_between_writes=None,
            timeout=30,
        )
