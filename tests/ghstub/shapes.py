"""GitHub's JSON shapes, complete: every field the REST description marks required.

The stand-in's records hold what tests seed and inspect; these builders turn
them into the objects GitHub answers with, so a client that reads any required
field finds it, and the contract check of every response passes.
"""

from __future__ import annotations

from typing import Any

from tests.ghstub.state import StubState, iso, user_json

WEB = "https://github.example"

_REPO_URLS = {
    "archive_url": "/{archive_format}{/ref}",
    "assignees_url": "/assignees{/user}",
    "blobs_url": "/git/blobs{/sha}",
    "branches_url": "/branches{/branch}",
    "collaborators_url": "/collaborators{/collaborator}",
    "comments_url": "/comments{/number}",
    "commits_url": "/commits{/sha}",
    "compare_url": "/compare/{base}...{head}",
    "contents_url": "/contents/{+path}",
    "contributors_url": "/contributors",
    "deployments_url": "/deployments",
    "downloads_url": "/downloads",
    "events_url": "/events",
    "forks_url": "/forks",
    "git_commits_url": "/git/commits{/sha}",
    "git_refs_url": "/git/refs{/sha}",
    "git_tags_url": "/git/tags{/sha}",
    "hooks_url": "/hooks",
    "issue_comment_url": "/issues/comments{/number}",
    "issue_events_url": "/issues/events{/number}",
    "issues_url": "/issues{/number}",
    "keys_url": "/keys{/key_id}",
    "labels_url": "/labels{/name}",
    "languages_url": "/languages",
    "merges_url": "/merges",
    "milestones_url": "/milestones{/number}",
    "notifications_url": "/notifications{?since,all,participating}",
    "pulls_url": "/pulls{/number}",
    "releases_url": "/releases{/id}",
    "stargazers_url": "/stargazers",
    "statuses_url": "/statuses/{sha}",
    "subscribers_url": "/subscribers",
    "subscription_url": "/subscription",
    "tags_url": "/tags",
    "teams_url": "/teams",
    "trees_url": "/git/trees{/sha}",
}


def public(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def repository(base: str, r: dict, *, full_name: str | None = None) -> dict:
    """A full-repository (also a valid repository and minimal-repository)."""
    name = full_name or r["full_name"]
    owner, short = name.split("/", 1)
    url = f"{base}/repos/{name}"
    out: dict[str, Any] = {k: url + suffix for k, suffix in _REPO_URLS.items()}
    out.update(
        id=r["id"],
        node_id=r["node_id"],
        name=short,
        full_name=name,
        owner=user_json(owner, "Organization"),
        private=r["private"],
        fork=r.get("fork", False),
        description=None,
        url=url,
        html_url=f"{WEB}/{name}",
        clone_url=r.get("clone_url") or f"{WEB}/{name}.git",
        git_url=f"git://github.example/{name}.git",
        ssh_url=f"git@github.example:{name}.git",
        svn_url=f"{WEB}/{name}",
        mirror_url=None,
        homepage=None,
        language="Python",
        default_branch=r["default_branch"],
        forks=0,
        forks_count=0,
        stargazers_count=0,
        watchers=0,
        watchers_count=0,
        open_issues=0,
        open_issues_count=0,
        network_count=0,
        subscribers_count=0,
        size=1,
        has_issues=True,
        has_projects=False,
        has_wiki=False,
        has_pages=False,
        has_downloads=False,
        has_discussions=False,
        archived=False,
        disabled=False,
        license=None,
        pushed_at=iso(),
        created_at=iso(),
        updated_at=iso(),
    )
    return out


def _link(href: str) -> dict:
    return {"href": href}


def pull_request(base: str, state: StubState, pr: dict, full: str) -> dict:
    url = f"{base}/repos/{full}/pulls/{pr['number']}"
    issue = f"{base}/repos/{full}/issues/{pr['number']}"
    html = f"{WEB}/{full}/pull/{pr['number']}"
    author = user_json(pr["user"]["login"])

    def side(s: dict) -> dict:
        repo = repository(base, s["repo"], full_name=s["repo"]["full_name"])
        repo["fork"] = s["repo"].get("fork", False)
        return {"label": s["label"], "ref": s["ref"], "sha": s["sha"], "repo": repo, "user": repo["owner"]}

    files = state.pull_files.get((full, pr["number"]), [])
    return {
        "id": pr["id"],
        "node_id": f"PR_{pr['id']}",
        "number": pr["number"],
        "state": pr["state"],
        "locked": False,
        "title": pr["title"],
        "body": pr["body"],
        "draft": pr["draft"],
        "user": author,
        "author_association": pr["author_association"],
        "head": side(pr["head"]),
        "base": side(pr["base"]),
        "url": url,
        "html_url": html,
        "diff_url": html + ".diff",
        "patch_url": html + ".patch",
        "issue_url": issue,
        "comments_url": issue + "/comments",
        "commits_url": url + "/commits",
        "review_comments_url": url + "/comments",
        "review_comment_url": f"{base}/repos/{full}/pulls/comments{{/number}}",
        "statuses_url": f"{base}/repos/{full}/statuses/{pr['head']['sha']}",
        "_links": {
            "self": _link(url),
            "html": _link(html),
            "issue": _link(issue),
            "comments": _link(issue + "/comments"),
            "review_comments": _link(url + "/comments"),
            "review_comment": _link(f"{base}/repos/{full}/pulls/comments{{/number}}"),
            "commits": _link(url + "/commits"),
            "statuses": _link(f"{base}/repos/{full}/statuses/{pr['head']['sha']}"),
        },
        "assignee": None,
        "assignees": [],
        "labels": [],
        "milestone": None,
        "auto_merge": None,
        "merged": pr["merged"],
        "merged_at": None,
        "merged_by": None,
        "merge_commit_sha": None,
        "mergeable": pr["mergeable"],
        "mergeable_state": "clean",
        "maintainer_can_modify": False,
        "comments": len(state.comments_on(full, pr["number"])),
        "review_comments": 0,
        "commits": 1,
        "additions": sum(int(f.get("additions", 0)) for f in files),
        "deletions": sum(int(f.get("deletions", 0)) for f in files),
        "changed_files": len(files),
        "closed_at": None,
        "created_at": pr["created_at"],
        "updated_at": pr["updated_at"],
    }


def issue(base: str, state: StubState, pr: dict, full: str) -> dict:
    n = pr["number"]
    url = f"{base}/repos/{full}/issues/{n}"
    html = f"{WEB}/{full}/pull/{n}"
    return {
        "id": pr["id"],
        "node_id": f"I_{pr['id']}",
        "number": n,
        "title": pr["title"],
        "body": pr["body"],
        "state": pr["state"],
        "locked": False,
        "user": user_json(pr["user"]["login"]),
        "author_association": pr["author_association"],
        "url": url,
        "html_url": html,
        "repository_url": f"{base}/repos/{full}",
        "labels_url": url + "/labels{/name}",
        "comments_url": url + "/comments",
        "events_url": url + "/events",
        "labels": [],
        "assignee": None,
        "assignees": [],
        "milestone": None,
        "comments": len(state.comments_on(full, n)),
        "pull_request": {"url": f"{base}/repos/{full}/pulls/{n}", "html_url": html, "diff_url": html + ".diff",
                         "patch_url": html + ".patch"},
        "closed_at": None,
        "created_at": pr["created_at"],
        "updated_at": pr["updated_at"],
    }


def app(state: StubState, app_id: int | None = None) -> dict:
    """An integration (GitHub App) object; ours unless ``app_id`` names another app."""
    ident = state.app_id if app_id is None else app_id
    slug = state.slug_of(ident)
    return {
        "id": ident,
        "slug": slug,
        "node_id": f"APP_{ident}",
        "name": "Drift Audit" if ident == state.app_id else slug,
        "description": None,
        "owner": user_json("octo-org", "Organization"),
        "external_url": f"{WEB}/apps/{slug}",
        "html_url": f"{WEB}/apps/{slug}",
        "created_at": iso(0),
        "updated_at": iso(0),
        "permissions": {"checks": "write", "issues": "write", "contents": "read", "metadata": "read"},
        "events": ["pull_request", "issue_comment", "check_run", "merge_group", "workflow_run"],
    }


def comment(base: str, state: StubState, c: dict) -> dict:
    url = f"{base}/repos/{c['_repo']}/issues/comments/{c['id']}"
    out = dict(
        public(c),
        url=url,
        html_url=f"{WEB}/{c['_repo']}/pull/{c['_issue']}#issuecomment-{c['id']}",
        issue_url=f"{base}/repos/{c['_repo']}/issues/{c['_issue']}",
    )
    if c.get("_app") is not None:
        out["performed_via_github_app"] = app(state, c["_app"])
    return out


def reaction(r: dict) -> dict:
    return dict(r, user=user_json(r["user"]["login"], r["user"].get("type", "User")))


def check_run(base: str, state: StubState, c: dict, annotations: int) -> dict:
    url = f"{base}/repos/{c['_repo']}/check-runs/{c['id']}"
    out = public(c)
    output = c["output"]
    out.update(
        url=url,
        html_url=f"{WEB}/{c['_repo']}/runs/{c['id']}",
        output={
            "title": output.get("title"),
            "summary": output.get("summary"),
            "text": output.get("text"),
            "annotations_count": annotations,
            "annotations_url": url + "/annotations",
        },
        app=app(state, c.get("_app")),
        check_suite={"id": 1},
        pull_requests=[],
    )
    return out


def workflow(base: str, wf: dict) -> dict:
    url = f"{base}/repos/{wf['_repo']}/actions/workflows/{wf['id']}"
    return dict(
        public(wf),
        url=url,
        html_url=f"{WEB}/{wf['_repo']}/blob/main/{wf['path']}",
        badge_url=f"{WEB}/{wf['_repo']}/workflows/{wf['name']}/badge.svg",
    )


def workflow_run(base: str, state: StubState, r: dict) -> dict:
    url = f"{base}/repos/{r['_repo']}/actions/runs/{r['id']}"
    repo = repository(base, state.repos[r["_repo"]])
    return dict(
        public(r),
        url=url,
        html_url=f"{WEB}/{r['_repo']}/actions/runs/{r['id']}",
        artifacts_url=url + "/artifacts",
        jobs_url=url + "/jobs",
        logs_url=url + "/logs",
        check_suite_url=f"{base}/repos/{r['_repo']}/check-suites/1",
        cancel_url=url + "/cancel",
        rerun_url=url + "/rerun",
        workflow_url=f"{base}/repos/{r['_repo']}/actions/workflows/{r['workflow_id']}",
        head_commit=None,
        head_repository=repo,
        repository=repo,
        pull_requests=[],
    )


def artifact(base: str, a: dict) -> dict:
    url = f"{base}/repos/{a['_repo']}/actions/artifacts/{a['id']}"
    return dict(public(a), url=url, archive_download_url=url + "/zip")


def installation(base: str, inst: dict) -> dict:
    return dict(
        inst,
        account=user_json(inst["account"]["login"], inst["account"].get("type", "Organization")),
        access_tokens_url=f"{base}/app/installations/{inst['id']}/access_tokens",
        repositories_url=f"{base}/installation/repositories",
        suspended_by=None,
        suspended_at=None,
    )


def commit(base: str, full: str, sha: str) -> dict:
    url = f"{base}/repos/{full}/commits/{sha}"
    person = {"name": "A Developer", "email": "dev@example.com", "date": iso()}
    return {
        "sha": sha,
        "node_id": f"C_{sha[:12]}",
        "url": url,
        "html_url": f"{WEB}/{full}/commit/{sha}",
        "comments_url": url + "/comments",
        "commit": {
            "author": person,
            "committer": person,
            "message": "",
            "comment_count": 0,
            "tree": {"sha": sha, "url": f"{base}/repos/{full}/git/trees/{sha}"},
            "url": f"{base}/repos/{full}/git/commits/{sha}",
        },
        "author": None,
        "committer": None,
        "parents": [],
        "files": [],
    }


def diff_entry(base: str, full: str, head_sha: str, f: dict) -> dict:
    raw = f"{WEB}/{full}/raw/{head_sha}/{f['filename']}"
    return dict(
        {
            "sha": None,
            "additions": 0,
            "deletions": 0,
            "changes": 0,
            "status": "modified",
            "blob_url": f"{WEB}/{full}/blob/{head_sha}/{f['filename']}",
            "raw_url": raw,
            "contents_url": f"{base}/repos/{full}/contents/{f['filename']}?ref={head_sha}",
        },
        **f,
    )
