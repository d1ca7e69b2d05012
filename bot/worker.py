"""Workers: lease a job, run it, publish, finish; a crash anywhere means the job runs again.

A job's lease is renewed by a heartbeat while it runs. If the process dies,
the lease runs out and another worker (or the restarted service) takes the job
over from the start; publishing is idempotent (see ``bot.publish``), so the
re-run edits the same comment and check run instead of adding new ones.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from dataclasses import replace

from github import GithubException

from bot.commands import HELP, parse_command
from bot.events import Job, is_untrusted
from bot.github import GitHubApp
from bot.gpu import GpuDispatch, actions_module, failed_suites, merge_results
from bot.mirror import Mirrors
from bot.publish import Publisher, reply_marker, split_comment
from bot.queue import DONE, FAILED, SUPERSEDED, AuditRecord, JobRow, JobStore
from bot.security import details_url, gpu_gate, is_writer
from bot.settings import BotSettings
from checks.model import Audit, AuditRequest, Results, SuiteResult, from_json, to_json

log = logging.getLogger("drift_audit.worker")
PERMANENT_HTTP = (400, 401, 404, 410, 422)


class LeaseLost(RuntimeError):
    """Another worker owns this job now; stop without publishing."""


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
        self._unrunnable: set[int] = set()  # job ids whose audit could not run (bad config, unknown suite)

    # ------------------------------------------------------------------ pool
    def start(self, workers: int | None = None) -> None:
        """``workers=0`` runs intake only (jobs wait in the store for another replica)."""
        count = self.settings.workers if workers is None else workers
        if count:
            t = threading.Thread(target=self._announce_loop, daemon=True, name="announcer")
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

    def wake(self) -> None:
        self._wake.set()
        self._announce.set()

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
            if self._stop.is_set() or not self.store.claim_announce(row.id):
                continue
            try:
                repo = self._repo(row.job)
                run = Publisher(repo, self.settings.check_name).start_check(
                    row.job.head_sha, self._external_id(row, row.job), self._details_url(row), status="queued")
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
        permanent = isinstance(exc, GithubException) and exc.status in PERMANENT_HTTP
        text = f"{type(exc).__name__}: {exc}"
        log.warning("job %s attempt %s failed: %s", row.id, row.attempts, text)
        if permanent:
            self.store.finish(row.id, owner, FAILED, text)
            status = FAILED
        else:
            delay = self.settings.retry_backoff * 2 ** max(row.attempts - 1, 0)
            status = self.store.retry_later(row.id, owner, text + "\n" + traceback.format_exc()[-1500:], delay)
        if status == FAILED:
            self._report_failure(row, text)

    def _report_failure(self, row: JobRow, text: str) -> None:
        """Best effort: the check run and the command say the audit could not finish."""
        job = row.job
        try:
            repo = self._repo(job)
            pub = Publisher(repo, self.settings.check_name)
            self._conclude_run_of(
                repo, pub, row.id, "neutral", "The audit could not finish",
                f"Drift Audit gave up after {row.attempts} attempt(s): {text[:2000]}",
            )
            pub.react(job.comment_id, "confused")
        except Exception:
            log.exception("job %s: could not report its failure", row.id)

    # ------------------------------------------------------------------ jobs
    def _repo(self, job: Job):
        inst = job.installation_id or self.app.installation_for(job.repo)
        job.installation_id = inst
        return self.app.client(inst).get_repo(job.repo)

    def process(self, row: JobRow, beat: _Heartbeat) -> str:
        job = row.job
        if job.kind == "installation":
            log.info("installation %s: %s", job.installation_id, job.note)
            return DONE
        if job.kind == "audit" and row.check_run_id == 0:
            row.check_run_id = self._await_announce(row.id)
        if row.superseded_by and job.kind == "audit" and not row.check_run_id:
            return SUPERSEDED  # never started: nothing on GitHub to close
        repo = self._repo(job)
        if job.kind == "collect":
            return self._collect(row, repo, beat)
        if job.kind == "command":
            return self._command(row, repo, beat)
        return self._audit(row, job, repo, beat)

    def _details_url(self, row: JobRow) -> str:
        return details_url(self.settings.public_url, self.settings.webhook_secret, row.id)

    def _external_id(self, row: JobRow, job: Job) -> str:
        if job.trigger == "merge_group":
            return f"mg:{job.base_sha}:{job.key.split('@', 1)[1]}"
        return f"job:{row.id}"

    def _audit(self, row: JobRow, job: Job, repo, beat: _Heartbeat) -> str:
        pub = Publisher(repo, self.settings.check_name)
        details = self._details_url(row)
        run = pub.start_check(
            job.head_sha, self._external_id(row, job), details, existing_id=row.check_run_id or job.check_run_id
        )
        if run.id != row.check_run_id:
            self.store.set_check_run(row.id, run.id)
        if self._cancel_if_superseded(pub, run, row, job, "`{newer}` is audited instead of `{head}`."):
            return SUPERSEDED
        beat.check()

        token = self.app.installation_token(job.installation_id)
        clone = repo.clone_url or job.clone_url  # the API's answer, which also covers GHE hosts
        mirror = self.mirrors.fetch(job.repo, clone, [job.base_sha, job.head_sha], token)
        gate = gpu_gate(repo, trigger=job.trigger, untrusted=job.untrusted, actor=job.actor)
        dispatch = GpuDispatch(
            repo, gate=gate, head_sha=job.head_sha, workflow=self.settings.gpu_workflow, ref=repo.default_branch
        )
        request = AuditRequest(
            repo=mirror, base=job.base_sha, head=job.head_sha, pr=job.pr, trigger=job.trigger, options=job.options,
            nonce=f"job-{row.id}",
        )
        from bot.pipeline import run_audit  # heavy: git, tree-sitter, the checks

        blob_url = f"{repo.html_url}/blob/{job.head_sha}" if getattr(repo, "html_url", None) else None
        try:
            audit = run_audit(request, blob_url=blob_url, details_url=details, dispatch=dispatch, render=False)
            from bot.report import render

            start = time.perf_counter()
            audit.report = render(audit, blob_url=blob_url, details_url=details)
            audit.timings["report"] = round(time.perf_counter() - start, 4)
        except ValueError as exc:  # bad config on the base, unknown suite id: the user's to fix, not a retry
            beat.check()
            message = str(exc)[:3000]
            pub.conclude(run, "neutral", "The audit could not run", message)
            if job.comment_id and job.pr is not None:
                marker = reply_marker(job.comment_id)
                pub.upsert_comment(job.pr, f"{marker}\n`{(job.command or '/audit')[:200]}`: {message}", marker=marker)
            self._unrunnable.add(row.id)
            return DONE
        beat.check()

        ran = "The head moved to `{newer}` while this audit of `{head}` ran; that commit is audited instead."
        if self._cancel_if_superseded(pub, run, row, job, ran):
            self._save(row, job, audit, "superseded", [])
            return SUPERSEDED

        pending = list(dispatch.pending)
        self._save(row, job, audit, "awaiting-gpu" if pending else "done", pending)
        self._publish(pub, run, job, audit, details, complete=not pending)
        if job.pr is not None:
            self._retire_older(repo, pub, job, audit)
        return DONE

    def _cancel_if_superseded(self, pub: Publisher, run, row: JobRow, job: Job, summary: str) -> bool:
        """A newer push of this PR is queued: close ``run`` as cancelled, ``summary`` naming ``{newer}`` and
        ``{head}``."""
        newer = self.store.superseded_by(row.id)
        if newer:
            pub.conclude(run, "cancelled", "Superseded by a newer push",
                         summary.format(newer=newer[:12], head=job.head_sha[:12]))
        return bool(newer)

    def _retire_older(self, repo, pub: Publisher, job: Job, audit: Audit) -> None:
        """Audits of older heads of this PR still waiting for GPU results will never be shown: close them."""
        current = audit.plan.audit_id if audit.plan else None
        for old in self.store.awaiting(job.repo, pr=job.pr):
            if old.audit_id == current or old.head_sha == job.head_sha:
                continue
            self._conclude_run_of(
                repo, pub, old.job_id, "cancelled", "Superseded by a newer push",
                f"`{job.head_sha[:12]}` is audited instead of `{old.head_sha[:12]}`.",
            )
            self.store.save_audit(replace(old, status="superseded", pending=[]))

    def _conclude_run_of(self, repo, pub: Publisher, job_id: int, conclusion: str, title: str, summary: str) -> None:
        """Close the check run a stored job opened, if it opened one."""
        stored = self.store.get(job_id)
        if stored and stored.check_run_id:
            pub.conclude(repo.get_check_run(stored.check_run_id), conclusion, title, summary)

    def _publish(self, pub: Publisher, run, job: Job, audit: Audit, details: str, *, complete: bool) -> None:
        report = audit.report
        comment, overflow = split_comment(report.markdown, details)
        if job.pr is not None:
            pub.upsert_comment(job.pr, comment)
        pub.finish_check(run, report, overflow=overflow, complete=complete)

    def _save(self, row: JobRow, job: Job, audit: Audit, status: str, pending: list[str]) -> None:
        audit_id = audit.plan.audit_id if audit.plan else f"job-{row.id}"
        verdict = audit.report.verdict if audit.report else "neutral"
        self.store.save_audit(
            AuditRecord(
                audit_id=audit_id,
                job_id=row.id,
                repo=job.repo,
                pr=job.pr,
                head_sha=job.head_sha or "",
                status=status,
                verdict=verdict,
                audit_json=to_json(audit, indent=None),
                pending=pending,
            )
        )

    # ------------------------------------------------------------------ /audit commands
    def _command(self, row: JobRow, repo, beat: _Heartbeat) -> str:
        job = row.job
        pub = Publisher(repo, self.settings.check_name)
        pub.react(job.comment_id, "eyes")
        cmd = parse_command(job.command or "/audit")
        if cmd.replies_with_help:
            lead = f"`{cmd.text[:200]}`: {cmd.error}.\n\n" if cmd.error else ""
            marker = reply_marker(job.comment_id or 0)
            pub.upsert_comment(job.pr, f"{marker}\n{lead}{HELP}", marker=marker)
            pub.react(job.comment_id, "confused" if cmd.error else "rocket")
            return DONE
        pr = repo.get_pull(job.pr)
        options = cmd.options
        if cmd.action == "retry":
            last = self.store.latest_audit(job.repo, job.pr)
            failed = failed_suites(from_json(Audit, last.audit_json).results) if last else []
            if not failed:
                marker = reply_marker(job.comment_id or 0)
                pub.upsert_comment(
                    job.pr, f"{marker}\nNothing to retry: no suite failed in the last audit.", marker=marker
                )
                pub.react(job.comment_id, "confused")
                return DONE
            options = replace(options, suites=failed)
        self.store.mark_head(row.id, pr.head.sha)
        # a re-run of a check run on an older head audits the PR's current head, in a new check run
        reuse = job.check_run_id if job.head_sha in (None, pr.head.sha) else None
        audit_job = replace(
            job,
            head_sha=pr.head.sha,
            base_sha=pr.base.sha,
            options=options,
            untrusted=is_untrusted(pr.raw_data),
            check_run_id=reuse,
        )
        status = self._audit(row, audit_job, repo, beat)
        if job.comment_id:
            denied = cmd.wants_gpu and not is_writer(repo, job.actor)
            failed = row.id in self._unrunnable
            self._unrunnable.discard(row.id)
            pub.react(job.comment_id, "confused" if denied or failed else "rocket")
        return status

    # ------------------------------------------------------------------ GPU results
    def _collect(self, row: JobRow, repo, beat: _Heartbeat) -> str:
        """A GPU workflow run finished: fold its Results into the audit it belongs to and publish again."""
        job = row.job
        record = self.store.audit(job.audit_id or "")
        if record is None or job.label not in record.pending:
            log.info("workflow run %s: no audit %s waiting for %s", job.run_id, job.audit_id, job.label)
            return DONE
        audit = from_json(Audit, record.audit_json)
        actions = actions_module()
        try:
            incoming = actions.Collector(repo).collect(job.run_id, record.audit_id, head_sha=record.head_sha)
        except Exception as exc:  # missing / malformed / oversized artifact: error rows, never a silent pass
            if isinstance(exc, GithubException) and exc.status >= 500:
                raise
            reason = f"results unusable: {exc}"[:600]
            incoming = Results(
                record.audit_id,
                record.head_sha,
                [
                    SuiteResult(suite=s.id, runner=s.runner, outcome="error", reason=reason)
                    for s in (audit.plan.for_runner(job.label) if audit.plan else [])
                ],
            )
        labels = {s.runner for s in incoming.suites} | {d.label for d in incoming.devices} | {job.label}
        audit.results = merge_results(audit.results, incoming, labels)
        pending = [lab for lab in record.pending if lab not in labels]
        origin = self.store.get(record.job_id)
        details = details_url(self.settings.public_url, self.settings.webhook_secret, record.job_id)
        from bot.report import render

        audit.report = render(audit, blob_url=f"{repo.html_url}/blob/{record.head_sha}", details_url=details)
        beat.check()
        latest = self.store.latest_audit(job.repo, record.pr) if record.pr is not None else None
        shown = latest is None or latest.audit_id == record.audit_id  # never overwrite a newer head's comment
        self.store.save_audit(
            replace(
                record,
                status="awaiting-gpu" if pending else "done",
                pending=pending,
                verdict=audit.report.verdict,
                audit_json=to_json(audit, indent=None),
            )
        )
        pub = Publisher(repo, self.settings.check_name)
        origin_job = replace(origin.job if origin else job, pr=record.pr if shown else None)
        if origin and origin.check_run_id:
            self._publish(
                pub, repo.get_check_run(origin.check_run_id), origin_job, audit, details, complete=not pending
            )
        elif record.pr is not None and shown:
            pub.upsert_comment(record.pr, split_comment(audit.report.markdown, details)[0])
        return DONE
