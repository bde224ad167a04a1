"""Jobs: list, status and retry. Tenant keys see their tenant's jobs; the operator key sees every tenant's
(and system jobs such as reconcile and prune). Retrying needs a tenant admin key or the operator key."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse

from api.auth import bearer_token, caller_from_request, is_operator_key
from api.openapi import BEARER, JobIdPath, Query, operation
from api.schemas import Job, JobPage
from core.config import get_settings
from core.db import system_session
from core.entities.schemas import NoOptionsIn
from core.errors import Forbidden
from core.jobs import queries
from core.jobs.models import JOB_KINDS, JOB_STATES
from core.jobs.service import get_job
from core.memories.schemas import parse_model

router = APIRouter(prefix="/v1", tags=["jobs"], dependencies=[Depends(BEARER)])

_JOB_QUERY: Query = {
    "kind": ({"type": "string", "enum": list(JOB_KINDS)}, "only jobs of this kind"),
    "state": ({"type": "string", "enum": list(JOB_STATES)}, "only jobs in this state"),
    "tenant": ({"type": "string"}, "only this tenant's jobs (operator key only)"),
    "limit": ({"type": "integer", "minimum": 1, "maximum": queries.MAX_PAGE, "default": 50}, "page size"),
    "cursor": ({"type": "string"}, "the `next_cursor` of the previous page"),
}


def tenant_scope(request: Request) -> int | None:
    """None for the operator (all tenants), else the caller's tenant id."""
    if is_operator_key(bearer_token(request)):
        return None
    return caller_from_request(request).tenant_id


@router.get(
    "/jobs", **operation(summary="List jobs", response=JobPage, errors=(400, 403, 404), query=_JOB_QUERY)
)
def list_jobs(request: Request) -> dict[str, Any]:
    """Newest first: the caller's tenant's jobs, or every tenant's (and system jobs) for the operator key."""
    scope = tenant_scope(request)
    params = dict(request.query_params)
    tenant_name = params.get("tenant")
    if tenant_name and scope is not None:
        raise Forbidden("only the operator key may filter jobs by tenant")
    with system_session() as session:
        tenant_id = queries.tenant_id_by_name(session, name=tenant_name) if tenant_name else None
        filters = queries.parse_filters(params, tenant_id=tenant_id)
        jobs, next_cursor = queries.list_jobs(session, filters=filters, scope=scope)
    return {"jobs": [as_seen_by(job, scope=scope) for job in jobs], "next_cursor": next_cursor}


def as_seen_by(job: dict[str, Any], *, scope: int | None) -> dict[str, Any]:
    """A job as its caller may see it: a tenant's key gets each failed attempt's error message, never the
    worker's traceback (server paths, code); the operator (scope None) sees everything."""
    if scope is None or not job.get("attempt_errors"):
        return job
    attempts = [{k: v for k, v in attempt.items() if k != "traceback"} for attempt in job["attempt_errors"]]
    return {**job, "attempt_errors": attempts}


@router.get("/jobs/{job_id}", **operation(summary="Read a job", response=Job, errors=(404,)))
def read_job(job_id: JobIdPath, request: Request) -> dict[str, Any]:
    """A job's kind, state, attempts and last error (a tenant key sees its tenant's jobs only)."""
    scope = tenant_scope(request)
    with system_session() as session:
        job = get_job(session, job_id=job_id, tenant_id=scope)
        names = queries.tenant_names(session, {job.tenant_id})
        view = queries.job_view(job, tenant_name=names.get(job.tenant_id) if job.tenant_id else None)
    return as_seen_by(view, scope=scope)


def retry_as(*, job_id: str, scope: int | None) -> JSONResponse:
    """Retry on behalf of an authorised caller (this route and the dashboard share it)."""
    settings = get_settings()
    with system_session() as session:
        job = queries.retry(
            session,
            job_id=job_id,
            scope=scope,
            queued_after=timedelta(seconds=settings.outbox_redispatch_seconds),
            running_lease=timedelta(seconds=settings.job_running_lease_seconds),
        )
        names = queries.tenant_names(session, {job.tenant_id})
        body = queries.job_view(job, tenant_name=names.get(job.tenant_id) if job.tenant_id else None)
    return JSONResponse(as_seen_by(body, scope=scope), status_code=202)


@router.post(
    "/jobs/{job_id}/retry",
    status_code=202,
    **operation(
        summary="Retry a job",
        body=NoOptionsIn,
        body_required=False,
        example={},
        response=Job,
        status=202,
        errors=(403, 404, 409, 422),
    ),
)
def retry_job(job_id: JobIdPath, request: Request, body: Any = Body(default=None)) -> JSONResponse:
    """Queue a failed or stuck job again (tenant admin key, or the operator key); 409 if it is not stuck."""
    parse_model(NoOptionsIn, {} if body is None else body)
    scope = tenant_scope(request)
    if scope is not None and not caller_from_request(request).is_admin:
        raise Forbidden("retrying a job needs an admin key")
    return retry_as(job_id=job_id, scope=scope)
