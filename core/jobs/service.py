"""The transactional outbox and job execution, independent of the queue that carries the messages.

A write adds its job rows to the same session (``enqueue``); when that session commits, the job ids are
handed to the registered :class:`JobQueue` (Celery in production). If the hand-off fails, the row is still
``queued`` and the reconciler dispatches it again, so a committed job is never lost. Handlers must be
idempotent: a job may run more than once.
"""

from __future__ import annotations

import logging
import random
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import event, func, or_, select, text, update
from sqlalchemy.orm import Session

from core.errors import NotFound
from core.jobs.models import Job

log = logging.getLogger(__name__)


class JobQueue(Protocol):
    def send(self, job_ids: list[str]) -> None:
        """Hand job ids to the workers. May drop them (broker down): reconcile re-dispatches."""


_queue: JobQueue | None = None
_queue_lock = threading.Lock()


def set_job_queue(queue: JobQueue | None) -> None:
    global _queue
    with _queue_lock:
        _queue = queue


def get_job_queue() -> JobQueue | None:
    return _queue


def now() -> datetime:
    return datetime.now(UTC)


def enqueue(session: Session, *, tenant_id: int | None, kind: str, payload: dict[str, Any]) -> Job:
    """Add a job row to the caller's unit of work; it is dispatched after that unit commits."""
    job = Job(
        id=uuid.uuid4().hex,
        tenant_id=tenant_id,
        kind=kind,
        state="queued",
        payload=payload,
        attempts=0,
        created_at=now(),
        updated_at=now(),
    )
    session.add(job)
    session.info.setdefault("outbox", []).append(job.id)
    return job


def new_outbox_job_id(session: Session) -> str:
    """An id for a job row the caller inserts itself (in SQL) in this unit of work; dispatched after commit."""
    job_id = uuid.uuid4().hex
    session.info.setdefault("outbox", []).append(job_id)
    return job_id


def dispatch_outbox(session: Session) -> None:
    """Send the job ids this session committed. Called from the session's after_commit hook."""
    job_ids = session.info.pop("outbox", None)
    queue = _queue
    if job_ids and queue is not None:
        try:
            queue.send(list(job_ids))
        except Exception:  # the rows stay queued; reconcile sends them again
            log.warning("dispatch of %d job(s) failed; reconcile will retry", len(job_ids), exc_info=True)


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    dispatch_outbox(session)


@event.listens_for(Session, "after_soft_rollback")
def _after_rollback(session: Session, previous_transaction: Any) -> None:
    session.info.pop("outbox", None)


def get_job(session: Session, *, job_id: str, tenant_id: int | None) -> Job:
    """A job by id; `tenant_id=None` is the operator's view across tenants."""
    job = session.get(Job, job_id)
    if job is None or (tenant_id is not None and job.tenant_id != tenant_id):
        raise NotFound(f"job {job_id!r} not found")
    return job


def job_to_dict(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state,
        "attempts": job.attempts,
        "error": job.error,
        "created_at": job.created_at.isoformat() if job.created_at else None,
        "updated_at": job.updated_at.isoformat() if job.updated_at else None,
        "tenant_id": job.tenant_id,
        "payload": job.payload,
        "result": job.result,
    }


Handler = Callable[[Session, Job], dict[str, Any] | None]
_handlers: dict[str, Handler] = {}


def handler(kind: str) -> Callable[[Handler], Handler]:
    """Register the function that runs jobs of `kind`."""

    def register(fn: Handler) -> Handler:
        _handlers[kind] = fn
        return fn

    return register


@dataclass(frozen=True)
class RunOutcome:
    state: str  # succeeded | retry | failed | skipped
    attempts: int
    error: str | None = None
    retry_in: float = 0.0


def backoff_seconds(attempt: int, *, base: float, cap: float = 300.0) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * (2 ** max(attempt - 1, 0))))


class PermanentJobError(Exception):
    """A failure that retrying cannot fix (bad payload, missing datasource): the job fails at once."""


def run_job(
    job_id: str,
    *,
    session_factory: Callable[[], Any],
    max_attempts: int,
    running_lease: timedelta = timedelta(seconds=20),
    retry_base_seconds: float = 1.0,
) -> RunOutcome:
    """Run one job once: claim it, call its handler in its own transaction, record the outcome.

    A second delivery of a job that is running now (within its lease) or whose retry is not yet due is
    skipped, so duplicate messages never run a job twice at once or inflate its attempts. While the
    handler runs, a heartbeat renews the lease (``updated_at``) every quarter of it: a job whose
    worker died stops renewing, and reconcile dispatches it again once the lease lapses.
    """
    import core.jobs.handlers  # noqa: F401 - registers every handler before the first job runs

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
    fn = _handlers.get(kind)
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


def retry_job(session: Session, *, job_id: str, tenant_id: int | None) -> Job:
    """Put a failed (or stuck) job back in the queue; it is dispatched after commit."""
    job = get_job(session, job_id=job_id, tenant_id=tenant_id)
    job.state = "queued"
    job.attempts = 0
    job.updated_at = now()
    job.dispatched_at = None
    job.finished_at = None
    session.info.setdefault("outbox", []).append(job.id)
    return job


def jobs_to_redispatch(session: Session, *, older_than: timedelta, running_lease: timedelta) -> list[str]:
    """Queued jobs nobody ran for a while (lost message) and running jobs whose worker died."""
    cutoff = now() - older_than
    lease_cutoff = now() - running_lease
    rows = session.scalars(
        select(Job.id)
        .where(
            or_(
                (Job.state == "queued") & (func.coalesce(Job.dispatched_at, Job.updated_at) < cutoff),
                (Job.state == "running") & (Job.updated_at < lease_cutoff),
            )
        )
        .order_by(Job.created_at)
        .limit(5_000)
    ).all()
    if rows:
        # A running job past its lease lost its worker: it is queued again, so the new delivery runs it.
        session.execute(
            update(Job).where(Job.id.in_(rows)).values(state="queued", updated_at=now(), dispatched_at=None)
        )
        session.info.setdefault("outbox", []).extend(rows)
    return list(rows)
