"""The stand-in's HTTP surface: GitHub's documented REST endpoints, limits and error bodies.

One catch-all route dispatches on (method, path regex) so the whole API can sit
under a prefix (``/api/v3`` like GitHub Enterprise) and every response passes
through the same auth, rate-limit-header and fault-injection code.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import jwt
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.ghstub import shapes
from tests.ghstub.contract import Violation, contract
from tests.ghstub.state import StubState, iso, user_json

DOCS = "https://docs.github.com/rest"
COMMENT_MAX = 65536
CHECK_TEXT_MAX = 65535
ANNOTATIONS_PER_REQUEST = 50
CONCLUSIONS = {"action_required", "cancelled", "failure", "neutral", "success", "skipped", "timed_out"}
STATUSES = {"queued", "in_progress", "completed", "waiting", "requested", "pending"}
ACTIONS_ONLY = {"waiting", "requested", "pending"}  # "Only GitHub Actions can set a status of ..."
ANNOTATION_TITLE_MAX = 255  # "The maximum size is 255 characters."
ANNOTATION_TEXT_MAX = 64 * 1024
DISPATCH_INPUTS_MAX = 25  # the description's maxProperties ("The maximum number of properties is 25")
DISPATCH_INPUTS_CHARS = 65535  # "The maximum payload for inputs is 65,535 characters" (GitHub Actions docs)  # message and raw_details: "The maximum size is 64 KB."
REACTIONS = {"+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes"}
LEVELS = {"notice", "warning", "failure"}


class HTTPError(Exception):
    def __init__(self, status: int, message: str, errors: list[dict] | None = None, headers: dict | None = None):
        self.status, self.message, self.errors, self.headers = status, message, errors, headers or {}


def not_found() -> HTTPError:
    return HTTPError(404, "Not Found")


def invalid(resource: str, field: str, message: str, code: str = "custom") -> HTTPError:
    return HTTPError(
        422, "Validation Failed", [{"resource": resource, "code": code, "field": field, "message": message}]
    )


@dataclass
class Ctx:
    state: StubState
    request: Request
    params: dict[str, str]
    body: Any
    base: str  # absolute API root, e.g. http://127.0.0.1:1234/api/v3
    auth: dict  # {"kind": "app"|"installation"|"none", ...}
    key: str = ""  # whose rate limits this request counts against

    @property
    def repo(self) -> dict:
        full = f"{self.params['owner']}/{self.params['repo']}"
        r = self.state.repos.get(full)
        if r is None:
            raise not_found()
        if self.auth.get("kind") == "installation" and self.auth["installation_id"] != r["_installation"]:
            raise not_found()  # GitHub hides repos the token cannot see
        return r

    def q(self, name: str, default: Any = None) -> Any:
        return self.request.query_params.get(name, default)


# --------------------------------------------------------------------------- representation


def repo_json(ctx: Ctx, r: dict) -> dict:
    return shapes.repository(ctx.base, r)


def pull_json(ctx: Ctx, pr: dict, full: str) -> dict:
    return shapes.pull_request(ctx.base, ctx.state, pr, full)


def comment_json(ctx: Ctx, c: dict) -> dict:
    return shapes.comment(ctx.base, ctx.state, c)


def check_json(ctx: Ctx, c: dict) -> dict:
    return shapes.check_run(ctx.base, ctx.state, c, len(ctx.state.annotations.get(c["id"], [])))


def run_json(ctx: Ctx, r: dict) -> dict:
    return shapes.workflow_run(ctx.base, ctx.state, r)


def artifact_json(ctx: Ctx, a: dict) -> dict:
    return shapes.artifact(ctx.base, a)


def paginate(ctx: Ctx, items: list, wrap: str | None = None) -> Response:
    """GitHub pagination: per_page (≤100, default 30), page, and a Link header."""
    try:
        per_page = min(max(int(ctx.q("per_page", 30)), 1), 100)
        page = max(int(ctx.q("page", 1)), 1)
    except ValueError:
        raise invalid("Pagination", "per_page", "per_page and page must be integers") from None
    last = max((len(items) + per_page - 1) // per_page, 1)
    chunk = items[(page - 1) * per_page : page * per_page]
    links = []
    path = ctx.base + ctx.request.url.path[len(_prefix(ctx)) :]

    def link(p: int, rel: str) -> str:
        query = dict(ctx.request.query_params, page=str(p), per_page=str(per_page))
        return f'<{path}?{urlencode(query)}>; rel="{rel}"'

    if page < last:
        links += [link(page + 1, "next"), link(last, "last")]
    if page > 1:
        links += [link(1, "first"), link(page - 1, "prev")]
    body: Any = {"total_count": len(items), wrap: chunk} if wrap else chunk
    headers = {"Link": ", ".join(links)} if links else {}
    return JSONResponse(body, headers=headers)


def _prefix(ctx: Ctx) -> str:
    return ctx.request.app.state.prefix


# --------------------------------------------------------------------------- apps and tokens


def get_app(ctx: Ctx) -> Response:
    return JSONResponse(dict(shapes.app(ctx.state), installations_count=len(ctx.state.installations)))


def repo_installation(ctx: Ctx) -> Response:
    r = ctx.state.repos.get(f"{ctx.params['owner']}/{ctx.params['repo']}")
    inst = ctx.state.installations.get(r["_installation"]) if r else None
    if inst is None or inst["app_id"] != ctx.auth.get("app_id", ctx.state.app_id):
        raise not_found()
    return JSONResponse(shapes.installation(ctx.base, inst))


def access_token(ctx: Ctx) -> Response:
    iid = int(ctx.params["id"])
    if iid not in ctx.state.installations:
        raise not_found()
    return JSONResponse(ctx.state.mint_token(iid), status_code=201)


def rate_limit(ctx: Ctx) -> Response:
    """Does not count against the limit, as on GitHub."""
    lim, left, reset, _ = ctx.state.peek(ctx.key)
    core = {"limit": lim, "remaining": left, "reset": reset, "used": lim - left}
    return JSONResponse({"resources": {"core": core, "search": core, "graphql": core}, "rate": core})


# --------------------------------------------------------------------------- repos and pulls


def get_repo(ctx: Ctx) -> Response:
    return JSONResponse(repo_json(ctx, ctx.repo))


def _pull(ctx: Ctx) -> dict:
    full = ctx.repo["full_name"]
    pr = ctx.state.pulls.get((full, int(ctx.params["number"])))
    if pr is None:
        raise not_found()
    return pr


def get_pull(ctx: Ctx) -> Response:
    pr = _pull(ctx)
    accept = ctx.request.headers.get("accept", "")
    full = ctx.repo["full_name"]
    if "diff" in accept:
        return PlainTextResponse(
            ctx.state.pull_diffs.get((full, pr["number"]), ""), media_type="text/plain; charset=utf-8"
        )
    return JSONResponse(pull_json(ctx, pr, full))


def pull_files(ctx: Ctx) -> Response:
    pr = _pull(ctx)
    full = ctx.repo["full_name"]
    files = ctx.state.pull_files.get((full, pr["number"]), [])[:3000]
    return paginate(ctx, [shapes.diff_entry(ctx.base, full, pr["head"]["sha"], f) for f in files])


def get_issue(ctx: Ctx) -> Response:
    full = ctx.repo["full_name"]
    pr = ctx.state.pulls.get((full, int(ctx.params["number"])))
    if pr is None:
        raise not_found()
    return JSONResponse(shapes.issue(ctx.base, ctx.state, pr, full))


# --------------------------------------------------------------------------- issue comments and reactions


def list_comments(ctx: Ctx) -> Response:
    full = ctx.repo["full_name"]
    n = int(ctx.params["number"])
    if (full, n) not in ctx.state.pulls:
        raise not_found()
    items = sorted(ctx.state.comments_on(full, n), key=lambda c: c["id"])
    return paginate(ctx, [comment_json(ctx, c) for c in items])


def _body(ctx: Ctx, required: bool = True) -> str:
    body = (ctx.body or {}).get("body")
    if body is None and required:
        raise invalid("IssueComment", "body", "body wasn't supplied", "missing_field")
    if not isinstance(body, str):
        raise invalid("IssueComment", "body", "body must be a string", "invalid")
    if len(body) > COMMENT_MAX:
        raise invalid("IssueComment", "body", f"body is too long (maximum is {COMMENT_MAX} characters)")
    return body


def create_comment(ctx: Ctx) -> Response:
    full = ctx.repo["full_name"]
    n = int(ctx.params["number"])
    if (full, n) not in ctx.state.pulls:
        raise not_found()
    body = _body(ctx)
    c = ctx.state.add_comment(full, n, body, app_id=_caller(ctx))
    return JSONResponse(comment_json(ctx, c), status_code=201)


def _caller(ctx: Ctx) -> int:
    """The app whose installation token made this request."""
    return int(ctx.auth.get("app_id", ctx.state.app_id))


def forbidden(what: str) -> HTTPError:
    """What GitHub answers when an app writes to something another app or a person owns."""
    return HTTPError(403, "Resource not accessible by integration", [{"resource": what, "code": "forbidden"}])


def _comment(ctx: Ctx) -> dict:
    full = ctx.repo["full_name"]
    c = ctx.state.comments.get(int(ctx.params["id"]))
    if c is None or c["_repo"] != full:
        raise not_found()
    return c


def get_comment(ctx: Ctx) -> Response:
    return JSONResponse(comment_json(ctx, _comment(ctx)))


def update_comment(ctx: Ctx) -> Response:
    """An app may edit only the comments it wrote: others' comments (people's, other bots') answer 403."""
    c = _comment(ctx)
    if c.get("_app") != _caller(ctx):
        raise forbidden("IssueComment")
    body = _body(ctx)
    with ctx.state.lock:
        c.update(body=body, updated_at=iso())
    return JSONResponse(comment_json(ctx, c))


def create_reaction(ctx: Ctx) -> Response:
    c = _comment(ctx)
    content = (ctx.body or {}).get("content")
    if content not in REACTIONS:
        raise invalid("Reaction", "content", f"content is not included in the list {sorted(REACTIONS)}", "invalid")
    user = f"{ctx.state.slug_of(_caller(ctx))}[bot]"
    with ctx.state.lock:
        existing = [
            r
            for r in ctx.state.reactions.setdefault(c["id"], [])
            if r["content"] == content and r["user"]["login"] == user
        ]
        if existing:  # GitHub answers 200 with the reaction that already exists
            return JSONResponse(existing[0], status_code=200)
        r = {
            "id": ctx.state.next_id(),
            "node_id": "REA",
            "content": content,
            "created_at": iso(),
            "user": user_json(user, "Bot"),
        }
        ctx.state.reactions[c["id"]].append(r)
    return JSONResponse(r, status_code=201)


def list_reactions(ctx: Ctx) -> Response:
    c = _comment(ctx)
    return paginate(ctx, list(ctx.state.reactions.get(c["id"], [])))


# --------------------------------------------------------------------------- check runs


def _annotation(a: Any, i: int) -> dict:
    """One annotation, held to the limits GitHub documents beside the schema (sizes, line/column pairing)."""
    where = f"output.annotations[{i}]"
    if not isinstance(a, dict):
        raise invalid("CheckRun", where, "annotation must be an object", "invalid")
    for key in ("path", "start_line", "end_line", "annotation_level", "message"):
        if key not in a:
            raise invalid("CheckRun", f"{where}.{key}", f"{key} wasn't supplied", "missing_field")
    if not isinstance(a["path"], str) or not a["path"] or a["path"].startswith("/"):
        raise invalid("CheckRun", f"{where}.path", "path must be relative to the repository root", "invalid")
    if a["annotation_level"] not in LEVELS:
        raise invalid("CheckRun", f"{where}.annotation_level", "annotation_level is invalid", "invalid")
    start, end = a["start_line"], a["end_line"]
    if not isinstance(start, int) or not isinstance(end, int) or start < 1 or end < start:
        raise invalid("CheckRun", f"{where}.end_line", "start_line must be ≥ 1 and end_line ≥ start_line", "invalid")
    if ("start_column" in a or "end_column" in a) and start != end:
        raise invalid(
            "CheckRun", f"{where}.start_column", "start_column and end_column are only allowed on one line", "invalid"
        )
    if len(str(a.get("title") or "")) > ANNOTATION_TITLE_MAX:
        raise invalid("CheckRun", f"{where}.title", f"title is too long (maximum is {ANNOTATION_TITLE_MAX} characters)")
    for key in ("message", "raw_details"):
        if len(str(a.get(key) or "").encode()) > ANNOTATION_TEXT_MAX:
            raise invalid("CheckRun", f"{where}.{key}", f"{key} is too long (maximum is {ANNOTATION_TEXT_MAX} bytes)")
    return {
        "path": a["path"],
        "blob_href": "",
        "start_line": start,
        "end_line": end,
        "start_column": a.get("start_column"),
        "end_column": a.get("end_column"),
        "annotation_level": a["annotation_level"],
        "title": a.get("title"),
        "message": a["message"],
        "raw_details": a.get("raw_details"),
    }


def _check_output(ctx: Ctx, output: Any, old: dict | None) -> tuple[dict, list[dict]]:
    if output is None:
        return (old or {"title": None, "summary": None, "text": None}), []
    if not isinstance(output, dict):
        raise invalid("CheckRun", "output", "output must be an object", "invalid")
    for key in ("title", "summary"):
        if not isinstance(output.get(key), str):
            raise invalid("CheckRun", f"output.{key}", f"{key} wasn't supplied", "missing_field")
    for key in ("summary", "text"):
        val = output.get(key)
        if isinstance(val, str) and len(val) > CHECK_TEXT_MAX:
            raise invalid("CheckRun", f"output.{key}", f"{key} is too long (maximum is {CHECK_TEXT_MAX} characters)")
    annotations = output.get("annotations") or []
    if len(annotations) > ANNOTATIONS_PER_REQUEST:
        raise invalid(
            "CheckRun", "output.annotations", f"Only {ANNOTATIONS_PER_REQUEST} annotations are allowed per request"
        )
    clean = [_annotation(a, i) for i, a in enumerate(annotations)]
    kept = {"title": output["title"], "summary": output["summary"], "text": output.get("text")}
    return kept, clean


def _check_fields(ctx: Ctx, data: dict, c: dict) -> None:
    status = data.get("status", c.get("status"))
    if status not in STATUSES:
        raise invalid("CheckRun", "status", "status is not included in the list", "invalid")
    if "status" in data and status in ACTIONS_ONLY:
        raise invalid("CheckRun", "status", f"Only GitHub Actions can set a status of {status}", "invalid")
    conclusion = data.get("conclusion", c.get("conclusion"))
    if conclusion is not None and conclusion not in CONCLUSIONS:
        raise invalid("CheckRun", "conclusion", "conclusion is not included in the list", "invalid")
    if conclusion is not None and "status" not in data:
        status = "completed"  # GitHub: giving a conclusion completes the run
    if status == "completed" and conclusion is None:
        raise invalid("CheckRun", "conclusion", "conclusion wasn't supplied", "missing_field")
    output, annotations = _check_output(ctx, data.get("output"), c.get("output"))
    with ctx.state.lock:
        for key in ("name", "details_url", "external_id", "started_at"):
            if key in data:
                c[key] = data[key]
        c.update(status=status, conclusion=conclusion, output=output)
        if status == "completed":
            c["completed_at"] = data.get("completed_at") or iso()
        ctx.state.annotations.setdefault(c["id"], []).extend(annotations)


def _known_sha(ctx: Ctx, sha: Any, field: str) -> str:
    """GitHub accepts only commits the repository has, not any 40 hex digits."""
    full = ctx.repo["full_name"]
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{40}", sha) or not ctx.state.has_commit(full, sha):
        if field == "ref":
            raise HTTPError(422, f"No commit found for SHA: {sha}")
        raise invalid("CheckRun", field, f"No commit found for SHA: {sha}", "invalid")
    return sha


def create_check(ctx: Ctx) -> Response:
    r = ctx.repo
    data = ctx.body or {}
    for key in ("name", "head_sha"):
        if not data.get(key):
            raise invalid("CheckRun", key, f"{key} wasn't supplied", "missing_field")
    _known_sha(ctx, data["head_sha"], "head_sha")
    with ctx.state.lock:
        c = ctx.state.add_check_run(r["full_name"], data["head_sha"], data["name"], app_id=_caller(ctx),
                                    status="queued", conclusion=None)
        del ctx.state.check_runs[c["id"]]  # registered only once the fields pass
    _check_fields(ctx, data, c)
    with ctx.state.lock:
        ctx.state.check_runs[c["id"]] = c
    return JSONResponse(check_json(ctx, c), status_code=201)


def _check(ctx: Ctx) -> dict:
    c = ctx.state.check_runs.get(int(ctx.params["id"]))
    if c is None or c["_repo"] != ctx.repo["full_name"]:
        raise not_found()
    return c


def get_check(ctx: Ctx) -> Response:
    return JSONResponse(check_json(ctx, _check(ctx)))


def update_check(ctx: Ctx) -> Response:
    """Only the app that created a check run may update it."""
    c = _check(ctx)
    if c.get("_app") != _caller(ctx):
        raise forbidden("CheckRun")
    _check_fields(ctx, ctx.body or {}, c)
    return JSONResponse(check_json(ctx, c))


def check_annotations(ctx: Ctx) -> Response:
    c = _check(ctx)
    return paginate(ctx, list(ctx.state.annotations.get(c["id"], [])))


def get_commit(ctx: Ctx) -> Response:
    full = ctx.repo["full_name"]
    sha = _known_sha(ctx, ctx.params["ref"], "ref")
    return JSONResponse(shapes.commit(ctx.base, full, sha))


def checks_for_ref(ctx: Ctx) -> Response:
    """GitHub's filters: ``check_name``, ``status``, ``app_id``, and ``filter`` — ``latest`` (the default) keeps
    only the most recent run of each name, ``all`` keeps every run."""
    full = ctx.repo["full_name"]
    ref = _known_sha(ctx, ctx.params["ref"], "ref")
    runs = sorted(ctx.state.check_runs_for(full, ref, ctx.q("check_name")), key=lambda c: -c["id"])
    if ctx.q("status"):
        runs = [c for c in runs if c["status"] == ctx.q("status")]
    if ctx.q("app_id"):
        runs = [c for c in runs if str(c.get("_app")) == ctx.q("app_id")]
    if ctx.q("filter", "latest") == "latest":
        newest: dict[str, dict] = {}
        for c in runs:
            newest.setdefault(c["name"], c)
        runs = list(newest.values())
    return paginate(ctx, [check_json(ctx, c) for c in runs], wrap="check_runs")


# --------------------------------------------------------------------------- collaborators


def collaborator_permission(ctx: Ctx) -> Response:
    """``permission`` is the legacy field (maintain → write, triage → read); ``role_name`` the role itself,
    including custom repository roles (``StubState.set_permission(..., role_name=...)``)."""
    full = ctx.repo["full_name"]
    login = ctx.params["user"]
    perm = ctx.state.permissions.get((full, login), "read")
    role = ctx.state.roles.get((full, login)) or (
        perm if perm in ("admin", "maintain", "write", "triage", "read") else "none"
    )
    legacy = {"maintain": "write", "triage": "read"}.get(perm, perm)
    user = dict(user_json(login), role_name=role, permissions={"admin": perm == "admin", "push": legacy in
                ("admin", "write"), "pull": True, "maintain": perm == "maintain", "triage": perm != "read"})
    return JSONResponse({"permission": legacy, "role_name": role, "user": user})


# --------------------------------------------------------------------------- actions


def _workflow(ctx: Ctx) -> dict:
    full = ctx.repo["full_name"]
    key = ctx.params["wf"]
    for (repo, file), wf in ctx.state.workflows.items():
        if repo == full and (file == key or str(wf["id"]) == key):
            return wf
    raise not_found()


def get_workflow(ctx: Ctx) -> Response:
    return JSONResponse(shapes.workflow(ctx.base, _workflow(ctx)))


def dispatch(ctx: Ctx) -> Response:
    """GitHub's documented limits: at most 25 inputs, 65,535 characters of inputs in all, only inputs the
    workflow declares, every required one present, values that are strings, numbers or booleans."""
    wf = _workflow(ctx)
    data = ctx.body or {}
    if not isinstance(data.get("ref"), str) or not data["ref"]:
        raise HTTPError(422, 'Invalid request.\n\n"ref" wasn\'t supplied.')
    inputs = data.get("inputs") or {}
    if not isinstance(inputs, dict):
        raise HTTPError(422, "Invalid request.\n\nFor 'properties/inputs', is not an object.")
    if len(inputs) > DISPATCH_INPUTS_MAX:
        raise HTTPError(422, f"you may only define up to {DISPATCH_INPUTS_MAX} `inputs` for a `workflow_dispatch` event")
    for k, v in inputs.items():
        if not isinstance(v, (str, int, float, bool)):
            raise HTTPError(422, f"Invalid request.\n\nFor 'properties/{k}', is not a string.")
    size = len(json.dumps(inputs, separators=(",", ":"), ensure_ascii=False))
    if size > DISPATCH_INPUTS_CHARS:
        raise HTTPError(422, f"inputs are too large ({size} characters; the maximum is {DISPATCH_INPUTS_CHARS})")
    declared = wf.get("_inputs")
    if declared is not None:
        extra = sorted(set(inputs) - set(declared))
        if extra:
            raise HTTPError(422, f"Unexpected inputs provided: {json.dumps(extra)}")
    missing = sorted(set(wf.get("_required") or ()) - set(inputs))
    if missing:
        raise HTTPError(422, f"Required input '{missing[0]}' not provided")
    record = {
        "repo": wf["_repo"],
        "workflow": wf["path"].rsplit("/", 1)[-1],
        "ref": data["ref"],
        "inputs": {k: str(v) for k, v in inputs.items()},
        "at": time.time(),
    }
    with ctx.state.lock:
        ctx.state.dispatches.append(record)
    if ctx.state.on_dispatch:
        ctx.state.on_dispatch(ctx.state, record)
    return Response(status_code=204)


def _runs_filtered(ctx: Ctx, runs: list[dict]) -> Response:
    for key in ("event", "status", "head_sha", "branch"):
        val = ctx.q(key)
        if val is None:
            continue
        field = "head_branch" if key == "branch" else key
        if key == "status" and val not in ("completed", "in_progress", "queued", "requested", "waiting", "pending"):
            runs = [r for r in runs if r.get("conclusion") == val]
        else:
            runs = [r for r in runs if str(r.get(field)) == val]
    runs = sorted(runs, key=lambda r: -r["id"])
    return paginate(ctx, [run_json(ctx, r) for r in runs], wrap="workflow_runs")


def list_runs(ctx: Ctx) -> Response:
    full = ctx.repo["full_name"]
    return _runs_filtered(ctx, [r for r in ctx.state.runs.values() if r["_repo"] == full])


def list_workflow_runs(ctx: Ctx) -> Response:
    wf = _workflow(ctx)
    return _runs_filtered(ctx, [r for r in ctx.state.runs.values() if r["workflow_id"] == wf["id"]])


def _run(ctx: Ctx) -> dict:
    r = ctx.state.runs.get(int(ctx.params["id"]))
    if r is None or r["_repo"] != ctx.repo["full_name"]:
        raise not_found()
    return r


def get_run(ctx: Ctx) -> Response:
    return JSONResponse(run_json(ctx, _run(ctx)))


def run_artifacts(ctx: Ctx) -> Response:
    run = _run(ctx)
    arts = [a for a in ctx.state.artifacts.values() if a["_run"] == run["id"]]
    name = ctx.q("name")
    if name:
        arts = [a for a in arts if a["name"] == name]
    return paginate(ctx, [artifact_json(ctx, a) for a in arts], wrap="artifacts")


def repo_artifacts(ctx: Ctx) -> Response:
    full = ctx.repo["full_name"]
    arts = [a for a in ctx.state.artifacts.values() if a["_repo"] == full]
    name = ctx.q("name")
    if name:
        arts = [a for a in arts if a["name"] == name]
    return paginate(ctx, [artifact_json(ctx, a) for a in sorted(arts, key=lambda a: -a["id"])], wrap="artifacts")


def _artifact(ctx: Ctx) -> dict:
    a = ctx.state.artifacts.get(int(ctx.params["id"]))
    if a is None or a["_repo"] != ctx.repo["full_name"]:
        raise not_found()
    return a


def get_artifact(ctx: Ctx) -> Response:
    return JSONResponse(artifact_json(ctx, _artifact(ctx)))


def artifact_zip(ctx: Ctx) -> Response:
    """GitHub answers 302 to a short-lived, pre-signed storage URL (no auth header needed there)."""
    a = _artifact(ctx)
    if a["expired"]:
        raise HTTPError(410, "Artifact has expired")
    key = secrets.token_urlsafe(16)
    with ctx.state.lock:
        ctx.state.blobs[key] = a["id"]
    root = str(ctx.request.base_url).rstrip("/")
    return RedirectResponse(f"{root}/_blobs/{key}.zip?sig={secrets.token_hex(8)}", status_code=302)


# --------------------------------------------------------------------------- routing

# (method, pattern, handler, auth): auth is "jwt", "token" or "any"
ROUTES: list[tuple[str, str, Callable[[Ctx], Response], str]] = [
    ("GET", r"/app", get_app, "jwt"),
    ("GET", r"/repos/{owner}/{repo}/installation", repo_installation, "jwt"),
    ("POST", r"/app/installations/{id}/access_tokens", access_token, "jwt"),
    ("GET", r"/rate_limit", rate_limit, "any"),
    ("GET", r"/repos/{owner}/{repo}", get_repo, "token"),
    ("GET", r"/repos/{owner}/{repo}/pulls/{number}", get_pull, "token"),
    ("GET", r"/repos/{owner}/{repo}/pulls/{number}/files", pull_files, "token"),
    ("GET", r"/repos/{owner}/{repo}/issues/{number}", get_issue, "token"),
    ("GET", r"/repos/{owner}/{repo}/issues/{number}/comments", list_comments, "token"),
    ("POST", r"/repos/{owner}/{repo}/issues/{number}/comments", create_comment, "token"),
    ("GET", r"/repos/{owner}/{repo}/issues/comments/{id}", get_comment, "token"),
    ("PATCH", r"/repos/{owner}/{repo}/issues/comments/{id}", update_comment, "token"),
    ("GET", r"/repos/{owner}/{repo}/issues/comments/{id}/reactions", list_reactions, "token"),
    ("POST", r"/repos/{owner}/{repo}/issues/comments/{id}/reactions", create_reaction, "token"),
    ("POST", r"/repos/{owner}/{repo}/check-runs", create_check, "token"),
    ("GET", r"/repos/{owner}/{repo}/check-runs/{id}", get_check, "token"),
    ("PATCH", r"/repos/{owner}/{repo}/check-runs/{id}", update_check, "token"),
    ("GET", r"/repos/{owner}/{repo}/check-runs/{id}/annotations", check_annotations, "token"),
    ("GET", r"/repos/{owner}/{repo}/commits/{ref}", get_commit, "token"),
    ("GET", r"/repos/{owner}/{repo}/commits/{ref}/check-runs", checks_for_ref, "token"),
    ("GET", r"/repos/{owner}/{repo}/collaborators/{user}/permission", collaborator_permission, "token"),
    ("GET", r"/repos/{owner}/{repo}/actions/workflows/{wf}", get_workflow, "token"),
    ("POST", r"/repos/{owner}/{repo}/actions/workflows/{wf}/dispatches", dispatch, "token"),
    ("GET", r"/repos/{owner}/{repo}/actions/workflows/{wf}/runs", list_workflow_runs, "token"),
    ("GET", r"/repos/{owner}/{repo}/actions/runs", list_runs, "token"),
    ("GET", r"/repos/{owner}/{repo}/actions/runs/{id}", get_run, "token"),
    ("GET", r"/repos/{owner}/{repo}/actions/runs/{id}/artifacts", run_artifacts, "token"),
    ("GET", r"/repos/{owner}/{repo}/actions/artifacts", repo_artifacts, "token"),
    ("GET", r"/repos/{owner}/{repo}/actions/artifacts/{id}", get_artifact, "token"),
    ("GET", r"/repos/{owner}/{repo}/actions/artifacts/{id}/zip", artifact_zip, "token"),
]

# Content-creating requests: what GitHub's secondary limits of 80 a minute and 500 an hour count.
CREATES = {create_comment, create_reaction, create_check, dispatch}

_COMPILED = [(m, re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", p) + "/?$"), h, a) for m, p, h, a in ROUTES]


def _authenticate(state: StubState, request: Request, need: str) -> dict:
    header = request.headers.get("authorization", "")
    scheme, _, cred = header.partition(" ")
    scheme = scheme.lower()
    if need == "jwt":
        if scheme != "bearer" or not cred:
            raise HTTPError(401, "A JSON web token could not be decoded")
        try:
            claims = jwt.decode(
                cred, state.public_key(), algorithms=["RS256"], options={"require": ["iat", "exp", "iss"]}, leeway=60
            )
        except jwt.PyJWTError as exc:
            raise HTTPError(
                401, f"'Expiration time' claim ('exp') is invalid or the JWT could not be decoded: {exc}"
            ) from None
        if str(claims["iss"]) != str(state.app_id):
            raise HTTPError(401, "Integration not found")
        if claims["exp"] - claims["iat"] > 600 + 60:
            raise HTTPError(401, "'Expiration time' claim ('exp') is too far in the future")
        return {"kind": "app", "app_id": state.app_id}
    if scheme in ("token", "bearer") and cred:
        with state.lock:
            info = state.tokens.get(cred)
        if info is None or info["expires_at"] < time.time():
            raise HTTPError(401, "Bad credentials")
        inst = state.installations.get(info["installation_id"], {})
        return {
            "kind": "installation",
            "installation_id": info["installation_id"],
            "app_id": inst.get("app_id", state.app_id),
        }
    if need == "any":
        return {"kind": "none"}
    raise HTTPError(401, "Requires authentication")


def _error(status: int, message: str, errors: list[dict] | None = None, headers: dict | None = None) -> JSONResponse:
    body: dict[str, Any] = {"message": message, "documentation_url": DOCS, "status": str(status)}
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, headers=headers)


SECONDARY = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
    "If you reach out to GitHub Support for help, please include the request ID."
)


def _secondary_limit(state: StubState, wait: int) -> HTTPError:
    """GitHub's content-creation limit: 403 or 429, ``Retry-After`` only when the stand-in is set to send it."""
    headers = {"Retry-After": str(wait)} if state.limits.retry_after else {}
    with state.lock:
        state.secondary_refusals += 1
    return HTTPError(state.limits.secondary_status, SECONDARY, headers=headers)


def _rate_key(state: StubState, request: Request) -> str:
    """Primary and secondary limits are per installation (per app for JWT calls), as on GitHub."""
    scheme, _, cred = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() in ("token", "bearer") and cred:
        with state.lock:
            info = state.tokens.get(cred)
        if info is not None:
            return f"installation ID {info['installation_id']}"
        return f"app ID {state.app_id}"
    return f"IP {request.client.host if request.client else 'anon'}"


def _fault(status: int, retry_after: int) -> JSONResponse:
    if status == 403:
        return _error(
            403,
            SECONDARY,
            headers={"Retry-After": str(retry_after)},
        )
    return _error(
        status, {500: "Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}.get(status, "Server Error")
    )


def build_app(state: StubState, prefix: str = "") -> Starlette:
    async def blob(request: Request) -> Response:
        key = request.path_params["key"]
        with state.lock:
            aid = state.blobs.pop(key, None)  # pre-signed URLs are single-use here
        if aid is None:
            return PlainTextResponse("AuthenticationFailed", status_code=403)
        return Response(state.artifacts[aid]["_zip"], media_type="application/zip")

    async def _serve(request: Request, method: str, api_path: str, key: str) -> Response:
        route = next(((rx.match(api_path), h, a) for m, rx, h, a in _COMPILED if m == method and rx.match(api_path)), None)
        if route is None:
            raise not_found()
        match, handler, need = route
        assert match is not None
        auth = _authenticate(state, request, need)
        if handler in CREATES:
            wait = state.create_content(key)
            if wait is not None:
                raise _secondary_limit(state, wait)
        try:
            raw = await request.body()
        except ClientDisconnect:  # a client killed mid-request (the kill -9 tests): nobody to answer
            raise HTTPError(400, "the client disconnected before the body was complete") from None
        body = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                raise HTTPError(400, "Problems parsing JSON") from None
        op = contract().match(method, api_path) if state.validate else None
        if op is not None:
            broken = contract().check_request(op, request.query_params, body)
            if broken:
                with state.lock:
                    state.violations.extend(broken)
                raise HTTPError(422, "Invalid request.\n\n" + "\n".join(v.detail for v in broken[:5]))
        base = str(request.base_url).rstrip("/") + prefix
        ctx = Ctx(state, request, match.groupdict(), body, base, auth, key)
        return handler(ctx)

    def _check_response(method: str, api_path: str, response: Response) -> None:
        """Every answer is checked against the schema GitHub documents for its operation and status."""
        op = contract().match(method, api_path)
        if op is None:
            with state.lock:
                state.violations.append(
                    Violation(f"{method} {api_path}", "request", "not an operation of GitHub's REST description")
                )
            return
        body: Any = None
        if response.media_type == "application/json" and response.body:
            body = json.loads(bytes(response.body))
        broken = contract().check_response(op, response.status_code, body)
        with state.lock:
            state.validated[op.id] += 1
            state.violations.extend(broken)

    async def dispatcher(request: Request) -> Response:
        path = "/" + request.path_params.get("path", "")
        api_path = path[len(prefix) :] if prefix and path.startswith(prefix) else (None if prefix else path)
        method = request.method
        key = _rate_key(state, request)
        lim, left, reset, allowed = state.consume(key) if api_path != "/rate_limit" else state.peek(key)
        try:
            if api_path is None:
                raise not_found()
            with state.lock:
                state.arrivals.append((method, api_path))
                state.timeline.append((time.monotonic(), method, api_path))
                stall = max(
                    (
                        sec
                        for k, sec in state.delays.items()
                        if k.split(" ", 1)[0] == method and k.split(" ", 1)[1] in api_path
                    ),
                    default=0,
                )
            if stall:
                await asyncio.sleep(stall)
            if not allowed:
                raise HTTPError(403, f"API rate limit exceeded for {key}. Wait for x-ratelimit-reset.")
            injected = state.fault.pick(api_path, method)
            if injected is not None and state.fault.after_apply:
                await _serve(request, method, api_path, key)
            response: Response
            if injected is not None:
                with state.lock:
                    state.faults_injected += 1
                response = _fault(injected, state.fault.retry_after)
            else:
                response = await _serve(request, method, api_path, key)
        except HTTPError as exc:
            response = _error(exc.status, exc.message, exc.errors, exc.headers)
        except KeyError:
            response = _error(404, "Not Found")
        if state.validate and api_path is not None:
            _check_response(method, api_path, response)
        status = response.status_code
        response.headers.update(
            {
                "x-ratelimit-limit": str(lim),
                "x-ratelimit-remaining": str(left),
                "x-ratelimit-reset": str(reset),
                "x-ratelimit-used": str(lim - left),
                "x-ratelimit-resource": "core",
                "x-github-media-type": "github.v3; format=json",
                "x-github-request-id": secrets.token_hex(8).upper(),
            }
        )
        with state.lock:
            state.requests.append((method, api_path or path, status))
        return response

    app = Starlette(
        routes=[
            Route("/_blobs/{key}.zip", blob, methods=["GET"]),
            Route("/{path:path}", dispatcher, methods=["GET", "POST", "PATCH", "PUT", "DELETE"]),
        ]
    )
    app.state.prefix = prefix
    return app
