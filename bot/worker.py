"""Workers: lease a job, run it, publish, finish; a crash anywhere means the job runs again.

Each kind of job has one handler; an audit goes job → ``AuditTask`` →
``AuditRequest`` → plan/run → report → publish. A failure the user has to fix
(a malformed base config, an unknown suite) is a typed result, ``Unrunnable``,
published once: ``neutral`` for the base config's owner, and for a command the
conclusion the commit already had (a typo changes nothing). Anything else is an
exception and the job is retried with backoff, then concluded so that it never
passes a required check: ``failure`` when the pipeline crashed on the PR's
input (``AuditCrashed``, tried twice), ``cancelled`` with how to re-run it when
what failed was around the audit (GitHub, the network, the fetch, the store),
on the check run, the PR's comment and the details page (``bot.sweeper.gave_up``).

A job's lease is renewed by a heartbeat while it runs. If the process dies,
the lease runs out and another worker (or the restarted service) takes the job
over from the start; publishing is idempotent (see ``bot.publish``), so the
re-run edits the same comment and check run instead of adding new ones. Every
check run a job opens is recorded first, and ``bot.sweeper`` concludes the
ones whose job ended without doing so.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

from github import GithubException

from bot.commands import HELP, Command, find_command, parse_command
from bot.events import is_untrusted
from bot.github import GitHubApp
from bot.gpu import GpuDispatch, actions_module, failed_suites, merge_results
from bot.jobs import AuditJob, CollectJob, CommandJob, InstallationJob, Job, RerunJob
from bot.mirror import Mirrors
from bot.payloads import Fields
from bot.publish import COMMENT_MARKER, Publisher, own_runs, reply_marker, split_comment
from bot.queue import DONE, FAILED, SUPERSEDED, AuditRecord, JobRow, JobStore
from bot.security import Gate, RedactingFilter, Redactor, details_url, gpu_gate, is_writer
from bot.settings import BotSettings
from bot.sweeper import RETRY, Sweeper, gave_up
from checks.config import ConfigError
from checks.model import Audit, AuditOptions, AuditRequest, Report, Results, SuiteResult, from_json, to_json
from runner.report.safe import code
from runner.select import SelectionError

log = logging.getLogger("drift_audit.worker")
LOGGERS = ("drift_audit.worker", "drift_audit.sweeper", "drift_audit.app")  # what a Service's redactor filters
PERMANENT_HTTP = (400, 401, 404, 410, 422)
CRASH_ATTEMPTS = 2  # an audit that crashed is tried once more (a transient MemoryError), then concluded


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the config owner's or the commenter's to fix: answered once, never retried."""
    found: list[type[Exception]] = [ConfigError, SelectionError]
    for module, name in (("checks.facts", "FactError"), ("checks.scope", "ScopeError"),
                         ("runner.pipeline", "RequestError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


USER_ERRORS = _user_errors()


class LeaseLost(RuntimeError):
    """Another worker owns this job now; stop without publishing."""


class AuditCrashed(RuntimeError):
    """The GitHub-free pipeline (git, the diff, tree-sitter, the checks, the report) raised on this input.

    Its name starts the job's error text, which is how ``bot.sweeper.gave_up`` tells a crash (``failure``: the
    same input crashes it again) from the infrastructure around the audit (``cancelled``: re-run it)."""


@dataclass
class Unrunnable:
    """The audit cannot run on this input (bad base config, unknown suite): answered, never retried."""

    message: str


@dataclass
class AuditTask:
    """One audit to run and publish, whatever job asked for it."""

    head_sha: str
    base_sha: str
    pr: int | None
    trigger: str
    options: AuditOptions
    gate: Gate
    reuse_run: int | None = None  # a check run to conclude again instead of a new one
    external_id: str = ""
    reply_to: int | None = None  # the /audit comment to answer when the audit cannot run
    command: str = ""
    nonce: str = ""
    outcome: Unrunnable | None = field(default=None, init=False)


class _Heartbeat:
    def __init__(self, store: JobStore, job_id: int, owner: str, lease: float):
        self.store, self.job_id, self.owner, self.lease = store, job_id, owner, lease
        self.ok = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"heartbeat:{job_id}")

    def _run(self) -> None:
        while not self._stop.wait(self.lease / 3):
            if not self.store.heartbeat(self.job_id, self.owner, self.lease):
                self.ok = False
                return

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def check(self) -> None:
        if not self.ok:
            raise LeaseLost(f"job {self.job_id}: lease lost")


class Service:
    """The worker pool plus everything a job needs: store, GitHub App, mirrors, settings."""

    def __init__(
        self, settings: BotSettings, store: JobStore, app: GitHubApp | None = None, mirrors: Mirrors | None = None
    ):
        self.settings = settings
        self.store = store
        self.app = app or GitHubApp(settings)
        self.mirrors = mirrors or Mirrors(settings.mirrors)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._wake = threading.Event()
        self._announce = threading.Event()
        self.owner_prefix = f"{socket.gethostname()}:{os.getpid()}"
        self._login: str | None = settings.bot_login or None
        self.sweeper = Sweeper(store, self._repo_of, settings.check_name, gpu_timeout=settings.gpu_timeout,
                               announce_wait=settings.announce_wait, app_id=settings.app_id or None,
                               on_gave_up=lambda repo, row, conclusion, title: self._comment_gave_up(
                                   repo, row, conclusion, title, late=True))
        self.redact = Redactor(settings, self.app.issued_tokens)  # every error text passes it on its way out
        self._log_filter = RedactingFilter(self.redact)
        for name in LOGGERS:
            logging.getLogger(name).addFilter(self._log_filter)

    # ------------------------------------------------------------------ pool
    def start(self, workers: int | None = None) -> None:
        """``workers=0`` runs intake only (jobs wait in the store for another replica)."""
        count = self.settings.workers if workers is None else workers
        if count:
            for target, name in ((self._announce_loop, "announcer"), (self._sweep_loop, "sweeper")):
                t = threading.Thread(target=target, daemon=True, name=name)
                t.start()
                self._threads.append(t)
        for i in range(count):
            t = threading.Thread(target=self._loop, args=(f"{self.owner_prefix}:{i}",), daemon=True, name=f"worker-{i}")
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._announce.set()
        for t in self._threads:
            t.join(timeout=30)
        for name in LOGGERS:
            logging.getLogger(name).removeFilter(self._log_filter)

    def wake(self) -> None:
        self._wake.set()
        self._announce.set()

    def _sweep_loop(self) -> None:
        """Once at start-up, then every ``sweep_seconds``: check runs whose job ended unconcluded."""
        while not self._stop.is_set():
            try:
                self.sweeper.sweep()
            except Exception:
                log.exception("sweeper: unexpected error")
            self._stop.wait(self.settings.sweep_seconds)

    # ------------------------------------------------------------------ check runs at intake
    def _announce_loop(self) -> None:
        while not self._stop.is_set():
            try:
                created = self.announce_pending()
            except Exception:
                log.exception("announcer: unexpected error")
                created = 0
            if not created:
                self._announce.wait(1.0)
                self._announce.clear()

    def announce_pending(self) -> int:
        """Give every queued audit its check run (status ``queued``) while it waits for a worker."""
        created = 0
        for row in self.store.unannounced():
            job = row.job
            if self._stop.is_set() or not isinstance(job, AuditJob) or not self.store.claim_announce(row.id):
                continue
            external = self._external_id(row.id, job)
            try:
                repo = self._repo(job)
                self.store.opening_run(row.id, external)
                run = self._publisher(repo).start_check(
                    job.head_sha, external, self._details_url(row.id), status="queued")
            except Exception as exc:
                self.store.release_announce(row.id)  # the worker creates it instead
                log.warning("job %s: could not create its queued check run: %s", row.id, exc)
                continue
            self.store.set_check_run(row.id, run.id)
            created += 1
        return created

    def _await_announce(self, job_id: int) -> int | None:
        """The announcer is creating this job's check run: wait for its id (bounded; it may have died)."""
        deadline = time.monotonic() + self.settings.announce_wait
        while time.monotonic() < deadline:
            current = self.store.get(job_id)
            if current is None or current.check_run_id != 0:
                return current.check_run_id if current else None
            time.sleep(0.05)
        return None

    def _loop(self, owner: str) -> None:
        while not self._stop.is_set():
            try:
                worked = self.run_once(owner)
            except Exception:  # the loop itself must survive anything a job does
                log.exception("worker %s: unexpected error", owner)
                worked = False
            if not worked:
                self._wake.wait(0.5)
                self._wake.clear()

    def run_once(self, owner: str | None = None) -> bool:
        """Lease and run one job; False when there was nothing to do."""
        owner = owner or f"{self.owner_prefix}:once"
        row = self.store.lease(owner, self.settings.lease_seconds)
        if row is None:
            return False
        with _Heartbeat(self.store, row.id, owner, self.settings.lease_seconds) as beat:
            try:
                status = self.process(row, beat)
            except LeaseLost:
                log.warning("job %s: lease lost; leaving it to its new owner", row.id)
                return True
            except Exception as exc:
                self._failed_attempt(row, owner, exc)
                return True
        self.store.finish(row.id, owner, status)
        return True

    def _failed_attempt(self, row: JobRow, owner: str, exc: Exception) -> None:
        permanent = (isinstance(exc, GithubException) and exc.status in PERMANENT_HTTP) or (
            isinstance(exc, AuditCrashed) and row.attempts >= CRASH_ATTEMPTS)
        text = self.redact(f"{type(exc).__name__}: {exc}")
        log.warning("job %s attempt %s failed: %s", row.id, row.attempts, text)
        if permanent or row.attempts >= row.max_attempts:
            # reported while the job still holds its lease: whoever waits for the job sees the report done, and
            # should this process die here, the lease runs out and the sweeper concludes the run with this reason
            self.store.note_error(row.id, owner, text)
            self._report_failure(row, text)
        if permanent:
            self.store.finish(row.id, owner, FAILED, error=text)
        else:
            delay = self.settings.retry_backoff * 2 ** max(row.attempts - 1, 0)
            trace = self.redact(traceback.format_exc())[-1500:]
            self.store.retry_later(row.id, owner, text + "\n" + trace, delay)

    def _report_failure(self, row: JobRow, text: str) -> None:
        """Best effort: the check run, the PR's comment and the command say the audit could not finish, and
        whether re-running it can help (``bot.sweeper.gave_up``: a crash fails the check, anything else cancels
        it; neither passes a required check). If this fails too (or the process dies first), the sweeper
        concludes the check run the same way."""
        job = row.job
        if job is None:
            return
        try:
            repo = self._repo(job)
            pub = self._publisher(repo)
            conclusion, title, summary = gave_up(text, row.attempts)
            self._conclude_run_of(repo, pub, row.id, conclusion, title, summary)
            self._comment_gave_up(repo, self.store.get(row.id) or row, conclusion, title, text)
            if isinstance(job, CommandJob):
                pub.react(job.comment_id, "confused")
            if isinstance(job, CollectJob):  # the audit it was folding into waits no more: conclude its run
                record = self.store.audit(job.audit_id)
                if record and record.repo == job.repo and record.status == "awaiting-gpu" and job.label in record.pending:
                    self._conclude_run_of(repo, pub, record.job_id, conclusion, title, summary)
                    self.store.save_audit(replace(record, status="done", pending=[]))
        except Exception:
            log.exception("job %s: could not report its failure", row.id)

    def _comment_gave_up(self, repo: Any, row: JobRow, conclusion: str, title: str, error: str = "", *,
                         late: bool = False) -> None:
        """The PR's comment says the audit of its head did not finish (from the worker, or, ``late``, from the
        sweeper when the worker's own report did not land), unless a newer head has the comment by now, or (late)
        any later job of the PR, which may have audited the same head since."""
        job = row.job
        pr = getattr(job, "pr", None)
        head = row.head_sha  # a command learns its head when it runs
        if job is None or pr is None or not head or not self._current(job.repo, pr, head, row.id):
            return
        if late and self.store.has_newer(row.id):
            return
        text = self.redact(error or row.error or row.result or "")  # _gave_up_comment says when none was recorded
        self._publisher(repo).upsert_comment(pr, _gave_up_comment(conclusion, title, head, text,
                                                                  self._details_url(row.id)))

    def _current(self, full_name: str, pr: int, head: str, job_id: int) -> bool:
        """Is ``head`` still the PR's newest head as far as the bot knows? Only then may a job of it write the
        PR's comment: a newer head's comment is never overwritten with an older head's news."""
        known = self.store.known_head(full_name, pr)
        return (known is None or known == head) and not self.store.superseded_by(job_id)

    # ------------------------------------------------------------------ GitHub
    def _repo_of(self, repo: str, installation_id: int | None) -> Any:
        inst = installation_id or self.app.installation_for(repo)
        return self.app.client(inst).get_repo(repo)

    def _repo(self, job: Job) -> Any:
        if job.installation_id is None:
            job.installation_id = self.app.installation_for(job.repo)
        return self._repo_of(job.repo, job.installation_id)

    def bot_login(self) -> str:
        """The app's own account (``<slug>[bot]``): only its comments are ever edited."""
        if self._login is None:
            self._login = f"{self.app.integration().get_app().slug}[bot]"
        return self._login

    def _publisher(self, repo: Any) -> Publisher:
        return Publisher(repo, self.settings.check_name, login=self.bot_login(), app_id=self.settings.app_id or None)

    def _details_url(self, job_id: int) -> str:
        return details_url(self.settings.public_url, self.settings.webhook_secret, job_id)

    @staticmethod
    def _external_id(job_id: int, job: AuditJob) -> str:
        if job.cause == "merge_group":
            return f"mg:{job.base_sha}:{job.key.split('@', 1)[1]}"
        return f"job:{job_id}"

    # ------------------------------------------------------------------ jobs
    def process(self, row: JobRow, beat: _Heartbeat) -> str:
        job = row.job
        if isinstance(job, InstallationJob):
            log.info("installation %s: %s", job.installation_id, job.note)
            return DONE
        if isinstance(job, AuditJob):
            if row.check_run_id == 0:
                row.check_run_id = self._await_announce(row.id)
            if row.superseded_by and not row.check_run_id:
                return SUPERSEDED  # never started: nothing on GitHub to close
            return self._audit_job(row, job, beat)
        if isinstance(job, CommandJob):
            return self._command(row, job, beat)
        if isinstance(job, RerunJob):
            return self._rerun(row, job, beat)
        if isinstance(job, CollectJob):
            return self._collect(row, job, beat)
        raise TypeError(f"job {row.id}: no handler for {type(job).__name__}")  # lease() only yields typed jobs

    def _audit_job(self, row: JobRow, job: AuditJob, beat: _Heartbeat) -> str:
        repo = self._repo(job)
        task = AuditTask(
            head_sha=job.head_sha, base_sha=job.base_sha, pr=job.pr, trigger=job.cause, options=job.options,
            gate=gpu_gate(repo, trigger=job.cause, untrusted=job.untrusted, actor=job.actor),
            reuse_run=row.check_run_id or job.check_run_id, external_id=self._external_id(row.id, job),
        )
        return self._audit(row, task, job, repo, beat)

    def _audit(self, row: JobRow, task: AuditTask, job: Job, repo: Any, beat: _Heartbeat) -> str:
        """task → request → plan/run → report → publish."""
        pub = self._publisher(repo)
        details = self._details_url(row.id)
        if not task.reuse_run:
            self.store.opening_run(row.id, task.external_id)
        run = pub.start_check(task.head_sha, task.external_id, details, existing_id=task.reuse_run)
        if run.id != row.check_run_id:
            self.store.set_check_run(row.id, run.id)
        if self._cancel_if_superseded(pub, run, row, task, "`{newer}` is audited instead of `{head}`."):
            return SUPERSEDED
        beat.check()

        token = self.app.installation_token(job.installation_id) if job.installation_id else None
        clone = repo.clone_url or job.clone_url  # the API's answer, which also covers GHE hosts
        mirror = self.mirrors.fetch(job.repo, clone, [task.base_sha, task.head_sha], token)
        dispatch = GpuDispatch(
            repo, gate=task.gate, head_sha=task.head_sha, workflow=self.settings.gpu_workflow,
            ref=repo.default_branch, redact=self.redact,
            earlier=None if task.gate.allowed else self._earlier_results(job.repo, task.head_sha),
            awaited=set() if task.gate.allowed else self._awaited(job.repo, task.head_sha),
            on_plan=lambda audit_id: self.store.bind_audit(row.id, audit_id),
        )
        request = AuditRequest(
            repo=mirror, base=task.base_sha, head=task.head_sha, pr=task.pr, trigger=task.trigger,  # type: ignore[arg-type]
            options=task.options, nonce=task.nonce or f"job-{row.id}",
        )
        blob_url = f"{repo.html_url}/blob/{task.head_sha}" if getattr(repo, "html_url", None) else None
        audit = _plan_and_run(request, dispatch, blob_url=blob_url, details_url=details)
        beat.check()
        if isinstance(audit, Unrunnable):
            audit = task.outcome = Unrunnable(self.redact(audit.message))
            if task.reply_to:  # a command's error (an unknown suite or pillar): it must change nothing
                conclusion, title, summary = self._standing(pub, task.head_sha, run.id, audit.message)
            else:  # the base config's owner decides (a config that does not parse): neutral, as before
                conclusion, title, summary = "neutral", "The audit could not run", code(audit.message[:3000])
            pub.conclude(run, conclusion, title, summary)
            self.store.close_run(row.id)
            if task.reply_to and task.pr is not None:
                marker = reply_marker(task.reply_to)
                pub.upsert_comment(task.pr, f"{marker}\n{code((task.command or '/audit')[:200])}: "
                                            f"{code(audit.message[:3000])}", marker=marker)
            return DONE

        ran = "The head moved to `{newer}` while this audit of `{head}` ran; that commit is audited instead."
        if self._cancel_if_superseded(pub, run, row, task, ran):
            self._save(row, job, task, audit, "superseded", [])
            return SUPERSEDED

        pending = list(dispatch.pending)
        self._save(row, job, task, audit, "awaiting-gpu" if pending else "done", pending)
        # Selected GPU suites that wait for a writer's approval must not read as passed: a required check in
        # action_required blocks the merge until a writer's /audit runs them (neutral would count as passing).
        held = bool(dispatch.unapproved) and audit.report is not None and audit.report.verdict == "pass"
        self._publish(pub, run, row.id, task.pr, audit, details, complete=not pending,
                      conclusion="action_required" if held else None)
        if task.pr is not None:
            self._retire_older(repo, pub, job.repo, task, audit)
        return DONE

    def _standing(self, pub: Publisher, head_sha: str, run_id: int, message: str) -> tuple[str, str, str]:
        """(conclusion, title, summary) for the check run of a command that could not run. GitHub reads the
        newest run of a check, so a ``neutral`` here (which passes) would turn a failed head green on a typo
        (``/audit run no-such-suite``): the conclusion of this app's latest other run on the commit stands, and
        with none, ``cancelled`` (nothing was audited)."""
        earlier = [c for c in own_runs(pub.repo, head_sha, pub.check_name, pub.app_id)
                   if c.id != run_id and c.status == "completed"]
        latest = max(earlier, key=lambda c: c.id, default=None)
        why = code(message[:3000])
        if latest is None or not latest.conclusion:
            return ("cancelled", "The command could not run",
                    f"{why}\n\nNo audit of this commit has concluded, so the check does not pass. {RETRY}")
        return (latest.conclusion, f"The command could not run; the last audit stands ({latest.conclusion})",
                f"{why}\n\nThe command changed nothing: this check keeps the conclusion of the last audit of this "
                f"commit, `{latest.conclusion}`.")

    def _awaited(self, full_name: str, head_sha: str) -> set[str]:
        """Labels an earlier audit of this commit dispatched whose results have not come back: that run reports
        to this audit too (``_collect``). Also from an audit a newer push retired (A -> B -> A before the results
        came: they are still this commit's), while its run can still report (``gpu_timeout``)."""
        since = time.time() - self.settings.gpu_timeout
        return {lab for rec in self.store.audits_of_head(full_name, head_sha)
                if rec.status == "awaiting-gpu" or (rec.status == "superseded" and rec.updated > since)
                for lab in rec.pending}

    def _earlier_results(self, full_name: str, head_sha: str) -> Results:
        """The outcomes earlier audits of this commit got from the runners, newest first per suite and label."""
        rows: dict[tuple[str, str], SuiteResult] = {}
        devices: dict[str, Any] = {}
        for record in self.store.audits_of_head(full_name, head_sha):
            try:
                earlier = from_json(Audit, record.audit_json).results
            except Exception:  # a record this build cannot read adds nothing
                continue
            for row in earlier.suites if earlier else []:
                if row.outcome not in ("not-run", "not-runnable", "skipped"):
                    rows.setdefault((row.suite, row.runner), row)
            for device in earlier.devices if earlier else []:
                devices.setdefault(device.label, device)
        return Results("", head_sha, list(rows.values()), list(devices.values()))

    def _cancel_if_superseded(self, pub: Publisher, run: Any, row: JobRow, task: AuditTask, summary: str) -> bool:
        """A newer push of this PR is queued: close ``run`` as cancelled, ``summary`` naming ``{newer}`` and
        ``{head}``."""
        newer = self.store.superseded_by(row.id)
        if newer:
            pub.conclude(run, "cancelled", "Superseded by a newer push",
                         summary.format(newer=newer[:12], head=task.head_sha[:12]))
            self.store.close_run(row.id)
        return bool(newer)

    def _retire_older(self, repo: Any, pub: Publisher, full_name: str, task: AuditTask, audit: Audit) -> None:
        """Audits of older heads of this PR still waiting for GPU results will never be shown: close them."""
        current = audit.plan.audit_id if audit.plan else None
        for old in self.store.awaiting(full_name, pr=task.pr):
            if old.audit_id == current or old.head_sha == task.head_sha:
                continue
            self._conclude_run_of(
                repo, pub, old.job_id, "cancelled", "Superseded by a newer push",
                f"`{task.head_sha[:12]}` is audited instead of `{old.head_sha[:12]}`.",
            )
            # ``pending`` stays: should the head come back (A -> B -> A), its runs still report for that commit
            self.store.save_audit(replace(old, status="superseded"))

    def _conclude_run_of(self, repo: Any, pub: Publisher, job_id: int, conclusion: str, title: str,
                         summary: str) -> None:
        """Close the check run a stored job opened, if it opened one."""
        stored = self.store.get(job_id)
        if stored and stored.check_run_id:
            pub.conclude(repo.get_check_run(stored.check_run_id), conclusion, title, summary)
            self.store.close_run(job_id)

    def _publish(self, pub: Publisher, run: Any, owner_job: int, pr: int | None, audit: Audit, details: str, *,
                 complete: bool, conclusion: str | None = None) -> None:
        report = audit.report
        assert report is not None  # _plan_and_run always renders
        comment, overflow = split_comment(report.markdown, details)
        if pr is not None:
            pub.upsert_comment(pr, comment)
        pub.finish_check(run, report, overflow=overflow, complete=complete, conclusion=conclusion)
        if complete:
            self.store.close_run(owner_job)

    def _save(self, row: JobRow, job: Job, task: AuditTask, audit: Audit, status: str, pending: list[str]) -> None:
        audit_id = audit.plan.audit_id if audit.plan else f"job-{row.id}"
        verdict = audit.report.verdict if audit.report else "neutral"
        self.store.save_audit(
            AuditRecord(
                audit_id=audit_id,
                job_id=row.id,
                repo=job.repo,
                pr=task.pr,
                head_sha=task.head_sha,
                status=status,
                verdict=verdict,
                audit_json=to_json(audit, indent=None),
                pending=pending,
            )
        )

    # ------------------------------------------------------------------ /audit commands
    def _reply(self, pub: Publisher, job: CommandJob, text: str) -> None:
        marker = reply_marker(job.comment_id)
        pub.upsert_comment(job.pr, f"{marker}\n{text}", marker=marker)

    def _command(self, row: JobRow, job: CommandJob, beat: _Heartbeat) -> str:
        """Parse the comment (here, never at intake); audit the head the command was pinned to."""
        line = find_command(job.body)
        if line is None:
            return DONE  # "/audit" only in prose, a quote or code: not a command, nothing to answer
        repo = self._repo(job)
        pub = self._publisher(repo)
        pub.react(job.comment_id, "eyes")
        cmd = parse_command(line)
        if cmd.replies_with_help:
            lead = f"{code(cmd.text[:200])}: {cmd.error}.\n\n" if cmd.error else ""
            self._reply(pub, job, f"{lead}{HELP}")
            pub.react(job.comment_id, "confused" if cmd.error else "rocket")
            return DONE
        pr = repo.get_pull(job.pr)
        head = pr.head.sha
        newer = row.superseded_by or (head if job.head_sha and head != job.head_sha else None)
        if newer and job.head_sha:
            self._reply(pub, job, f"{code(cmd.text[:200])} was for `{job.head_sha[:12]}`, but the pull request moved to "
                                  f"`{newer[:12]}` before it ran. An approval covers one commit: say `/audit` again "
                                  "to audit the new head.")
            pub.react(job.comment_id, "confused")
            return SUPERSEDED
        writer = is_writer(repo, job.actor)
        refusal = None if writer else self._refusal(job, cmd, head)
        if refusal:
            self._reply(pub, job, refusal)
            pub.react(job.comment_id, "confused")
            return DONE
        options = cmd.options
        if cmd.action == "retry":
            last = self.store.latest_audit(job.repo, job.pr)
            failed = failed_suites(from_json(Audit, last.audit_json).results) if last else []
            if not failed:
                self._reply(pub, job, "Nothing to retry: no suite failed in the last audit.")
                pub.react(job.comment_id, "confused")
                return DONE
            options = replace(options, suites=failed)
        if job.head_sha is None:
            self.store.record_head(job.repo, job.pr, head)  # so the next /audit is pinned to it
        self.store.mark_head(row.id, head)
        untrusted = is_untrusted(Fields(pr.raw_data))
        gate = self._command_gate(repo, job, cmd, untrusted, head, writer)
        task = AuditTask(
            head_sha=head, base_sha=pr.base.sha, pr=job.pr, trigger="comment", options=options, gate=gate,
            external_id=f"job:{row.id}", reply_to=job.comment_id, command=cmd.text,
        )
        status = self._audit(row, task, job, repo, beat)
        denied = (cmd.wants_gpu or job.predates is not None) and not gate.allowed
        pub.react(job.comment_id, "confused" if denied or task.outcome else "rocket")
        return status

    def _refusal(self, job: CommandJob, cmd: Command, head: str) -> str | None:
        """Why a command from someone without write access changes nothing, or None when it may run.

        Only a plain ``/audit`` of a head the bot has not audited yet runs (its GPU suites wait for a writer).
        Anything else would publish a new check run and comment for a head that already has them, from an
        audit that ran less (GPU suites not run, pillars or suites narrowed): GitHub shows the newest run of
        a check, so a failed GPU suite or finding would read as passed without anything having passed."""
        who = f"{job.actor} has none"
        if cmd.action != "audit":
            return (f"{code(cmd.text[:200])} changes what the audit runs or reports, which needs write access to "
                    f"the repository ({who}). A writer can say it instead.")
        last = self.store.latest_audit(job.repo, job.pr)
        if last is not None and last.head_sha == head:
            return (f"The audit of `{head[:12]}` stands: re-running it needs write access to the repository "
                    f"({who}).")
        return None

    def _command_gate(self, repo: Any, job: CommandJob, cmd: Command, untrusted: bool, head: str,
                      writer: bool) -> Gate:
        gate = gpu_gate(repo, trigger="comment", untrusted=untrusted, actor=job.actor, writer=writer)
        if gate.allowed and untrusted and job.predates:
            return Gate(False, f"this command was written before {job.predates[:12]} was pushed, and an approval "
                               f"covers the commit it was written for; say /audit again to approve {head[:12]}")
        if gate.allowed and untrusted and job.head_sha is None:
            return Gate(False, "the bot had not seen this pull request's head when the command arrived, so it "
                               f"approves no commit for GPU runners; say /audit again to approve {head[:12]}")
        return gate

    def _rerun(self, row: JobRow, job: RerunJob, beat: _Heartbeat) -> str:
        """Re-run of a PR check run: that run's head, in that run. A run of an older head is closed instead:
        the PR's current head has its own run, and re-running an old one never sends newer code anywhere."""
        if job.pr is None or job.check_run_id is None:  # intake's store resolves both (bot.queue._route)
            log.info("job %s: a re-run with no pull request or check run of ours; nothing to do", row.id)
            return DONE
        repo = self._repo(job)
        pr = repo.get_pull(job.pr)
        if pr.head.sha != job.head_sha or row.superseded_by:
            newer = pr.head.sha if pr.head.sha != job.head_sha else (row.superseded_by or pr.head.sha)
            pub = self._publisher(repo)
            pub.conclude(repo.get_check_run(job.check_run_id), "cancelled", "Superseded by a newer push",
                         f"`{job.head_sha[:12]}` is no longer the pull request's head; `{newer[:12]}` is audited "
                         "in its own check run.")
            return SUPERSEDED
        task = AuditTask(
            head_sha=job.head_sha, base_sha=pr.base.sha, pr=job.pr, trigger="check_run", options=AuditOptions(run=True),
            gate=gpu_gate(repo, trigger="check_run", untrusted=is_untrusted(Fields(pr.raw_data)), actor=job.actor),
            reuse_run=job.check_run_id, external_id=f"job:{row.id}",
        )
        return self._audit(row, task, job, repo, beat)

    # ------------------------------------------------------------------ GPU results
    def _collect(self, row: JobRow, job: CollectJob, beat: _Heartbeat) -> str:
        """A GPU workflow run finished: fold its Results into the audit it belongs to and publish again; also
        into later audits of the same commit that are waiting for that label (an audit that could not dispatch
        it waits for the run an earlier one started, see ``GpuDispatch``)."""
        record = self.store.audit(job.audit_id)
        if record is None or job.label not in record.pending or record.repo != job.repo:
            # audit ids are no secret (they title the runs): a run of another repository, one where whoever
            # installed the app holds that repository's results key, never reports for this one's audits
            log.info("workflow run %s of %s: no audit %s of it waiting for %s", job.run_id, job.repo,
                     job.audit_id, job.label)
            return DONE
        repo = self._repo(job)
        actions = actions_module()
        reason = ""
        incoming: Results | None = None
        try:
            if actions is None:
                raise RuntimeError("no GPU results collector is installed on this bot")
            incoming = actions.Collector(repo, key=self.settings.results_key or None).collect(
                job.run_id, record.audit_id, head_sha=record.head_sha)
        except Exception as exc:  # missing / malformed / oversized artifact: error rows, never a silent pass
            if isinstance(exc, GithubException) and exc.status >= 500:
                raise
            reason = self.redact(f"results unusable: {exc}")[:600]
        for later in self.store.awaiting(job.repo, head_sha=record.head_sha):
            if later.audit_id != record.audit_id and job.label in later.pending:
                self._fold(repo, job, later, incoming, reason, beat)
        if record.status == "superseded":  # retired by a newer push, its check run closed: only its label is done
            self.store.save_audit(replace(record, pending=[lab for lab in record.pending if lab != job.label]))
        else:
            self._fold(repo, job, record, incoming, reason, beat)  # last: a crash before it leaves the run to redo
        return DONE

    def _fold(self, repo: Any, job: CollectJob, record: AuditRecord, incoming: Results | None, reason: str,
              beat: _Heartbeat) -> None:
        audit = from_json(Audit, record.audit_json)
        if incoming is None:
            incoming = Results(record.audit_id, record.head_sha, [
                SuiteResult(suite=s.id, runner=s.runner, outcome="error", reason=reason)
                for s in (audit.plan.for_runner(job.label) if audit.plan else [])
            ])
        labels = {s.runner for s in incoming.suites} | {d.label for d in incoming.devices} | {job.label}
        audit.results = merge_results(audit.results, incoming, labels)
        pending = [lab for lab in record.pending if lab not in labels]
        origin = self.store.get(record.job_id)
        details = self._details_url(record.job_id)
        audit.report = _render(audit, blob_url=f"{repo.html_url}/blob/{record.head_sha}", details_url=details)
        beat.check()
        latest = self.store.latest_audit(job.repo, record.pr) if record.pr is not None else None
        # never overwrite a newer head's comment (a collect runs one at a time with the PR's other jobs: its key)
        shown = (latest is None or latest.audit_id == record.audit_id) and (
            record.pr is None or self.store.known_head(job.repo, record.pr) in (None, record.head_sha))
        self.store.save_audit(
            replace(
                record,
                status="awaiting-gpu" if pending else "done",
                pending=pending,
                verdict=audit.report.verdict,
                audit_json=to_json(audit, indent=None),
            )
        )
        pub = self._publisher(repo)
        pr = record.pr if shown else None
        if origin and origin.check_run_id:
            self._publish(pub, repo.get_check_run(origin.check_run_id), origin.id, pr, audit, details,
                          complete=not pending)
        elif pr is not None:
            pub.upsert_comment(pr, split_comment(audit.report.markdown, details)[0])


# ---------------------------------------------------------------------- the GitHub-free pipeline


def _plan_and_run(request: AuditRequest, dispatch: GpuDispatch, *, blob_url: str | None,
                  details_url: str) -> Audit | Unrunnable:
    """plan → run (suites go to ``dispatch``, never this host) → report; ``Unrunnable`` for the user's errors."""
    from runner import pipeline  # heavy: git, tree-sitter, the checks

    try:
        audit = pipeline.plan(request)
        if pipeline.wants_run(request.options):
            audit = pipeline.run(audit, dispatch)
    except USER_ERRORS as exc:
        return Unrunnable(str(exc))
    except Exception as exc:
        from checks.workspace import WorkspaceError

        if isinstance(exc, WorkspaceError):  # the mirror lacks a commit (a fetch that raced a force-push): retry
            raise
        raise AuditCrashed(f"{type(exc).__name__}: {exc}") from exc
    audit.report = _render(audit, blob_url=blob_url, details_url=details_url)
    return audit


def _render(audit: Audit, *, blob_url: str | None, details_url: str | None) -> Report:
    from runner.report import Context, report

    try:
        return report(audit, Context(blob_url=blob_url, details_url=details_url))
    except Exception as exc:  # the report renders PR-derived text: a crash here is a crash on the PR's input
        raise AuditCrashed(f"{type(exc).__name__} in the report: {exc}") from exc


def _gave_up_comment(conclusion: str, title: str, head: str, error: str, details: str) -> str:
    """The PR comment of an audit that never finished: what happened, that the check does not pass, what to do.
    The error's first line only (redacted and quoted by the caller's text); the check run holds the rest."""
    first = (error.strip().splitlines() or ["no reason was recorded"])[0][:300]
    icon = "💥" if conclusion == "failure" else "⚠️"
    return (f"{COMMENT_MARKER}\n### {icon} Drift Audit: {title.lower()}\n\n"
            f"The audit of `{head[:12]}` did not finish: {code(first)}\n\n"
            f"The check concludes **{conclusion}**, so it does not pass: nothing was audited. {RETRY} "
            f"[Details]({details})\n")
