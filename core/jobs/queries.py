"""Reads over the jobs table for operators: listing, retry rules, the dashboard summary, scrape-time figures.

Everything here is computed from the jobs table, which every process (API replicas, workers, beat) writes,
so the figures are cluster-wide whichever API process answers.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, DateTime, Integer, case, column, func, literal_column, select, tuple_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from core.errors import BadRequest, Conflict, Invalid, NotFound
from core.jobs.models import JOB_KINDS, JOB_STATES, Job
from core.jobs.service import get_job, job_to_dict, now, retry_job
from core.parsing import plain_int
from core.tenancy.models import Tenant

MAX_PAGE = 200
FAILED_SHOWN = 50
RECENT_SHOWN = 20
# Upper bounds (seconds) of the job duration histogram buckets; +Inf is added by the exporter.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


@dataclass(frozen=True)
class JobFilters:
    kind: str | None = None
    state: str | None = None
    tenant_id: int | None = None
    limit: int = 50
    cursor: str | None = None


def parse_filters(params: dict[str, str], *, tenant_id: int | None) -> JobFilters:
    """Validate the query string of GET /v1/jobs (bad values are 422 naming the field, never a 500)."""
    kind, state = params.get("kind") or None, params.get("state") or None
    if kind is not None and kind not in JOB_KINDS:
        raise Invalid(f"kind must be one of {', '.join(JOB_KINDS)}", field="kind")
    if state is not None and state not in JOB_STATES:
        raise Invalid(f"state must be one of {', '.join(JOB_STATES)}", field="state")
    limit = plain_int(params.get("limit", "50"), max_digits=6)
    if limit is None or not 1 <= limit <= MAX_PAGE:
        raise Invalid(f"limit must be an integer from 1 to {MAX_PAGE}", field="limit")
    return JobFilters(kind=kind, state=state, tenant_id=tenant_id, limit=limit, cursor=params.get("cursor"))


def tenant_id_by_name(session: Session, *, name: str) -> int:
    tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == name))
    if tenant_id is None:
        raise NotFound(f"tenant {name!r} not found")
    return int(tenant_id)


def _encode_cursor(created_at: datetime, job_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), job_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        values = json.loads(base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode()))
        if not isinstance(values, list) or len(values) != 2 or "\0" in str(values[1]):
            raise ValueError("wrong shape")  # NUL: PostgreSQL refuses it in a text parameter
        return datetime.fromisoformat(values[0]), str(values[1])
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError):
        raise BadRequest("cursor is not one this API returned", field="cursor") from None


def tenant_names(session: Session, tenant_ids: set[int | None]) -> dict[int, str]:
    ids = [t for t in tenant_ids if t is not None]
    if not ids:
        return {}
    return {int(i): n for i, n in session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(ids)))}


def tenant_list(session: Session, *, limit: int = 1000) -> list[str]:
    """Tenant names in order, for the dashboard's tenant filter."""
    return list(session.scalars(select(Tenant.name).order_by(Tenant.name).limit(limit)).all())


def job_view(job: Job, *, tenant_name: str | None) -> dict[str, Any]:
    """The public job shape plus what operators need to judge it (timing and the tenant's name)."""
    body = job_to_dict(job)
    body.update(
        tenant=tenant_name,
        started_at=job.started_at.isoformat() if job.started_at else None,
        finished_at=job.finished_at.isoformat() if job.finished_at else None,
    )
    return body


def list_jobs(session: Session, *, filters: JobFilters, scope: int | None) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first. `scope` is the caller's tenant (None: the operator, every tenant and system jobs)."""
    conditions: list[ColumnElement[bool]] = []
    if scope is not None:
        conditions.append(Job.tenant_id == scope)
    if filters.tenant_id is not None:
        conditions.append(Job.tenant_id == filters.tenant_id)
    if filters.kind:
        conditions.append(Job.kind == filters.kind)
    if filters.state:
        conditions.append(Job.state == filters.state)
    if filters.cursor:
        created_at, job_id = _decode_cursor(filters.cursor)
        conditions.append(tuple_(Job.created_at, Job.id) < tuple_(created_at, job_id))
    rows = list(
        session.scalars(
            select(Job).where(*conditions).order_by(Job.created_at.desc(), Job.id.desc()).limit(filters.limit + 1)
        ).all()
    )
    next_cursor = None
    if len(rows) > filters.limit:
        rows = rows[: filters.limit]
        next_cursor = _encode_cursor(rows[-1].created_at, rows[-1].id)
    names = tenant_names(session, {j.tenant_id for j in rows})
    return [job_view(j, tenant_name=names.get(j.tenant_id) if j.tenant_id else None) for j in rows], next_cursor


def stuck_reason(job: Job, *, queued_after: timedelta, running_lease: timedelta) -> str | None:
    """Why a queued or running job counts as stuck (None when it is progressing normally)."""
    age = now() - job.updated_at
    if job.state == "queued" and age > queued_after:
        return f"queued without running for {int(age.total_seconds())} s"
    if job.state == "running" and age > running_lease:
        return f"running for {int(age.total_seconds())} s, past the {int(running_lease.total_seconds())} s lease"
    return None


def retry(
    session: Session, *, job_id: str, scope: int | None, queued_after: timedelta, running_lease: timedelta
) -> Job:
    """Queue a failed or stuck job again. 409 for a succeeded job or one that is progressing normally.

    A healthy queued or running job is refused so a retry button pressed twice cannot run a job twice in
    parallel; a stuck one (past the reconcile thresholds) is taken back, which is safe because handlers
    are idempotent.
    """
    job = get_job(session, job_id=job_id, tenant_id=scope)
    session.refresh(job, with_for_update=True)
    if job.state == "succeeded":
        raise Conflict(f"job {job_id!r} already succeeded; nothing to retry")
    if (
        job.state in ("queued", "running")
        and stuck_reason(job, queued_after=queued_after, running_lease=running_lease) is None
    ):
        raise Conflict(f"job {job_id!r} is {job.state} and not stuck; retry applies to failed or stuck jobs")
    return retry_job(session, job_id=job_id, tenant_id=scope)


def _tenant_filter(scope: int | None) -> list[ColumnElement[bool]]:
    return [] if scope is None else [Job.tenant_id == scope]


def _waiting_since() -> ColumnElement[datetime]:
    """Since when a queued job has been waiting to run, for its current turn in the queue.

    Not its creation: a job retried after failing has waited only since it was queued again. The runner
    queues a failed attempt with ``dispatched_at`` at the moment its retry is due (in the future while it
    waits out the backoff, when it is not waiting in the queue at all); a retry from the dashboard or the
    reconciler sets ``updated_at``. A first attempt waits since it was queued (``updated_at``, its creation):
    the relay's own ``dispatched_at`` stamp on publishing does not restart the wait.
    """
    return case(
        (
            (Job.attempts > 0) & Job.dispatched_at.is_not(None),
            func.greatest(Job.updated_at, Job.dispatched_at),
        ),
        else_=Job.updated_at,
    )


def summary(session: Session, *, scope: int | None) -> dict[str, Any]:
    """Per tenant and kind: counts by state, throughput over the last hour, the oldest queued job's age;
    plus the latest failed jobs with their errors."""
    current = now()
    hour_ago = current - timedelta(hours=1)
    groups: dict[tuple[int | None, str], dict[str, Any]] = {}

    def group(tenant_id: int | None, kind: str) -> dict[str, Any]:
        return groups.setdefault(
            (tenant_id, kind),
            {
                "tenant_id": tenant_id,
                "kind": kind,
                **dict.fromkeys(JOB_STATES, 0),
                "succeeded_last_hour": 0,
                "failed_last_hour": 0,
                "retry_scheduled": 0,
                "oldest_queued_age_seconds": None,
            },
        )

    counts = session.execute(
        select(Job.tenant_id, Job.kind, Job.state, func.count())
        .where(*_tenant_filter(scope))
        .group_by(Job.tenant_id, Job.kind, Job.state)
    ).all()
    for tenant_id, kind, state, count in counts:
        group(tenant_id, kind)[state] = int(count)
    for tenant_id, kind, waiting, oldest in session.execute(
        select(
            Job.tenant_id,
            Job.kind,
            func.count().filter(_waiting_since() <= current),
            func.min(_waiting_since()).filter(_waiting_since() <= current),
        )
        .where(*_tenant_filter(scope), Job.state == "queued")
        .group_by(Job.tenant_id, Job.kind)
    ).all():
        row = group(tenant_id, kind)
        row["retry_scheduled"] = row["queued"] - int(waiting)
        if oldest is not None:
            row["oldest_queued_age_seconds"] = round((current - oldest).total_seconds(), 1)
    finished = session.execute(
        select(Job.tenant_id, Job.kind, Job.state, func.count())
        .where(*_tenant_filter(scope), Job.finished_at >= hour_ago, Job.state.in_(("succeeded", "failed")))
        .group_by(Job.tenant_id, Job.kind, Job.state)
    ).all()
    for tenant_id, kind, state, count in finished:
        group(tenant_id, kind)[f"{state}_last_hour"] = int(count)
    failed = session.scalars(
        select(Job)
        .where(*_tenant_filter(scope), Job.state == "failed", Job.abandoned.is_(None))
        .order_by(Job.updated_at.desc(), Job.id)
        .limit(FAILED_SHOWN)
    ).all()
    recent = session.scalars(
        select(Job).where(*_tenant_filter(scope)).order_by(Job.updated_at.desc(), Job.id).limit(RECENT_SHOWN)
    ).all()
    names = tenant_names(session, {t for t, _ in groups} | {j.tenant_id for j in [*failed, *recent]})
    rows = sorted(groups.values(), key=lambda r: (names.get(r["tenant_id"], ""), r["kind"]))
    for row in rows:
        row["tenant"] = names.get(row["tenant_id"]) if row["tenant_id"] else None
    return {
        "generated_at": current.isoformat(),
        "queues": rows,
        "failed": [job_view(j, tenant_name=names.get(j.tenant_id) if j.tenant_id else None) for j in failed],
        "recent": [job_view(j, tenant_name=names.get(j.tenant_id) if j.tenant_id else None) for j in recent],
    }


def queue_figures(session: Session) -> list[tuple[str, str, int, float | None]]:
    """(kind, state, count, oldest queued age in seconds) over every tenant, for /metrics."""
    current = now()
    oldest_waiting = func.min(_waiting_since()).filter(Job.state == "queued", _waiting_since() <= current)
    rows = session.execute(
        select(Job.kind, Job.state, func.count(), oldest_waiting).group_by(Job.kind, Job.state)
    ).all()
    return [
        (kind, state, int(count), (current - oldest).total_seconds() if state == "queued" and oldest else None)
        for kind, state, count, oldest in rows
    ]


def duration_histogram(session: Session) -> list[tuple[str, str, list[int], int, float]]:
    """Per kind and final state: cumulative bucket counts, total count and summed seconds of the last
    attempt (finished_at - started_at) of every finished job."""
    seconds = func.extract("epoch", Job.finished_at - Job.started_at)
    bucket_columns = [func.sum(case((seconds <= bound, 1), else_=0).cast(Integer)) for bound in DURATION_BUCKETS]
    rows = session.execute(
        select(Job.kind, Job.state, func.count(), func.coalesce(func.sum(seconds), 0.0), *bucket_columns)
        .where(Job.state.in_(("succeeded", "failed")), Job.started_at.is_not(None), Job.finished_at.is_not(None))
        .group_by(Job.kind, Job.state)
    ).all()
    return [
        (kind, state, [int(b or 0) for b in buckets], int(count), float(total))
        for kind, state, count, total, *buckets in rows
    ]


def embed_attempts(session: Session) -> dict[str, float]:
    """Cluster-wide embedding work from the embed jobs: attempts that succeeded, attempts that failed
    (every attempt but the one that succeeded or is still running), and texts embedded."""
    row = session.execute(
        select(
            func.coalesce(func.sum(Job.attempts), 0),
            func.count().filter(Job.state == "succeeded"),
            func.count().filter(Job.state == "running"),
            func.coalesce(func.sum(Job.result["embedded"].as_integer()).filter(Job.state == "succeeded"), 0),
        ).where(Job.kind == "embed")
    ).one()
    attempts, succeeded, running, embedded = (int(v or 0) for v in row)
    return {
        "succeeded": float(succeeded),
        "failed": float(max(attempts - succeeded - running, 0)),
        "embedded_texts": float(embedded),
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def job_detail(session: Session, *, job_id: str) -> dict[str, Any]:
    """Everything an operator needs to judge one job: payload, result, every attempt's error (with its
    traceback when the runner stored one) and its timings, including when it entered its current wait."""
    job = get_job(session, job_id=job_id, tenant_id=None)
    names = tenant_names(session, {job.tenant_id})
    body = job_view(job, tenant_name=names.get(job.tenant_id) if job.tenant_id else None)
    current = now()
    waiting_since = session.scalar(select(_waiting_since()).where(Job.id == job.id))
    body.update(
        dispatched_at=_iso(job.dispatched_at),
        # A retry still waiting out its backoff is not in the queue yet: next_attempt_at says when it will be.
        queued_since=_iso(waiting_since)
        if job.state == "queued" and waiting_since is not None and waiting_since <= current
        else None,
        heartbeat_age_seconds=round((current - job.updated_at).total_seconds(), 1) if job.state == "running" else None,
        duration_seconds=round((job.finished_at - job.started_at).total_seconds(), 3)
        if job.started_at and job.finished_at
        else None,
    )
    return body


def running_jobs(session: Session, *, limit: int = 200) -> list[dict[str, Any]]:
    """Running jobs with the age of their lease's last renewal: the runner renews ``updated_at`` every
    quarter lease while the handler runs, so a growing age means the worker running it is gone or stuck."""
    current = now()
    jobs = session.scalars(
        select(Job).where(Job.state == "running").order_by(Job.started_at, Job.id).limit(limit)
    ).all()
    names = tenant_names(session, {j.tenant_id for j in jobs})
    return [
        {
            "id": j.id,
            "kind": j.kind,
            "tenant": names.get(j.tenant_id) if j.tenant_id else None,
            "attempts": j.attempts,
            "started_at": _iso(j.started_at),
            "heartbeat_age_seconds": round((current - j.updated_at).total_seconds(), 1),
        }
        for j in jobs
    ]


def throughput(session: Session, *, hours: int = 24) -> dict[str, Any]:
    """Per hour over the last `hours`: jobs that succeeded, jobs that failed for good, and failed attempts
    (each retry's failure, from the attempts' error log), oldest hour first, empty hours included."""
    current = now()
    first = current.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    buckets = {first + timedelta(hours=i): {"succeeded": 0, "failed": 0, "failed_attempts": 0} for i in range(hours)}
    hour = func.date_trunc("hour", Job.finished_at, "UTC")
    for start, state, count in session.execute(
        select(hour, Job.state, func.count())
        .where(Job.finished_at >= first, Job.state.in_(("succeeded", "failed")))
        .group_by(hour, Job.state)
    ).all():
        if start in buckets:
            buckets[start][state] = int(count)
    attempt = func.jsonb_array_elements(Job.attempt_errors).table_valued(column("value", JSONB)).alias("attempt")
    at = func.date_trunc("hour", attempt.c.value["at"].astext.cast(DateTime(timezone=True)), "UTC")
    for start, count in session.execute(
        select(at, func.count())
        .select_from(Job)
        .join(attempt, literal_column("true"))
        .where(Job.updated_at >= first, attempt.c.value["at"].astext.cast(DateTime(timezone=True)) >= first)
        .group_by(at)
    ).all():
        if start in buckets:
            buckets[start]["failed_attempts"] = int(count)
    return {
        "generated_at": current.isoformat(),
        "bucket_seconds": 3600,
        "buckets": [{"start": start.isoformat(), **counts} for start, counts in buckets.items()],
    }
