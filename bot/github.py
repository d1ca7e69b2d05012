"""PyGithub clients for a GitHub App: JWT → installation token, refreshed before it expires.

Tokens are cached per installation and treated as opaque strings (GitHub is
changing their format and length). Every client carries a bounded
``GithubRetry`` so 5xx answers and secondary rate limits are retried a few
times, never forever. ``base_url`` points at GitHub Enterprise when set.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from github import Auth, Github, GithubIntegration, GithubRetry
from github.Auth import Auth as _AuthBase

from bot.settings import BotSettings

IDEMPOTENT_METHODS = ("GET", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE")


@dataclass
class _Token:
    value: str
    expires_at: float  # epoch seconds


class _InstallationAuth(_AuthBase):
    """Authorization that asks the token cache on every request, so a long audit never uses a stale token."""

    def __init__(self, app: GitHubApp, installation_id: int):
        self._app, self._installation_id = app, installation_id

    @property
    def token_type(self) -> str:
        return "token"

    @property
    def token(self) -> str:
        return self._app.installation_token(self._installation_id)


class GitHubApp:
    def __init__(self, settings: BotSettings):
        settings.require_app()
        self.settings = settings
        self._tokens: dict[int, _Token] = {}
        self._lock = threading.Lock()
        self._app_auth = Auth.AppAuth(settings.app_id, settings.private_key)

    def retry(self, *, post: bool = False) -> GithubRetry:
        """Bounded retries. POST is left out for API clients: a create that failed after GitHub applied it
        must not be sent again blindly; ``bot.publish`` retries creates after checking whether they landed."""
        s = self.settings
        methods = set(IDEMPOTENT_METHODS) | ({"POST"} if post else set())
        return GithubRetry(
            total=s.http_retries,
            backoff_factor=s.http_backoff,
            backoff_max=30,
            secondary_rate_wait=min(60.0, s.max_rate_limit_wait),
            max_rate_limit_wait=s.max_rate_limit_wait,
            allowed_methods=frozenset(methods),
        )

    def integration(self) -> GithubIntegration:
        # minting a token twice is harmless, so token requests may retry POST
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
            return tok.value

    def installation_for(self, repo: str) -> int:
        owner, name = repo.split("/", 1)
        return self.integration().get_repo_installation(owner, name).id

    def client(self, installation_id: int) -> Github:
        s = self.settings
        return Github(
            auth=_InstallationAuth(self, installation_id),
            base_url=s.github_url,
            retry=self.retry(),
            seconds_between_requests=s.seconds_between_requests,
            seconds_between_writes=s.seconds_between_writes,
            timeout=30,
        )
