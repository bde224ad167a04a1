"""Running one job: claim its row, call the handler of its kind, record the outcome and the retry schedule.

The runner sits above the domains: it reads the handler table of core.jobs.handlers, which names each
kind's function explicitly. Domains only add job rows (core.jobs.service.enqueue) and never import the
runner, so no import leads back from a job's handler to the code that runs it.
"""

from __future__ import annotations

import logging
import random
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import literal, text, update
from sqlalchemy.dialects.postgresql import JSONB

from core.jobs.handlers import HANDLERS
from core.jobs.models import Job
from core.jobs.service import PermanentJobError, now

log = logging.getLogger(__name__)
_ATTEMPT_ERROR_CHARS = 2_000
_ATTEMPT_TRACEBACK_CHARS = 4_000


@dataclass(frozen=True)
class RunOutcome:
    state: str  # succeeded | retry | failed | skipped
    attempts: int
    error: str | None = None
    retry_in: float = 0.0


def backoff_seconds(attempt: int, *, base: float, cap: float) -> float:
    """The wait before retrying after failed attempt number `attempt` (1-based).

    Exponential: base * 2^(attempt-1), capped at `cap`; with jitter from the upper half of that delay
    ("equal jitter"), so retries of jobs that failed together spread out while each job's waits still grow.
    """
    delay = min(cap, base * 2.0 ** min(max(attempt - 1, 0), 64))
    return random.uniform(delay / 2, delay)


def run_job(
    job_id: str,
    *,
    session_factory: Callable[[], Any],
    max_attempts: int,
    running_lease: timedelta = timedelta(seconds=20),
    retry_base_seconds: float = 2.0,
    retry_max_seconds: float = 4 * 3600.0,
) -> RunOutcome:
    """Run one job once: claim it, call its handler in its own transaction, record the outcome.

    A second delivery of a job that is running now (within its lease) or whose retry is not yet due is
    skipped, so duplicate messages never run a job twice at once or inflate its attempts. While the
    handler runs, a heartbeat renews the lease (``updated_at``) every quarter of it: a job whose
    worker died stops renewing, and reconcile dispatches it again once the lease lapses.
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
    heartbeat = _heartbeat(job_id, attempts, session_factory=session_factory, every=running_lease.total_seconds() / 4)
    try:
        if fn is None:
            raise LookupError(f"no handler for job kind {kind!r}")
        with heartbeat, session_factory() as session:
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
        retry_in = 0.0 if final else backoff_seconds(attempts, base=retry_base_seconds, cap=retry_max_seconds)
        failed = {
            "attempt": attempts,
            "error": error[:_ATTEMPT_ERROR_CHARS],
            "at": now().isoformat(),
            # The end of the stack is where it failed; operators read it on the dashboard's job page.
            "traceback": traceback.format_exc()[-_ATTEMPT_TRACEBACK_CHARS:],
        }
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
                    # Every attempt's error, not only the last: an outage's story is in the sequence.
                    attempt_errors=Job.attempt_errors.op("||")(literal([failed], JSONB)),
                    updated_at=now(),
                    dispatched_at=None if final else now() + timedelta(seconds=retry_in),
                    finished_at=now() if final else None,
                )
            )
        return RunOutcome(state="failed" if final else "retry", attempts=attempts, error=error, retry_in=retry_in)


@contextmanager
def _heartbeat(job_id: str, attempts: int, *, session_factory: Callable[[], Any], every: float) -> Iterator[None]:
    """Renew a running attempt's lease every ``every`` seconds from a thread, until the block ends.

    Only this attempt's row is touched (state running, same attempts), in a short transaction of its own
    that gives up on a row lock after 2 s: the handler's own transaction may hold the row.
    """
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            try:
                with session_factory() as session:
                    session.execute(text("SET LOCAL lock_timeout = '2s'"))
                    session.execute(
                        update(Job)
                        .where(Job.id == job_id, Job.state == "running", Job.attempts == attempts)
                        .values(updated_at=now())
                    )
            except Exception:  # a missed beat only shortens the lease; the next one may land
                log.warning("heartbeat of job %s failed", job_id, exc_info=True)

    thread = threading.Thread(target=beat, name=f"job-heartbeat-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
