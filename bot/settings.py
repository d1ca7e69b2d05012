"""Service settings from the environment or a TOML file; secrets never reach a log line.

Secret fields are excluded from ``repr`` so a settings object can be logged or
shown in an error whole. Environment variables (``DRIFT_AUDIT_<FIELD>``) win
over the file, so a deployment can keep secrets out of files entirely.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

ENV_PREFIX = "DRIFT_AUDIT_"
SECRET_FIELDS = ("private_key", "webhook_secret", "results_key")


class SettingsError(ValueError):
    """A missing or malformed setting, named with where it was looked for."""


@dataclass
class BotSettings:
    app_id: int = 0
    private_key: str = field(default="", repr=False)  # PEM text; or private_key_file
    webhook_secret: str = field(default="", repr=False)
    results_key: str = field(default="", repr=False)  # verifies GPU results (docs/runners.md); else $DRIFT_AUDIT_RESULTS_KEY
    github_url: str = "https://api.github.com"  # GHE: https://HOST/api/v3
    public_url: str = "http://127.0.0.1:8080"  # where /audits/<id> is reachable, for details_url
    db: str = "drift-audit.db"
    mirrors: str = "drift-audit-mirrors"
    workers: int = 2
    lease_seconds: float = 120.0  # a job whose worker stopped heartbeating is taken over after this
    max_attempts: int = 5
    retry_backoff: float = 5.0  # seconds, doubled per attempt
    audit_drafts: bool = False  # audit draft PRs too (else they wait for ready_for_review)
    check_name: str = "Drift Audit"
    bot_login: str = ""  # the app's account, "<slug>[bot]"; empty: asked of GitHub (GET /app) once
    gpu_workflow: str = "drift-audit-gpu.yml"
    token_refresh_margin: float = 300.0  # refresh installation tokens this long before they expire
    http_retries: int = 6  # GithubRetry total, for 5xx and secondary rate limits
    http_backoff: float = 0.5
    max_rate_limit_wait: float = 120.0
    seconds_between_requests: float = 0.25  # PyGithub's pacing; GitHub asks integrators not to burst
    seconds_between_writes: float = 1.0
    max_body_bytes: int = 25 * 1024 * 1024  # GitHub caps webhook payloads at 25 MB
    body_in_memory: int = 1024 * 1024  # a body is held in memory up to this, spooled to a temporary file beyond
    body_timeout: float = 5.0  # seconds to receive a whole body once its headers are in
    header_timeout: float = 5.0  # seconds to receive a request's headers once its first byte is in
    sweep_seconds: float = 60.0  # how often stale check runs are looked for (and once at start-up)
    gpu_timeout: float = 6 * 3600.0  # an audit waiting longer than this for GPU results is concluded without them
    announce_wait: float = 30.0  # how long a worker waits for the queued check run being created for its job

    def __post_init__(self) -> None:
        self.github_url = self.github_url.rstrip("/")

    def __repr__(self) -> str:  # what ``redacted`` shows: no secret, no credentials in a URL
        return f"BotSettings({', '.join(f'{k}={v!r}' for k, v in self.redacted().items())})"

    def require_app(self) -> None:
        missing = [n for n in ("app_id", "private_key", "webhook_secret") if not getattr(self, n)]
        if missing:
            names = ", ".join(ENV_PREFIX + n.upper() + (f" or {ENV_PREFIX}PRIVATE_KEY_FILE" if n == "private_key" else "")
                              for n in missing)  # the docs tell users to set the key's file
            raise SettingsError(f"missing setting(s): {names} (set them in the environment or the settings file)")

    def redacted(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in SECRET_FIELDS:
            out[name] = "<set>" if out[name] else "<unset>"
        for name in ("github_url", "public_url"):  # https://user:token@host/... : the credentials go
            out[name] = re.sub(r"(?<=://)[^/@\s]+@", "<credentials>@", str(out[name]))
        return out


def _coerce(name: str, value: Any, kind: Any, where: str) -> Any:
    target = {"int": int, "float": float, "bool": bool, "str": str}[kind if isinstance(kind, str) else kind.__name__]
    if target is bool and isinstance(value, str):
        low = value.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise SettingsError(f"{where}: {name} must be true or false, got {value!r}")
    try:
        return target(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{where}: {name} must be {target.__name__}, got {value!r}") from None


def load_settings(path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> BotSettings:
    """File (TOML, optional) then environment; ``private_key_file`` reads the PEM from disk."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    known = {f.name: f.type for f in fields(BotSettings)}
    if path:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise SettingsError(f"{p}: settings file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"{p}: not valid TOML ({exc})") from None
        for key, value in data.items():
            if key == "private_key_file":
                values["private_key"] = _read_key(value, f"{p}: private_key_file")
            elif key not in known:
                raise SettingsError(f"{p}: unknown setting '{key}' (known: {', '.join(sorted(known))})")
            else:
                values[key] = _coerce(key, value, known[key], str(p))
    for name, kind in known.items():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(name, raw, kind, f"${ENV_PREFIX}{name.upper()}")
    key_file = env.get(ENV_PREFIX + "PRIVATE_KEY_FILE")
    if key_file:
        values["private_key"] = _read_key(key_file, f"${ENV_PREFIX}PRIVATE_KEY_FILE")
    return BotSettings(**values)


def _read_key(path: str, where: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise SettingsError(f"{where}: cannot read {path} ({exc.strerror})") from None
