"""The transactional outbox and job execution, independent of the queue that carries the messages.

A write adds its job rows to the same session (``enqueue``); when that session commits, the job ids are
handed to the registered :class:`JobQueue` (Celery in production). If the hand-off fails, the row is still
``queued`` and the reconciler dispatches it again, so a committed job is never lost. Handlers must be
idempotent: a job may run more than once.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import case, event, func, or_, select, text, update
from sqlalchemy.orm import Session

from core import sql
from core.errors import NotFound
from core.jobs.models import Job
from core.tracing import job_context

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
    """Add a job row to the caller's unit of work; it is dispatched after that unit commits.

    The payload also keeps the enqueuing request's id and trace (``context``), which the worker's logs and
    spans continue."""
    payload = _with_context(payload)
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
    outbox_add(session, [job.id])
    return job


def _with_context(payload: dict[str, Any]) -> dict[str, Any]:
    context = job_context()
    return {**payload, "context": context} if context else payload


_INSERT = text(
    "INSERT INTO jobs (id, tenant_id, kind, state, payload, attempts, created_at, updated_at)"
    " VALUES (:id, :tenant_id, :kind, 'queued', CAST(:payload AS jsonb), 0, now(), now())"
)


def enqueue_query(*, tenant_id: int | None, kind: str, payload: dict[str, Any]) -> tuple[sql.Query, str]:
    """:func:`enqueue` as a statement a write sends with its others (core.sql), and the job's id, which the
    write adds to the session's outbox (:func:`outbox_add`) once the statement ran."""
    job_id = new_job_id()
    values = {"id": job_id, "tenant_id": tenant_id, "kind": kind, "payload": json.dumps(_with_context(payload))}
    return sql.Query(("enqueue",), lambda: _INSERT, values, generic=True), job_id


def new_job_id() -> str:
    """An id for a job row the caller inserts itself (in SQL); :func:`outbox_add` it once the row is written."""
    return uuid.uuid4().hex


def outbox_add(session: Session, job_ids: Iterable[str]) -> None:
    """Job rows this unit of work wrote: dispatched after it commits (the shortcut, see dispatch_outbox)."""
    session.info.setdefault("outbox", []).extend(job_ids)


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


def next_attempt_at(job: Job) -> str | None:
    """When a job waiting out its retry backoff runs again (its dispatched_at, set into the future by the
    runner); None for jobs not waiting on a retry."""
    if job.state == "queued" and job.attempts > 0 and job.dispatched_at is not None:
        return job.dispatched_at.isoformat()
    return None


def job_to_dict(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state,
        "attempts": job.attempts,
        "error": job.error,
        "created_at": job.created_at.isoformat() if job.created_at else None,
        "updated_at": job.updated_at.isoformat() if job.updated_at else None,
        "attempt_errors": list(job.attempt_errors or []),
        "next_attempt_at": next_attempt_at(job),
        "tenant_id": job.tenant_id,
        "payload": job.payload,
        "result": job.result,
        "abandoned": job.abandoned,
    }


class PermanentJobError(Exception):
    """A failure that retrying cannot fix (bad payload, missing datasource): the job fails at once."""


def retry_job(session: Session, *, job_id: str, tenant_id: int | None) -> Job:
    """Put a failed (or stuck) job back in the queue; it is dispatched after commit."""
    job = get_job(session, job_id=job_id, tenant_id=tenant_id)
    job.state = "queued"
    job.attempts = 0
    job.abandoned = None
    job.updated_at = now()
    job.dispatched_at = None
    job.finished_at = None
    outbox_add(session, [job.id])
    # The relays publish it as soon as this commits (the notification wakes them; no insert does here).
    session.execute(text("SELECT pg_notify('engram_jobs', 'retried')"))
    return job


WORKER_LOST = "WorkerLost: the worker running this attempt stopped renewing its lease"


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
        # A running job past its lease lost its worker: it is queued again, so the new delivery runs it, and
        # the lost attempt is recorded like a failed one.
        # (jsonb_build_object writes a timestamptz as ISO 8601 with its offset, as the runner's entries are.)
        lost = func.jsonb_build_array(
            func.jsonb_build_object("attempt", Job.attempts, "error", WORKER_LOST, "at", func.now())
        )
        session.execute(
            update(Job)
            .where(Job.id.in_(rows))
            .values(
                state="queued",
                updated_at=now(),
                dispatched_at=None,
                error=case((Job.state == "running", WORKER_LOST), else_=Job.error),
                attempt_errors=case(
                    (Job.state == "running", Job.attempt_errors.op("||")(lost)), else_=Job.attempt_errors
                ),
            )
        )
        outbox_add(session, rows)
    return list(rows)
