"""What the GitHub stand-in knows: a plain object tests seed before and inspect after.

Every mutation goes through ``lock`` because the server runs in its own thread.
Records are plain dicts shaped like GitHub's JSON so handlers can return them
almost as they are.
"""

from __future__ import annotations

import io
import random
import secrets
import subprocess
import threading
import time
import zipfile
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def user_json(login: str, kind: str = "User") -> dict:
    """A simple-user object with every field GitHub's schema requires."""
    uid = sum(login.encode()) * 7919 % 10**7
    url = f"https://api.github.example/users/{login}"
    return {
        "login": login,
        "id": uid,
        "node_id": f"U_{uid}",
        "avatar_url": f"https://avatars.github.example/u/{uid}",
        "gravatar_id": "",
        "url": url,
        "html_url": f"https://github.example/{login}",
        "followers_url": url + "/followers",
        "following_url": url + "/following{/other_user}",
        "gists_url": url + "/gists{/gist_id}",
        "starred_url": url + "/starred{/owner}{/repo}",
        "subscriptions_url": url + "/subscriptions",
        "organizations_url": url + "/orgs",
        "repos_url": url + "/repos",
        "events_url": url + "/events{/privacy}",
        "received_events_url": url + "/received_events",
        "type": kind,
        "site_admin": False,
    }


def _git_has(clone_url: str, sha: str) -> bool:
    path = clone_url[len("file://") :] if clone_url.startswith("file://") else clone_url
    if not path or not Path(path).exists():
        return False
    try:
        out = subprocess.run(
            ["git", "-C", path, "cat-file", "-e", f"{sha}^{{commit}}"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_KEY_CACHE: dict[str, Any] = {}


def app_private_key() -> tuple[str, Any]:
    """One RSA key per test process (generation is the slow part); PEM text and public key."""
    if "pem" not in _KEY_CACHE:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _KEY_CACHE["pem"] = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        _KEY_CACHE["public"] = key.public_key()
    return _KEY_CACHE["pem"], _KEY_CACHE["public"]


@dataclass
class Fault:
    """Replace a fraction of responses with GitHub's 5xx or secondary-rate-limit 403.

    By default a fault is injected *before* the request is applied (as GitHub's
    rate limiter does); ``after_apply=True`` applies the request and then fails
    the response, like a gateway timing out after the backend committed.
    ``paths`` (substrings) and ``methods`` limit which requests may fail.
    """

    rate: float = 0.0
    kinds: tuple[int, ...] = (500, 502, 503, 403)
    retry_after: int = 0
    seed: int = 0
    paths: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    after_apply: bool = False
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def pick(self, path: str, method: str = "GET") -> int | None:
        if self.rate <= 0 or (self.paths and not any(p in path for p in self.paths)):
            return None
        if self.methods and method not in self.methods:
            return None
        if self.rng.random() < self.rate:
            return self.rng.choice(self.kinds)
        return None


@dataclass
class Limits:
    """GitHub's documented rate limits, as the stand-in enforces them (per installation).

    Primary: ``StubState.rate_limit`` requests per hour, then 403 with ``x-ratelimit-remaining: 0``
    and ``x-ratelimit-reset``. Secondary: content-creating requests (comments,
    reactions, check runs, dispatches) over 80 a minute or 500 an hour answer
    ``secondary_status`` (GitHub sends 403 or 429) with ``Retry-After`` when
    ``retry_after`` is set; without it a client must wait at least a minute.
    """

    content_per_minute: int = 80
    content_per_hour: int = 500
    secondary_status: int = 403
    retry_after: bool = True  # send Retry-After (the seconds until the window frees a slot)


@dataclass
class StubState:
    app_id: int = 4242
    app_slug: str = "drift-audit"
    token_ttl: float = 3600.0  # seconds an installation token lives
    token_length: int = 0  # 0: a random length each time, to catch length assumptions
    rate_limit: int = 5000
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    limits: Limits = field(default_factory=Limits)
    skew: float = 0.0  # seconds added to the wall clock: tests move time forward instead of sleeping
    apps: dict[int, str] = field(default_factory=dict)  # app id -> slug, besides this app (other bots)
    commits: dict[str, set[str]] = field(default_factory=dict)  # repo -> SHAs seeded without a git repo
    results_key: str = ""  # the bot's results key: artifacts' results.json are signed with it (runner.signing)
    validate: bool = True  # check every request and response against GitHub's REST description
    violations: list = field(default_factory=list)  # contract.Violation, in the order they happened
    validated: Counter = field(default_factory=Counter)  # operation id -> requests checked

    installations: dict[int, dict] = field(default_factory=dict)
    tokens: dict[str, dict] = field(default_factory=dict)  # token -> {installation_id, expires_at}
    repos: dict[str, dict] = field(default_factory=dict)  # "owner/name" -> repo json (+ "_installation")
    pulls: dict[tuple[str, int], dict] = field(default_factory=dict)
    pull_files: dict[tuple[str, int], list[dict]] = field(default_factory=dict)
    pull_diffs: dict[tuple[str, int], str] = field(default_factory=dict)
    comments: dict[int, dict] = field(default_factory=dict)  # id -> comment json (+ "_repo", "_issue")
    reactions: dict[int, list[dict]] = field(default_factory=dict)  # comment id -> reactions
    check_runs: dict[int, dict] = field(default_factory=dict)  # id -> check run json (+ "_repo")
    annotations: dict[int, list[dict]] = field(default_factory=dict)  # check run id -> annotations
    permissions: dict[tuple[str, str], str] = field(default_factory=dict)  # (repo, login) -> admin|write|...
    roles: dict[tuple[str, str], str] = field(default_factory=dict)  # (repo, login) -> custom role name
    workflows: dict[tuple[str, str], dict] = field(default_factory=dict)  # (repo, file) -> workflow json
    dispatches: list[dict] = field(default_factory=list)
    runs: dict[int, dict] = field(default_factory=dict)  # run id -> workflow run json (+ "_repo")
    artifacts: dict[int, dict] = field(default_factory=dict)  # id -> artifact json (+ "_repo", "_run", "_zip")
    blobs: dict[str, int] = field(default_factory=dict)  # signed download key -> artifact id
    requests: list[tuple[str, str, int]] = field(default_factory=list)  # (method, path, status) served
    arrivals: list[tuple[str, str]] = field(default_factory=list)  # (method, path) as each request arrives
    timeline: list[tuple[float, str, str]] = field(default_factory=list)  # (monotonic time, method, path) on arrival
    delays: dict[str, float] = field(default_factory=dict)  # "METHOD path-substring" -> seconds to stall first
    fault: Fault = field(default_factory=Fault)
    faults_injected: int = 0
    secondary_refusals: int = 0  # content-creation requests refused by the secondary limits
    on_dispatch: Callable[[StubState, dict], None] | None = None  # e.g. seed a run for each dispatch
    _ids: int = 1000
    _remaining: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (window reset, remaining)
    _content: dict[str, deque] = field(default_factory=dict)  # installation key -> creation times (last hour)
    _git_known: dict[tuple[str, str], bool] = field(default_factory=dict)

    def now(self) -> float:
        return time.time() + self.skew

    def advance(self, seconds: float) -> None:
        """Move the stand-in's clock forward (rate-limit windows, Retry-After) without sleeping."""
        with self.lock:
            self.skew += seconds

    # ------------------------------------------------------------------ seeding helpers
    def next_id(self) -> int:
        with self.lock:
            self._ids += 1
            return self._ids

    @property
    def private_key(self) -> str:
        return app_private_key()[0]

    def slug_of(self, app_id: int | None) -> str:
        return self.app_slug if app_id in (None, self.app_id) else self.apps.get(app_id, f"app-{app_id}")

    def add_installation(
        self, installation_id: int = 1, account: str = "octo-org", *, app_id: int | None = None
    ) -> dict:
        """An installation of this app, or of another app (``app_id``) whose token a test mints directly."""
        app = self.app_id if app_id is None else app_id
        with self.lock:
            inst = {
                "id": installation_id,
                "app_id": app,
                "app_slug": self.slug_of(app),
                "account": {"login": account, "id": 1, "type": "Organization"},
                "target_type": "Organization",
                "repository_selection": "selected",
                "permissions": {
                    "checks": "write",
                    "pull_requests": "write",
                    "issues": "write",
                    "contents": "read",
                    "actions": "write",
                    "metadata": "read",
                },
                "events": ["pull_request", "issue_comment", "check_run", "merge_group", "workflow_run"],
                "created_at": iso(),
                "updated_at": iso(),
                "access_tokens_url": "",
                "repositories_url": "",
                "html_url": f"https://github.example/settings/installations/{installation_id}",
                "target_id": 1,
                "single_file_name": None,
            }
            self.installations[installation_id] = inst
            return inst

    def add_repo(
        self,
        full_name: str,
        clone_url: str = "",
        *,
        installation_id: int = 1,
        default_branch: str = "main",
        private: bool = False,
    ) -> dict:
        """Register a repo; ``clone_url`` may be a local path or file:// URL of a real git repo."""
        owner, name = full_name.split("/")
        with self.lock:
            if installation_id not in self.installations:
                self.add_installation(installation_id, owner)
            repo = {
                "id": self.next_id(),
                "node_id": f"R_{name}",
                "name": name,
                "full_name": full_name,
                "owner": {"login": owner, "id": 1, "type": "Organization"},
                "private": private,
                "fork": False,
                "default_branch": default_branch,
                "clone_url": clone_url,
                "html_url": f"https://github.example/{full_name}",
                "_installation": installation_id,
            }
            self.repos[full_name] = repo
            return repo

    def add_pull(
        self,
        repo: str,
        number: int,
        *,
        head_sha: str,
        base_sha: str,
        head_ref: str = "feature",
        base_ref: str = "main",
        user: str = "octocat",
        title: str = "A change",
        body: str = "",
        draft: bool = False,
        head_repo: str | None = None,
        author_association: str = "MEMBER",
        files: list[dict] | None = None,
        diff: str = "",
    ) -> dict:
        with self.lock:
            r = self.repos[repo]
            hr = dict(r, full_name=head_repo or repo, fork=bool(head_repo and head_repo != repo))
            pr = {
                "id": self.next_id(),
                "number": number,
                "state": "open",
                "title": title,
                "body": body,
                "draft": draft,
                "user": {"login": user, "id": abs(hash(user)) % 10**6, "type": "User"},
                "author_association": author_association,
                "head": {"sha": head_sha, "ref": head_ref, "label": f"x:{head_ref}", "repo": hr},
                "base": {"sha": base_sha, "ref": base_ref, "label": f"x:{base_ref}", "repo": r},
                "created_at": iso(),
                "updated_at": iso(),
                "merged": False,
                "mergeable": True,
            }
            self.pulls[(repo, number)] = pr
            self.pull_files[(repo, number)] = files or []
            self.pull_diffs[(repo, number)] = diff
            return pr

    def set_permission(
        self, repo: str, login: str, permission: str, role_name: str | None = None, *, base: str | None = None
    ) -> None:
        """``permission``: admin|maintain|write|triage|read|none; ``role_name`` a custom role built on it.
        ``set_permission(repo, u, "security-engineer", base="write")`` says the same the other way round."""
        if base is not None:
            permission, role_name = base, permission
        with self.lock:
            self.permissions[(repo, login)] = permission
            if role_name:
                self.roles[(repo, login)] = role_name

    def add_workflow(
        self,
        repo: str,
        file: str = "drift-audit-gpu.yml",
        name: str = "Drift Audit GPU",
        inputs: list[str] | None = None,
        required: list[str] | None = None,
    ) -> dict:
        """``inputs``: declared workflow_dispatch inputs, others are refused like GitHub does; ``required``:
        those a dispatch must give."""
        with self.lock:
            wf = {
                "id": self.next_id(),
                "node_id": "W",
                "name": name,
                "path": f".github/workflows/{file}",
                "state": "active",
                "created_at": iso(),
                "updated_at": iso(),
                "_inputs": inputs,
                "_required": required or [],
                "_repo": repo,
            }
            self.workflows[(repo, file)] = wf
            return wf

    def add_run(
        self,
        repo: str,
        *,
        head_sha: str,
        workflow: str = "drift-audit-gpu.yml",
        status: str = "completed",
        conclusion: str | None = "success",
        event: str = "workflow_dispatch",
        head_branch: str = "main",
        inputs: dict | None = None,
        display_title: str | None = None,
    ) -> dict:
        """Seed a workflow run (as if a dispatch had started one)."""
        with self.lock:
            wf = self.workflows.get((repo, workflow)) or self.add_workflow(repo, workflow)
            rid = self.next_id()
            run = {
                "id": rid,
                "name": wf["name"],
                "node_id": f"WR_{rid}",
                "head_sha": head_sha,
                "head_branch": head_branch,
                "path": wf["path"],
                "run_number": rid,
                "run_attempt": 1,
                "event": event,
                "status": status,
                "conclusion": conclusion if status == "completed" else None,
                "workflow_id": wf["id"],
                "created_at": iso(),
                "updated_at": iso(),
                "display_title": display_title or wf["name"],
                "_repo": repo,
                "_inputs": inputs or {},
            }
            self.runs[rid] = run
            return run

    def complete_run(self, run_id: int, conclusion: str = "success") -> dict:
        with self.lock:
            run = self.runs[run_id]
            run.update(status="completed", conclusion=conclusion, updated_at=iso())
            return run

    def add_artifact(
        self,
        run_id: int,
        name: str,
        files: dict[str, bytes | str] | None = None,
        *,
        raw_zip: bytes | None = None,
        expired: bool = False,
        signed: bool | None = None,
    ) -> dict:
        """Attach an artifact to a run: ``files`` are zipped like actions/upload-artifact does.

        With ``results_key`` set, a ``results.json`` is signed as the workflow's recording step signs it, for
        the dispatch the run came from (its inputs); ``signed=False`` leaves it unsigned, like results that
        did not come through that step."""
        files = dict(files or {})
        if (signed is None and self.results_key or signed) and "results.json" in files:
            files["results.sig"] = self.signature_for(run_id, files["results.json"])
        if raw_zip is None:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                for fname, data in (files or {}).items():
                    zf.writestr(fname, data.encode() if isinstance(data, str) else data)
            raw_zip = buf.getvalue()
        with self.lock:
            run = self.runs[run_id]
            aid = self.next_id()
            art = {
                "id": aid,
                "node_id": f"A_{aid}",
                "name": name,
                "size_in_bytes": len(raw_zip),
                "expired": expired,
                "created_at": iso(),
                "updated_at": iso(),
                "expires_at": iso(time.time() + 86400),
                "workflow_run": {"id": run_id, "head_sha": run["head_sha"], "head_branch": run["head_branch"]},
                "digest": "",
                "_repo": run["_repo"],
                "_run": run_id,
                "_zip": raw_zip,
            }
            self.artifacts[aid] = art
            return art

    def signature_for(self, run_id: int, results: bytes | str) -> bytes:
        """``results.sig`` as the recording step of this run's dispatch writes it."""
        from runner import signing

        run = self.runs[run_id]
        inputs = dict(run["_inputs"])
        if not inputs.get("audit_id"):  # a run seeded without inputs: its run-name says what they were
            words = str(run.get("display_title", "")).split()
            if len(words) == 5 and words[:2] == ["Drift", "Audit"] and words[3] == "on":
                inputs.update(audit_id=words[2], label=words[4])
        dispatch = signing.Dispatch(run["_repo"], inputs.get("audit_id", ""), inputs.get("label", ""),
                                    inputs.get("head_sha", run["head_sha"]))
        body = results.encode() if isinstance(results, str) else results
        return signing.sign(body, signing.repo_key(self.results_key, run["_repo"]), dispatch)

    # ------------------------------------------------------------------ inspection helpers
    def comments_on(self, repo: str, number: int) -> list[dict]:
        with self.lock:
            return [c for c in self.comments.values() if c["_repo"] == repo and c["_issue"] == number]

    def add_comment(
        self, repo: str, number: int, body: str, user: str = "octocat", *, app_id: int | None = None
    ) -> dict:
        """A comment by a person, or by an app (``app_id``: ours or another bot's) as ``<slug>[bot]``."""
        with self.lock:
            cid = self.next_id()
            author = user_json(user) if app_id is None else user_json(f"{self.slug_of(app_id)}[bot]", "Bot")
            c = {
                "id": cid,
                "node_id": f"IC_{cid}",
                "body": body,
                "user": author,
                "created_at": iso(),
                "updated_at": iso(),
                "author_association": "NONE" if app_id is not None else "MEMBER",
                "performed_via_github_app": None,
                "_repo": repo,
                "_issue": number,
                "_app": app_id,
            }
            self.comments[cid] = c
            return c

    def add_check_run(
        self,
        repo: str,
        head_sha: str,
        name: str = "Drift Audit",
        *,
        app_id: int | None = None,
        status: str = "completed",
        conclusion: str | None = "success",
    ) -> dict:
        """Seed a check run, e.g. one another app owns (``app_id``) on the same commit."""
        with self.lock:
            cid = self.next_id()
            app = self.app_id if app_id is None else app_id
            c = {
                "id": cid,
                "node_id": f"CR_{cid}",
                "head_sha": head_sha,
                "name": name,
                "external_id": "",
                "details_url": None,
                "html_url": None,
                "status": status,
                "conclusion": conclusion if status == "completed" else None,
                "started_at": iso(self.now()),
                "completed_at": iso(self.now()) if status == "completed" else None,
                "output": {"title": None, "summary": None, "text": None},
                "_app": app,
                "_repo": repo,
            }
            self.check_runs[cid] = c
            return c

    def add_commit(self, repo: str, *shas: str) -> None:
        """Make SHAs known to a repo that has no git repository behind it."""
        with self.lock:
            self.commits.setdefault(repo, set()).update(shas)

    def has_commit(self, repo: str, sha: str) -> bool:
        """Whether ``sha`` is a commit of ``repo``: seeded, a PR's head or base, or in its git repository."""
        with self.lock:
            if sha in self.commits.get(repo, set()):
                return True
            if any(
                sha in (pr["head"]["sha"], pr["base"]["sha"]) for (r, _), pr in self.pulls.items() if r == repo
            ):
                return True
            clone = self.repos.get(repo, {}).get("clone_url", "")
            known = self._git_known.get((repo, sha))
        if known is None:
            known = _git_has(clone, sha)
            if known:  # only hits are cached: a test may commit to the repository later
                with self.lock:
                    self._git_known[(repo, sha)] = known
        return known

    def check_runs_for(self, repo: str, head_sha: str | None = None, name: str | None = None) -> list[dict]:
        with self.lock:
            return [
                c
                for c in self.check_runs.values()
                if c["_repo"] == repo
                and (head_sha is None or c["head_sha"] == head_sha)
                and (name is None or c["name"] == name)
            ]

    def arrived(self, method: str, fragment: str) -> int:
        with self.lock:
            return sum(1 for m, p in self.arrivals if m == method and fragment in p)

    def count(self, method: str, fragment: str, status: int | None = None) -> int:
        with self.lock:
            return sum(
                1 for m, p, s in self.requests if m == method and fragment in p and (status is None or s == status)
            )

    # ------------------------------------------------------------------ used by the app
    def mint_token(self, installation_id: int) -> dict:
        n = self.token_length or random.randint(40, 120)
        token = ("ghs_" + secrets.token_urlsafe(n))[: max(n, 8)]
        exp = time.time() + self.token_ttl
        with self.lock:
            self.tokens[token] = {"installation_id": installation_id, "expires_at": exp}
        return {
            "token": token,
            "expires_at": iso(exp),
            "permissions": self.installations[installation_id]["permissions"],
            "repository_selection": "selected",
        }

    def consume(self, key: str) -> tuple[int, int, int, bool]:
        """One request against ``key``'s hourly core limit: (limit, remaining, reset epoch, allowed)."""
        with self.lock:
            limit = self.rate_limit
            now = self.now()
            reset = int(now // 3600 * 3600 + 3600)
            window, left = self._remaining.get(key, (reset, limit))
            if window != reset:
                left = limit
            allowed = left > 0
            left = max(left - 1, 0)
            self._remaining[key] = (reset, left)
            return limit, left, reset, allowed

    def peek(self, key: str) -> tuple[int, int, int, bool]:
        """``key``'s core limit without spending a request."""
        with self.lock:
            reset = int(self.now() // 3600 * 3600 + 3600)
            window, left = self._remaining.get(key, (reset, self.rate_limit))
            left = left if window == reset else self.rate_limit
            return self.rate_limit, left, reset, left > 0

    def create_content(self, key: str) -> int | None:
        """Count one content-creating request; the seconds to wait when it breaks a secondary limit, else None."""
        lim = self.limits
        with self.lock:
            now = self.now()
            times = self._content.setdefault(key, deque())
            while times and times[0] <= now - 3600:
                times.popleft()
            last_minute = sum(1 for t in times if t > now - 60)
            if last_minute >= lim.content_per_minute:
                oldest = next(t for t in times if t > now - 60)
                return max(int(oldest + 60 - now) + 1, 1)
            if len(times) >= lim.content_per_hour:
                return max(int(times[0] + 3600 - now) + 1, 1)
            times.append(now)
            return None

    def public_key(self):
        return app_private_key()[1]

    def take_violations(self, fragment: str = "") -> list:
        """Remove and return the contract violations whose text contains ``fragment``: a test that breaks the
        contract on purpose takes what it caused, so the fixture's check at teardown sees only the rest."""
        with self.lock:
            taken = [v for v in self.violations if fragment in str(v)]
            self.violations = [v for v in self.violations if fragment not in str(v)]
            return taken
