"""Every check run the service opens reaches a conclusion, however the process that opened it died.

A job records that it is about to open a check run before it creates it
(``JobStore.opening_run``), and that it concluded it after GitHub accepted the
PATCH (``close_run``). The sweeper runs at start-up and on a timer, and
concludes the runs of jobs that ended without closing theirs: a job that failed
after its last attempt (the failure report's PATCH failed, or the process died
before sending it), a dead-lettered job, a superseded one, and an audit that
waited for GPU results longer than ``gpu_timeout``. A run created just before a
crash, whose id never reached the database, is found by its ``external_id``
(among all runs of the commit, not only the newest of each name). Runs that are
already completed on GitHub are only marked closed. A job that gave up is
concluded as the worker would have (``gave_up``: ``failure`` for a crash,
``cancelled`` otherwise; never the passing ``neutral``), and the PR's comment
says so too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bot.publish import cap, own_runs
from bot.queue import DONE, SUPERSEDED, JobRow, JobStore
from runner.report.safe import code

log = logging.getLogger("drift_audit.sweeper")


@dataclass
class Swept:
    """What one sweep did, for logs and tests."""

    expired: int = 0  # leases that ran out on a last attempt, failed now
    concluded: list[int] = field(default_factory=list)  # check run ids concluded
    already: int = 0  # stale records whose run GitHub already had completed
    errors: list[str] = field(default_factory=list)


class Sweeper:
    def __init__(self, store: JobStore, repo_of: Callable[[str, int | None], Any], check_name: str, *,
                 gpu_timeout: float, announce_wait: float = 30.0, app_id: int | None = None,
                 on_gave_up: Callable[[Any, JobRow, str, str], None] | None = None):
        self.store, self.repo_of, self.check_name, self.gpu_timeout = store, repo_of, check_name, gpu_timeout
        self.announce_wait, self.app_id = announce_wait, app_id
        self.on_gave_up = on_gave_up  # (repo, row, conclusion, title): the PR's comment says it too

    def sweep(self) -> Swept:
        out = Swept(expired=self.store.expire_leases())
        self.store.release_stale_announces(self.announce_wait)
        for row in self.store.stale_runs(self.gpu_timeout):
            try:
                self._conclude(row, out)
            except Exception as exc:  # GitHub down, token gone: the next sweep tries again
                out.errors.append(f"job {row.id}: {type(exc).__name__}: {exc}"[:300])
                log.warning("sweeper: job %s: %s", row.id, exc)
        if out.concluded or out.expired:
            log.info("sweeper: %s lease(s) expired, %s check run(s) concluded", out.expired, len(out.concluded))
        return out

    def _conclude(self, row: JobRow, out: Swept) -> None:
        repo = self.repo_of(row.repo, row.installation_id)
        run = self._find(repo, row)
        if run is None:  # recorded as opening, never created
            self.store.close_run(row.id)
            return
        if run.status == "completed":
            out.already += 1
            self.store.close_run(row.id)
            return
        conclusion, title, summary = self._verdict(row)
        run.edit(status="completed", conclusion=conclusion, output={"title": title, "summary": cap(summary)})
        self.store.close_run(row.id)
        out.concluded.append(run.id)
        if self.on_gave_up is not None and row.status != SUPERSEDED and row.status != DONE:
            self.on_gave_up(repo, row, conclusion, title)

    def _find(self, repo: Any, row: JobRow) -> Any:
        if row.check_run_id:
            return repo.get_check_run(row.check_run_id)
        if not row.head_sha or not row.external_id:
            return None
        return next((c for c in own_runs(repo, row.head_sha, self.check_name, self.app_id)
                     if c.external_id == row.external_id), None)

    def _verdict(self, row: JobRow) -> tuple[str, str, str]:
        if row.status == SUPERSEDED:
            newer = f" `{row.superseded_by[:12]}` is audited instead." if row.superseded_by else ""
            return "cancelled", "Superseded by a newer push", f"A newer push replaced this audit.{newer}"
        if row.status == DONE:  # an audit that waited for GPU results too long
            record = self.store.audit_for_job(row.id)
            if record is not None and record.status == "awaiting-gpu":
                self.store.save_audit(replace(record, status="done", pending=[]))
            hours = self.gpu_timeout / 3600
            # timed_out blocks a required check: selected GPU suites that never reported passed nothing
            return ("timed_out", "GPU results did not arrive",
                    f"No results came back from the GPU runners within {hours:g} h; say `/audit` to try again.")
        return gave_up(row.error or row.result, row.attempts, row.status)


CRASHED = "AuditCrashed"  # how the error text of an audit that crashed in the pipeline starts (bot.worker)
RETRY = "Re-run this check from the pull request's Checks tab, or say `/audit`, to audit it again."


def crashed(error: str) -> bool:
    """Did the audit itself fail on this input (the pipeline raised), as opposed to what is around it (GitHub,
    the network, fetching the commits, the store, a worker process that was stopped)?"""
    return (error or "").lstrip().startswith(CRASHED)


def gave_up(error: str, attempts: int, status: str = "failed") -> tuple[str, str, str]:
    """(conclusion, title, summary) of a check run whose audit never finished.

    Neither conclusion passes a required check: an audit that did not finish audited nothing, and a PR that makes
    the auditor crash (or the fetch of its commits fail) must not merge as if it had been audited. ``neutral``,
    which branch protection counts as passing, is kept for what a maintainer decides (a base config that does not
    parse). A crash on this input is ``failure``: the same input crashes it again, so only a fixed bot changes
    it. Anything else is ``cancelled``, which GitHub offers to re-run: it says that nothing was wrong with the
    change as far as the audit got, and that a re-run is the fix."""
    reason = code((error or "no reason was recorded").strip()[:3000])  # quoted: error text may echo PR text
    if crashed(error):
        return ("failure", "The audit crashed on this pull request",
                f"Drift Audit crashed while auditing this pull request ({attempts} attempt(s)): {reason}\n\n"
                "This is a bug in Drift Audit, not a finding about the change. The check fails because nothing "
                "was audited, and a change the auditor cannot read must not merge as if it had been. "
                f"{RETRY} Once the bot is fixed the same commit audits normally.")
    return ("cancelled", "The audit could not finish: re-run it",
            f"Drift Audit gave up after {attempts} attempt(s) ({status}) on something outside the audit itself "
            f"(GitHub, the network, fetching the commits, the bot's own store, or a worker that was stopped): {reason}\n\n"
            f"Nothing was audited, so the check does not pass. {RETRY}")
