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
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.ghstub.state import StubState, iso

DOCS = "https://docs.github.com/rest"
COMMENT_MAX = 65536
CHECK_TEXT_MAX = 65535
ANNOTATIONS_PER_REQUEST = 50
CONCLUSIONS = {"action_required", "cancelled", "failure", "neutral", "success", "skipped", "timed_out"}
STATUSES = {"queued", "in_progress", "completed", "waiting", "requested", "pending"}
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


def public(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


# --------------------------------------------------------------------------- representation


def repo_json(ctx: Ctx, r: dict) -> dict:
    url = f"{ctx.base}/repos/{r['full_name']}"
    return dict(public(r), url=url, pulls_url=url + "/pulls{/number}", issues_url=url + "/issues{/number}")


def pull_json(ctx: Ctx, pr: dict, full: str) -> dict:
    url = f"{ctx.base}/repos/{full}/pulls/{pr['number']}"
    out = public(pr)
    out["head"] = dict(pr["head"], repo=repo_json(ctx, pr["head"]["repo"]))
    out["base"] = dict(pr["base"], repo=repo_json(ctx, pr["base"]["repo"]))
    return dict(
        out,
        url=url,
        issue_url=f"{ctx.base}/repos/{full}/issues/{pr['number']}",
        comments_url=f"{ctx.base}/repos/{full}/issues/{pr['number']}/comments",
        html_url=f"https://github.example/{full}/pull/{pr['number']}",
    )


def comment_json(ctx: Ctx, c: dict) -> dict:
    url = f"{ctx.base}/repos/{c['_repo']}/issues/comments/{c['id']}"
    return dict(
        public(c),
        url=url,
        html_url=f"https://github.example/{c['_repo']}/pull/{c['_issue']}#issuecomment-{c['id']}",
        issue_url=f"{ctx.base}/repos/{c['_repo']}/issues/{c['_issue']}",
    )


def check_json(ctx: Ctx, c: dict) -> dict:
    out = public(c)
    out["output"] = dict(
        c["output"],
        annotations_count=len(ctx.state.annotations.get(c["id"], [])),
        annotations_url=f"{ctx.base}/repos/{c['_repo']}/check-runs/{c['id']}/annotations",
    )
    return dict(out, url=f"{ctx.base}/repos/{c['_repo']}/check-runs/{c['id']}")


def run_json(ctx: Ctx, r: dict) -> dict:
    url = f"{ctx.base}/repos/{r['_repo']}/actions/runs/{r['id']}"
    return dict(
        public(r),
        url=url,
        artifacts_url=url + "/artifacts",
        jobs_url=url + "/jobs",
        html_url=f"https://github.example/{r['_repo']}/actions/runs/{r['id']}",
        repository=repo_json(ctx, ctx.state.repos[r["_repo"]]),
    )


def artifact_json(ctx: Ctx, a: dict) -> dict:
    url = f"{ctx.base}/repos/{a['_repo']}/actions/artifacts/{a['id']}"
    return dict(public(a), url=url, archive_download_url=url + "/zip")


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
    s = ctx.state
    return JSONResponse(
        {
            "id": s.app_id,
            "slug": s.app_slug,
            "name": "Drift Audit",
            "node_id": "APP",
            "owner": {"login": "octo-org", "id": 1},
            "created_at": iso(),
            "updated_at": iso(),
            "permissions": {},
            "events": [],
            "installations_count": len(s.installations),
        }
    )


def repo_installation(ctx: Ctx) -> Response:
    inst = (
        ctx.state.installations[
            ctx.state.repos.get(f"{ctx.params['owner']}/{ctx.params['repo']}", {}).get("_installation", -1)
        ]
        if f"{ctx.params['owner']}/{ctx.params['repo']}" in ctx.state.repos
        else None
    )
    if inst is None:
        raise not_found()
    return JSONResponse(dict(inst, access_tokens_url=f"{ctx.base}/app/installations/{inst['id']}/access_tokens"))


def access_token(ctx: Ctx) -> Response:
    iid = int(ctx.params["id"])
    if iid not in ctx.state.installations:
        raise not_found()
    return JSONResponse(ctx.state.mint_token(iid), status_code=201)


def rate_limit(ctx: Ctx) -> Response:
    lim, left, reset = ctx.state.consume(ctx.auth.get("key", "anon"))
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
    return paginate(ctx, ctx.state.pull_files.get((ctx.repo["full_name"], pr["number"]), [])[:3000])


def get_issue(ctx: Ctx) -> Response:
    full = ctx.repo["full_name"]
    n = int(ctx.params["number"])
    pr = ctx.state.pulls.get((full, n))
    if pr is None:
        raise not_found()
    url = f"{ctx.base}/repos/{full}/issues/{n}"
    return JSONResponse(
        {
            "id": pr["id"],
            "number": n,
            "title": pr["title"],
            "body": pr["body"],
            "state": pr["state"],
            "user": pr["user"],
            "url": url,
            "comments_url": url + "/comments",
            "pull_request": {"url": f"{ctx.base}/repos/{full}/pulls/{n}"},
            "created_at": pr["created_at"],
            "updated_at": pr["updated_at"],
        }
    )


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
    c = ctx.state.add_comment(full, n, body, user=f"{ctx.state.app_slug}[bot]")
    c["user"]["type"] = "Bot"
    return JSONResponse(comment_json(ctx, c), status_code=201)


def _comment(ctx: Ctx) -> dict:
    full = ctx.repo["full_name"]
    c = ctx.state.comments.get(int(ctx.params["id"]))
    if c is None or c["_repo"] != full:
        raise not_found()
    return c


def get_comment(ctx: Ctx) -> Response:
    return JSONResponse(comment_json(ctx, _comment(ctx)))


def update_comment(ctx: Ctx) -> Response:
    c = _comment(ctx)
    body = _body(ctx)
    with ctx.state.lock:
        c.update(body=body, updated_at=iso())
    return JSONResponse(comment_json(ctx, c))


def create_reaction(ctx: Ctx) -> Response:
    c = _comment(ctx)
    content = (ctx.body or {}).get("content")
    if content not in REACTIONS:
        raise invalid("Reaction", "content", f"content is not included in the list {sorted(REACTIONS)}", "invalid")
    user = f"{ctx.state.app_slug}[bot]"
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
            "user": {"login": user, "id": 99, "type": "Bot"},
        }
        ctx.state.reactions[c["id"]].append(r)
    return JSONResponse(r, status_code=201)


def list_reactions(ctx: Ctx) -> Response:
    c = _comment(ctx)
    return paginate(ctx, list(ctx.state.reactions.get(c["id"], [])))


# --------------------------------------------------------------------------- check runs


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
    clean = []
    for a in annotations:
        for key in ("path", "start_line", "end_line", "annotation_level", "message"):
            if key not in a:
                raise invalid("CheckRun", f"output.annotations.{key}", f"{key} wasn't supplied", "missing_field")
        if a["annotation_level"] not in LEVELS:
            raise invalid("CheckRun", "output.annotations.annotation_level", "annotation_level is invalid", "invalid")
        clean.append(dict(a, blob_href=""))
    kept = {"title": output["title"], "summary": output["summary"], "text": output.get("text")}
    return kept, clean


def _check_fields(ctx: Ctx, data: dict, c: dict) -> None:
    status = data.get("status", c.get("status"))
    if status not in STATUSES:
        raise invalid("CheckRun", "status", "status is not included in the list", "invalid")
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


def create_check(ctx: Ctx) -> Response:
    r = ctx.repo
    data = ctx.body or {}
    for key in ("name", "head_sha"):
        if not data.get(key):
            raise invalid("CheckRun", key, f"{key} wasn't supplied", "missing_field")
    if not re.fullmatch(r"[0-9a-f]{40}", data["head_sha"]):
        raise invalid("CheckRun", "head_sha", "head_sha is not a valid commit SHA", "invalid")
    cid = ctx.state.next_id()
    c = {
        "id": cid,
        "node_id": f"CR_{cid}",
        "head_sha": data["head_sha"],
        "name": data["name"],
        "external_id": "",
        "details_url": None,
        "status": "queued",
        "conclusion": None,
        "started_at": iso(),
        "completed_at": None,
        "output": {"title": None, "summary": None, "text": None},
        "app": {"id": ctx.state.app_id, "slug": ctx.state.app_slug},
        "pull_requests": [],
        "check_suite": {"id": 1},
        "_repo": r["full_name"],
    }
    _check_fields(ctx, data, c)
    with ctx.state.lock:
        ctx.state.check_runs[cid] = c
    return JSONResponse(check_json(ctx, c), status_code=201)


def _check(ctx: Ctx) -> dict:
    c = ctx.state.check_runs.get(int(ctx.params["id"]))
    if c is None or c["_repo"] != ctx.repo["full_name"]:
        raise not_found()
    return c


def get_check(ctx: Ctx) -> Response:
    return JSONResponse(check_json(ctx, _check(ctx)))


def update_check(ctx: Ctx) -> Response:
    c = _check(ctx)
    _check_fields(ctx, ctx.body or {}, c)
    return JSONResponse(check_json(ctx, c))


def check_annotations(ctx: Ctx) -> Response:
    c = _check(ctx)
    return paginate(ctx, list(ctx.state.annotations.get(c["id"], [])))


def get_commit(ctx: Ctx) -> Response:
    """Commits are not modelled; any full SHA is answered so ``Repository.get_commit`` works."""
    full = ctx.repo["full_name"]
    ref = ctx.params["ref"]
    if not re.fullmatch(r"[0-9a-f]{40}", ref):
        raise HTTPError(422, f"No commit found for SHA: {ref}")
    url = f"{ctx.base}/repos/{full}/commits/{ref}"
    return JSONResponse(
        {
            "sha": ref,
            "node_id": "C",
            "url": url,
            "html_url": url,
            "files": [],
            "parents": [],
            "commit": {"message": "", "tree": {"sha": ref}, "url": url},
        }
    )


def checks_for_ref(ctx: Ctx) -> Response:
    full = ctx.repo["full_name"]
    ref = ctx.params["ref"]
    name = ctx.q("check_name")
    items = [check_json(ctx, c) for c in ctx.state.check_runs_for(full, ref, name)]
    return paginate(ctx, sorted(items, key=lambda c: -c["id"]), wrap="check_runs")


# --------------------------------------------------------------------------- collaborators


def collaborator_permission(ctx: Ctx) -> Response:
    full = ctx.repo["full_name"]
    login = ctx.params["user"]
    perm = ctx.state.permissions.get((full, login), "read")
    role = {"admin": "admin", "maintain": "maintain", "write": "write", "triage": "triage", "read": "read"}.get(
        perm, "none"
    )
    legacy = {"maintain": "write", "triage": "read"}.get(perm, perm)  # GitHub's legacy "permission" field
    return JSONResponse(
        {"permission": legacy, "role_name": role, "user": {"login": login, "id": 5, "type": "User", "permissions": {}}}
    )


# --------------------------------------------------------------------------- actions


def _workflow(ctx: Ctx) -> dict:
    full = ctx.repo["full_name"]
    key = ctx.params["wf"]
    for (repo, file), wf in ctx.state.workflows.items():
        if repo == full and (file == key or str(wf["id"]) == key):
            return wf
    raise not_found()


def get_workflow(ctx: Ctx) -> Response:
    wf = _workflow(ctx)
    url = f"{ctx.base}/repos/{wf['_repo']}/actions/workflows/{wf['id']}"
    return JSONResponse(dict(public(wf), url=url, html_url=url, badge_url=url + "/badge"))


def dispatch(ctx: Ctx) -> Response:
    wf = _workflow(ctx)
    data = ctx.body or {}
    if not isinstance(data.get("ref"), str) or not data["ref"]:
        raise HTTPError(422, 'Invalid request.\n\n"ref" wasn\'t supplied.')
    inputs = data.get("inputs") or {}
    if not isinstance(inputs, dict):
        raise HTTPError(422, "Invalid request.\n\nFor 'properties/inputs', is not an object.")
    if len(inputs) > 25:
        raise HTTPError(422, "you may only define up to 25 `inputs` for a `workflow_dispatch` event")
    declared = wf.get("_inputs")
    if declared is not None:
        extra = sorted(set(inputs) - set(declared))
        if extra:
            raise HTTPError(422, f"Unexpected inputs provided: {json.dumps(extra)}")
    for k, v in inputs.items():
        if not isinstance(v, (str, int, float, bool)):
            raise HTTPError(422, f"Invalid request.\n\nFor 'properties/{k}', is not a string.")
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
        return {"kind": "app", "key": f"app:{state.app_id}"}
    if scheme in ("token", "bearer") and cred:
        with state.lock:
            info = state.tokens.get(cred)
        if info is None or info["expires_at"] < time.time():
            raise HTTPError(401, "Bad credentials")
        return {
            "kind": "installation",
            "installation_id": info["installation_id"],
            "key": f"inst:{info['installation_id']}",
        }
    if need == "any":
        return {"kind": "none", "key": request.client.host if request.client else "anon"}
    raise HTTPError(401, "Requires authentication")


def _error(status: int, message: str, errors: list[dict] | None = None, headers: dict | None = None) -> JSONResponse:
    body: dict[str, Any] = {"message": message, "documentation_url": DOCS, "status": str(status)}
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, headers=headers)


def _fault(status: int, retry_after: int) -> JSONResponse:
    if status == 403:
        return _error(
            403,
            "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
            "If you reach out to GitHub Support for help, please include the request ID.",
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

    async def _serve(request: Request, method: str, api_path: str) -> Response:
        for m, rx, handler, need in _COMPILED:
            match = rx.match(api_path)
            if match and m == method:
                break
        else:
            raise not_found()
        auth = _authenticate(state, request, need)
        raw = await request.body()
        body = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                raise HTTPError(400, "Problems parsing JSON") from None
        base = str(request.base_url).rstrip("/") + prefix
        ctx = Ctx(state, request, match.groupdict(), body, base, auth)
        return handler(ctx)

    async def dispatcher(request: Request) -> Response:
        path = "/" + request.path_params.get("path", "")
        api_path = path[len(prefix) :] if prefix and path.startswith(prefix) else (None if prefix else path)
        method = request.method
        try:
            if api_path is None:
                raise not_found()
            with state.lock:
                state.arrivals.append((method, api_path))
                stall = max(
                    (
                        sec
                        for key, sec in state.delays.items()
                        if key.split(" ", 1)[0] == method and key.split(" ", 1)[1] in api_path
                    ),
                    default=0,
                )
            if stall:
                await asyncio.sleep(stall)
            injected = state.fault.pick(api_path, method)
            if injected is not None and state.fault.after_apply:
                await _serve(request, method, api_path)
            if injected is not None:
                with state.lock:
                    state.faults_injected += 1
                response = _fault(injected, state.fault.retry_after)
            else:
                response = await _serve(request, method, api_path)
        except HTTPError as exc:
            response = _error(exc.status, exc.message, exc.errors, exc.headers)
        except KeyError:
            response = _error(404, "Not Found")
        status = response.status_code
        lim, left, reset = state.consume(request.headers.get("authorization", "anon")[-24:])
        response.headers.update(
            {
                "X-RateLimit-Limit": str(lim),
                "X-RateLimit-Remaining": str(left),
                "X-RateLimit-Reset": str(reset),
                "X-RateLimit-Used": str(lim - left),
                "X-RateLimit-Resource": "core",
                "X-GitHub-Media-Type": "github.v3; format=json",
                "X-GitHub-Request-Id": secrets.token_hex(8).upper(),
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
