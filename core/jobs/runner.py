"""Running one job: claim its row, call the handler of its kind, record the outcome and the retry schedule.

The runner sits above the domains: it reads the handler table of core.jobs.handlers, which names each
kind's function explicitly. Domains only add job rows (core.jobs.service.enqueue) and never import the
runner, so no import leads back from a job's handler to the code that runs it.
"""

from __future__ import annotations

import logging
import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import update

from core.jobs.handlers import HANDLERS
from core.jobs.models import Job
from core.jobs.service import PermanentJobError, now

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOutcome:
    state: str  # succeeded | retry | failed | skipped
    attempts: int
    error: str | None = None
    retry_in: float = 0.0


def backoff_seconds(attempt: int, *, base: float, cap: float = 300.0) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * (2 ** max(attempt - 1, 0))))


def run_job(
    job_id: str,
    *,
    session_factory: Callable[[], Any],
    max_attempts: int,
    running_lease: timedelta = timedelta(minutes=10),
    retry_base_seconds: float = 1.0,
) -> RunOutcome:
    """Run one job once: claim it, call its handler in its own transaction, record the outcome.

    A second delivery of a job that is running now (within its lease) or whose retry is not yet due is
    skipped, so duplicate messages never run a job twice at once or inflate its attempts.
    """
    with session_factory() as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or job.state in ("succeeded", "failed"):
            return RunOutcome(state="skipped", attempts=job.attempts if job else 0)
        if job.state == "running" and job.updated_at > now() - running_lease:
            return RunOutcome(state="skipped", attempts=job.attempts)
        if job.state == "queued" and job.dispatched_at is not None and job.dispatched_at > now():
            return RunOutcome(state="skipped", attempts=job.attempts)
        job.state = "running"
        job.attempts += 1
        job.started_at = job.updated_at = now()
        attempts, kind = job.attempts, job.kind
    fn = HANDLERS.get(kind)
    try:
        if fn is None:
            raise LookupError(f"no handler for job kind {kind!r}")
        with session_factory() as session:
            job = session.get(Job, job_id)
            result = fn(session, job)
            job.state = "succeeded"
            job.result = result
            job.error = None
            job.finished_at = job.updated_at = now()
        return RunOutcome(state="succeeded", attempts=attempts)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        # Everything else (provider errors, a database restart) is retried with backoff.
        final = (
            attempts >= max_attempts
            or isinstance(exc, PermanentJobError | LookupError)
            or getattr(exc, "retryable", True) is False
        )
        log.warning("job %s (%s) attempt %d failed: %s", job_id, kind, attempts, traceback.format_exc())
        retry_in = 0.0 if final else backoff_seconds(attempts, base=retry_base_seconds)
        with session_factory() as session:
            # dispatched_at of a queued job is when its next delivery is due: reconcile leaves it alone
            # until then, and an early duplicate message is skipped.
            # Only this attempt's own row: if the job was re-dispatched meanwhile (lease expired) and another
            # attempt already finished it, a late failure here must not reopen it.
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == "running", Job.attempts == attempts)
                .values(
                    state="failed" if final else "queued",
                    error=error[:10_000],
                    updated_at=now(),
                    dispatched_at=None if final else now() + timedelta(seconds=retry_in),
                    finished_at=now() if final else None,
                )
            )
        return RunOutcome(state="failed" if final else "retry", attempts=attempts, error=error, retry_in=retry_in)
