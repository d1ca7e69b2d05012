"""The GitHub Actions backend: dispatch a plan to self-hosted runners, collect their Results.

One ``workflow_dispatch`` of ``drift-audit-gpu.yml`` per runner label, on the
default branch (so the workflow definition never comes from the pull request),
with the label's share of the plan inline when it fits GitHub's input limit and
a URL otherwise. The run is named ``Drift Audit <audit id> on <label>``, which
is how a ``workflow_run`` event is matched back to its audit.

Collecting treats the artifact as untrusted input: a missing, expired,
oversized, malformed or mismatched ``results.json`` is an ``ActionsError``
that says which run and what is wrong, never a crash or a silent pass. The
artifact must carry ``results.sig``, the workflow recording step's HMAC under
this dispatch's key (``runner.signing``): results written by the tested code,
uploaded by another workflow, or replayed from another audit, head or label
are refused, and so is every result when no key is configured.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from github import GithubException

from checks.model import Results, TestPlan, from_dict, to_json
from runner import signing

WORKFLOW_FILE = "drift-audit-gpu.yml"
ARTIFACT_PREFIX = "drift-audit-"
RESULTS_FILE = "results.json"
# GitHub refuses workflow_dispatch payloads whose inputs exceed 65,535 characters in total.
INLINE_PLAN_MAX = 60_000
MAX_ARTIFACT_BYTES = 32 * 1024 * 1024  # the zip as GitHub stores it
MAX_RESULTS_BYTES = 64 * 1024 * 1024  # results.json once unzipped
_RUN_TITLE = re.compile(r"Drift Audit (?P<audit_id>\S+) on (?P<label>\S+)")


class ActionsError(RuntimeError):
    """Dispatch or collection failed; the message names the run or label and the cause."""


def artifact_name(audit_id: str, label: str) -> str:
    return f"{ARTIFACT_PREFIX}{audit_id}-{label}"


def run_title(audit_id: str, label: str) -> str:
    return f"Drift Audit {audit_id} on {label}"


def parse_run_title(title: str | None) -> tuple[str, str] | None:
    """(audit id, label) from a run's display title, or None for runs that are not ours."""
    m = _RUN_TITLE.fullmatch((title or "").strip())
    return (m.group("audit_id"), m.group("label")) if m else None


def run_of_event(payload: dict) -> tuple[int, str, str] | None:
    """(run id, audit id, label) from a ``workflow_run`` webhook payload, or None if not our run."""
    run = payload.get("workflow_run") or {}
    found = parse_run_title(run.get("display_title"))
    path = str(run.get("path", ""))
    # the file itself at its one place, not a name ending like it or the same name in another folder
    if found is None or path != f".github/workflows/{WORKFLOW_FILE}" or not run.get("id"):
        return None
    return int(run["id"]), found[0], found[1]


def _gh_error(exc: GithubException) -> str:
    data = exc.data if isinstance(exc.data, dict) else {}
    return f"GitHub answered {exc.status}: {data.get('message') or exc.data}"


# --------------------------------------------------------------------------- dispatch


@dataclass
class Dispatched:
    label: str
    ref: str
    inputs: dict[str, str] = field(default_factory=dict)


class Dispatcher:
    """Triggers the GPU workflow once per runner label of a plan.

    ``repo`` is a PyGithub Repository. ``plan_url(audit_id, label)`` is asked
    for a download URL when a label's plan is too large to pass inline.
    """

    def __init__(
        self,
        repo,
        *,
        workflow: str = WORKFLOW_FILE,
        ref: str | None = None,
        plan_url: Callable[[str, str], str] | None = None,
        inline_max: int = INLINE_PLAN_MAX,
    ):
        self.repo = repo
        self.workflow = workflow
        self.ref = ref
        self.plan_url = plan_url
        self.inline_max = inline_max

    def inputs_for(self, plan: TestPlan, label: str) -> dict[str, str]:
        share = TestPlan(audit_id=plan.audit_id, head_sha=plan.head_sha, suites=plan.for_runner(label))
        text = to_json(share, indent=None)
        inputs = {"audit_id": plan.audit_id, "head_sha": plan.head_sha, "label": label}
        if len(text) <= self.inline_max:
            inputs["plan"] = text
        elif self.plan_url is not None:
            inputs["plan_url"] = self.plan_url(plan.audit_id, label)
        else:
            raise ActionsError(
                f"the {label} plan is {len(text)} characters, over the {self.inline_max} that fit in "
                "workflow_dispatch inputs; give the dispatcher a plan_url to serve it from"
            )
        return inputs

    def dispatch(self, plan: TestPlan, labels: list[str] | None = None) -> list[Dispatched]:
        """Dispatch every label of ``plan`` (or just ``labels``); returns what was sent."""
        wanted = [lbl for lbl in plan.runners if labels is None or lbl in labels]
        if not wanted:
            return []
        ref = self.ref or self.repo.default_branch
        try:
            workflow = self.repo.get_workflow(self.workflow)
        except GithubException as exc:
            if exc.status == 404:
                raise ActionsError(
                    f"{self.repo.full_name}: workflow .github/workflows/{self.workflow} not found; "
                    "add it to the default branch (see docs/runners.md)"
                ) from None
            raise ActionsError(f"{self.repo.full_name}: cannot read the workflow: {_gh_error(exc)}") from None
        sent = []
        for label in wanted:
            inputs = self.inputs_for(plan, label)
            try:
                workflow.create_dispatch(ref, inputs, throw=True)
            except GithubException as exc:
                raise ActionsError(f"dispatching the {label} suites of {plan.audit_id} failed: {_gh_error(exc)}") from None
            sent.append(Dispatched(label=label, ref=ref, inputs=inputs))
        return sent


# --------------------------------------------------------------------------- collect


def _download(artifact, limit: int) -> bytes:
    """The artifact's zip, following GitHub's redirect to storage, refusing more than ``limit`` bytes."""
    status, _headers, chunks = artifact.requester.getStream(artifact.archive_download_url, chunk_size=64 * 1024)
    buf = io.BytesIO()
    for chunk in chunks:
        buf.write(chunk)
        if buf.tell() > limit:
            raise ActionsError(f"artifact '{artifact.name}' is over {limit} bytes; refusing to download more")
    return buf.getvalue()


def _files_from_zip(raw: bytes, where: str, max_json: int) -> tuple[bytes, bytes | None]:
    """(results.json bytes, results.sig bytes or None) from an artifact zip, within the size limits."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(raw))
    except zipfile.BadZipFile:
        raise ActionsError(f"{where}: the artifact is not a zip archive") from None
    with zf:
        def read(name: str) -> bytes | None:
            found = [i for i in zf.infolist() if i.filename.rsplit("/", 1)[-1] == name]
            if not found:
                return None
            info = found[0]
            if info.file_size > max_json:
                raise ActionsError(f"{where}: {name} is {info.file_size} bytes unzipped, over the {max_json} limit")
            with zf.open(info) as fh:
                data = fh.read(max_json + 1)
            if len(data) > max_json:
                raise ActionsError(f"{where}: {name} is over the {max_json} limit unzipped")
            return data

        results = read(RESULTS_FILE)
        if results is None:
            listed = ", ".join(i.filename for i in zf.infolist()[:5]) or "nothing"
            raise ActionsError(f"{where}: no {RESULTS_FILE} in the artifact (it holds {listed})")
        return results, read(signing.SIG_FILE)


def _parse_results(data: bytes, where: str) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ActionsError(f"{where}: {RESULTS_FILE} is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ActionsError(f"{where}: {RESULTS_FILE} is not a Results object")
    return parsed


def _repo_key(key: str | bytes | None, repo: str) -> bytes | None:
    """This repository's results key from the bot's key (``DRIFT_AUDIT_RESULTS_KEY`` when not given)."""
    bot_key = key if key is not None else os.environ.get(signing.ENV_KEY, "")
    return signing.repo_key(bot_key, repo) if bot_key else None


class Collector:
    """Fetches, verifies and validates the Results a finished workflow run uploaded.

    ``key`` is the bot's results key (default: ``$DRIFT_AUDIT_RESULTS_KEY``). Without one nothing can be
    verified, so every artifact is refused with a message saying how to configure it.
    """

    def __init__(self, repo, *, key: str | bytes | None = None, max_artifact_bytes: int = MAX_ARTIFACT_BYTES,
                 max_results_bytes: int = MAX_RESULTS_BYTES):
        self.repo = repo
        self.key = key
        self.max_artifact_bytes = max_artifact_bytes
        self.max_results_bytes = max_results_bytes

    def collect(self, run_id: int, audit_id: str, *, head_sha: str | None = None) -> Results:
        where = f"{self.repo.full_name} run {run_id}"
        try:
            run = self.repo.get_workflow_run(run_id)
            if run.status != "completed":
                raise ActionsError(f"{where} is {run.status}; collect it once it has completed")
            prefix = f"{ARTIFACT_PREFIX}{audit_id}-"
            artifacts = [a for a in run.get_artifacts() if a.name.startswith(prefix)]
        except GithubException as exc:
            if exc.status == 404:
                raise ActionsError(f"{where}: no such workflow run") from None
            raise ActionsError(f"{where}: {_gh_error(exc)}") from None
        if not artifacts:
            raise ActionsError(
                f"{where} ({run.conclusion}) uploaded no artifact named {prefix}<label>; "
                f"the runner produced no results, see {run.html_url}"
            )
        merged: Results | None = None
        for art in artifacts:
            label = art.name[len(prefix):]
            part = self._one(art, f"{where}, artifact '{art.name}'", audit_id, label, head_sha)
            merged = part if merged is None else merged.merge(part)
        assert merged is not None
        return merged

    def _one(self, art, where: str, audit_id: str, label: str, head_sha: str | None) -> Results:
        if art.expired:
            raise ActionsError(f"{where}: the artifact has expired; re-run the suites")
        if art.size_in_bytes > self.max_artifact_bytes:
            raise ActionsError(f"{where}: {art.size_in_bytes} bytes, over the {self.max_artifact_bytes} limit")
        try:
            raw = _download(art, self.max_artifact_bytes)
        except GithubException as exc:
            raise ActionsError(f"{where}: download failed: {_gh_error(exc)}") from None
        except OSError as exc:  # requests' HTTPError and connection errors
            raise ActionsError(f"{where}: download failed: {exc}") from None
        body, sig = _files_from_zip(raw, where, self.max_results_bytes)
        self._verify(body, sig, where, audit_id, label, head_sha)
        data = _parse_results(body, where)
        try:
            results = from_dict(Results, data)
        except Exception as exc:  # cattrs' structure errors carry the details
            raise ActionsError(f"{where}: {RESULTS_FILE} is not a valid Results object: {_describe(exc)}") from None
        if results.audit_id != audit_id:
            raise ActionsError(f"{where}: results are for audit '{results.audit_id}', not '{audit_id}'")
        if head_sha and results.head_sha != head_sha:
            raise ActionsError(f"{where}: results are for head {results.head_sha[:12]}, not {head_sha[:12]}")
        if any(s.runner != label for s in results.suites):
            raise ActionsError(f"{where}: results name runners other than '{label}'")
        return results

    def _verify(self, body: bytes, sig: bytes | None, where: str, audit_id: str, label: str,
                head_sha: str | None) -> None:
        key = _repo_key(self.key, self.repo.full_name)
        if key is None:
            raise ActionsError(
                f"{where}: cannot verify the results: no results key is configured (set {signing.ENV_KEY} on "
                "the bot and the repository's key as the Actions secret of that name, see docs/runners.md)"
            )
        if head_sha is None and sig is not None:  # the signature names the head it was dispatched for
            try:
                head_sha = str(json.loads(sig).get("head_sha", ""))
            except (ValueError, AttributeError, UnicodeDecodeError):
                head_sha = ""
        dispatch = signing.Dispatch(self.repo.full_name, audit_id, label, head_sha or "")
        try:
            signing.verify(body, sig, key, dispatch)
        except signing.SignatureError as exc:
            raise ActionsError(f"{where}: refused: {exc}") from None


def _describe(exc: Exception) -> str:
    subs = getattr(exc, "exceptions", None)
    if subs:
        return "; ".join(_describe(e) for e in subs[:3])
    notes = getattr(exc, "__notes__", None)
    return f"{exc}" + (f" ({'; '.join(notes)})" if notes else "")
