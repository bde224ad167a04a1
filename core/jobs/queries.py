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

from sqlalchemy import ColumnElement, Integer, case, func, select, tuple_
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
        if not isinstance(values, list) or len(values) != 2:
            raise ValueError("wrong shape")
        return datetime.fromisoformat(values[0]), str(values[1])
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError):
        raise BadRequest("cursor is not one this API returned", field="cursor") from None


def tenant_names(session: Session, tenant_ids: set[int | None]) -> dict[int, str]:
    ids = [t for t in tenant_ids if t is not None]
    if not ids:
        return {}
    return {int(i): n for i, n in session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(ids)))}


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
                "oldest_queued_age_seconds": None,
            },
        )

    counts = session.execute(
        select(Job.tenant_id, Job.kind, Job.state, func.count(), func.min(Job.created_at))
        .where(*_tenant_filter(scope))
        .group_by(Job.tenant_id, Job.kind, Job.state)
    ).all()
    for tenant_id, kind, state, count, oldest in counts:
        row = group(tenant_id, kind)
        row[state] = int(count)
        if state == "queued" and oldest is not None:
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
        .where(*_tenant_filter(scope), Job.state == "failed")
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
    rows = session.execute(
        select(Job.kind, Job.state, func.count(), func.min(Job.created_at)).group_by(Job.kind, Job.state)
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
