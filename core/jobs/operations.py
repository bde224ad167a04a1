"""What an operator does to jobs (REST with the operator key, and the dashboard): retry every failed job of a
filter, discard failed jobs (they stay failed, marked abandoned with who and why, and leave the failure
lists), cancel queued ones, and the filters those take.

Job states stay the four of the contract: a discarded job is ``failed`` with ``abandoned`` set; a cancelled
one is ``failed`` with an error saying who cancelled it and ``abandoned`` set. A retry (one job, or all of a
filter) clears ``abandoned`` and queues the job again; the relay publishes it (a notification wakes it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import ColumnElement, func, select, text, update
from sqlalchemy.orm import Session

from core.errors import Conflict, Invalid
from core.jobs.models import JOB_KINDS, Job
from core.jobs.service import get_job, now

# One bulk action touches at most this many jobs; repeat it for more (each call answers how many it took).
MAX_BULK = 10_000
_WAKE_RELAYS = text("SELECT pg_notify('engram_jobs', 'retried')")


class JobFilterIn(BaseModel):
    """Which failed jobs a bulk action takes: every field narrows (none: every failed job)."""

    model_config = ConfigDict(extra="forbid")

    kind: str | None = Field(default=None, description=f"one of {', '.join(JOB_KINDS)}")
    tenant: str | None = Field(default=None, max_length=200, description="the tenant's name")
    error_contains: str | None = Field(default=None, max_length=500, description="a substring of the job's error")
    ids: list[str] | None = Field(default=None, max_length=MAX_BULK, description="only these job ids")


class DiscardIn(JobFilterIn):
    reason: str = Field(min_length=1, max_length=1000, description="why: kept on each job")
    by: str | None = Field(default=None, max_length=200, description="who (default: operator)")


class AbandonIn(BaseModel):
    """The body of discarding or cancelling one job."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000, description="why: kept on the job")
    by: str | None = Field(default=None, max_length=200, description="who (default: operator)")


def _conditions(filters: JobFilterIn, *, tenant_id: int | None) -> list[ColumnElement[bool]]:
    if filters.kind is not None and filters.kind not in JOB_KINDS:
        raise Invalid(f"kind must be one of {', '.join(JOB_KINDS)}", field="kind")
    for name in ("tenant", "error_contains"):
        if "\0" in (getattr(filters, name) or ""):
            raise Invalid(f"{name} must not contain NUL", field=name)
    if any("\0" in job_id or len(job_id) > 100 for job_id in filters.ids or []):
        raise Invalid("ids must be job ids", field="ids")
    conditions: list[ColumnElement[bool]] = [Job.state == "failed", Job.abandoned.is_(None)]
    if filters.kind:
        conditions.append(Job.kind == filters.kind)
    if filters.tenant is not None:
        conditions.append(Job.tenant_id == tenant_id)
    if filters.error_contains:
        conditions.append(func.strpos(Job.error, filters.error_contains) > 0)
    if filters.ids is not None:
        conditions.append(Job.id.in_(filters.ids))
    return conditions


def _matching(session: Session, filters: JobFilterIn, *, tenant_id: int | None) -> list[str]:
    return list(
        session.scalars(
            select(Job.id)
            .where(*_conditions(filters, tenant_id=tenant_id))
            .order_by(Job.created_at, Job.id)
            .limit(MAX_BULK)
            .with_for_update(skip_locked=True)
        ).all()
    )


def retry_failed(session: Session, *, filters: JobFilterIn, tenant_id: int | None) -> list[str]:
    """Queue every failed, not discarded job of the filter again (at most MAX_BULK); returns their ids."""
    ids = _matching(session, filters, tenant_id=tenant_id)
    if ids:
        at = now()
        session.execute(
            update(Job)
            .where(Job.id.in_(ids), Job.state == "failed")
            .values(state="queued", attempts=0, updated_at=at, dispatched_at=None, finished_at=None)
        )
        session.execute(_WAKE_RELAYS)
    return ids


def _mark(*, by: str | None, reason: str, from_state: str) -> dict[str, Any]:
    return {"by": by or "operator", "reason": reason, "at": now().isoformat(), "from_state": from_state}


def discard_failed(session: Session, *, filters: DiscardIn, tenant_id: int | None) -> list[str]:
    """Mark every failed job of the filter abandoned (who, why, when); returns their ids."""
    ids = _matching(session, filters, tenant_id=tenant_id)
    if ids:
        session.execute(
            update(Job)
            .where(Job.id.in_(ids))
            .values(abandoned=_mark(by=filters.by, reason=filters.reason, from_state="failed"), updated_at=now())
        )
    return ids


def discard(session: Session, *, job_id: str, body: AbandonIn) -> Job:
    """Mark one failed job abandoned; 409 for any other state (a queued job is cancelled instead)."""
    job = get_job(session, job_id=job_id, tenant_id=None)
    session.refresh(job, with_for_update=True)
    if job.state != "failed" or job.abandoned is not None:
        state = "discarded" if job.abandoned is not None else job.state
        raise Conflict(f"job {job_id!r} is {state}; only a failed job is discarded (cancel a queued one)")
    job.abandoned = _mark(by=body.by, reason=body.reason, from_state="failed")
    job.updated_at = now()
    return job


def cancel(session: Session, *, job_id: str, body: AbandonIn) -> Job:
    """End one queued job without running it (failed, abandoned, the error naming who cancelled it and why).

    409 for a job that is running (its worker may be writing; let it finish or fail) or already finished.
    The row lock orders this against a worker's claim: whichever commits first wins, the other sees it.
    """
    job = get_job(session, job_id=job_id, tenant_id=None)
    session.refresh(job, with_for_update=True)
    if job.state != "queued":
        raise Conflict(f"job {job_id!r} is {job.state}; only a queued job can be cancelled")
    at = now()
    mark = _mark(by=body.by, reason=body.reason, from_state="queued")
    job.state = "failed"
    job.error = f"cancelled by {mark['by']}: {body.reason}"
    job.abandoned = mark
    job.finished_at = job.updated_at = at
    return job
