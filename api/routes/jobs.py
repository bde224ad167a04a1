"""Jobs: list, status and retry. Tenant keys see their tenant's jobs; the operator key sees every tenant's
(and system jobs such as reconcile and prune). Retrying needs a tenant admin key or the operator key."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.auth import bearer_token, caller_from_request, is_operator_key
from core.config import get_settings
from core.db import system_session
from core.errors import Forbidden
from core.jobs import queries
from core.jobs.service import get_job

router = APIRouter(prefix="/v1")


def tenant_scope(request: Request) -> int | None:
    """None for the operator (all tenants), else the caller's tenant id."""
    if is_operator_key(bearer_token(request)):
        return None
    return caller_from_request(request).tenant_id


@router.get("/jobs")
def list_jobs(request: Request) -> dict[str, Any]:
    scope = tenant_scope(request)
    params = dict(request.query_params)
    tenant_name = params.get("tenant")
    if tenant_name and scope is not None:
        raise Forbidden("only the operator key may filter jobs by tenant")
    with system_session() as session:
        tenant_id = queries.tenant_id_by_name(session, name=tenant_name) if tenant_name else None
        filters = queries.parse_filters(params, tenant_id=tenant_id)
        jobs, next_cursor = queries.list_jobs(session, filters=filters, scope=scope)
    return {"jobs": jobs, "next_cursor": next_cursor}


@router.get("/jobs/{job_id}")
def read_job(job_id: str, request: Request) -> dict[str, Any]:
    scope = tenant_scope(request)
    with system_session() as session:
        job = get_job(session, job_id=job_id, tenant_id=scope)
        names = queries.tenant_names(session, {job.tenant_id})
        return queries.job_view(job, tenant_name=names.get(job.tenant_id) if job.tenant_id else None)


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
    return JSONResponse(body, status_code=202)


@router.post("/jobs/{job_id}/retry")
def retry(job_id: str, request: Request) -> JSONResponse:
    scope = tenant_scope(request)
    if scope is not None and not caller_from_request(request).is_admin:
        raise Forbidden("retrying a job needs an admin key")
    return retry_as(job_id=job_id, scope=scope)
