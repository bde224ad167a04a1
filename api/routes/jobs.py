"""Jobs: list, status and retry. Tenant keys see their tenant's jobs; the operator key sees every tenant's
(and system jobs such as reconcile and prune). Retrying needs a tenant admin key or the operator key."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response

from api.auth import bearer_token, caller_from_request, is_operator_key
from api.openapi import JobIdPath, Query, operation
from api.responses import json_answer
from api.schemas import Job, JobBulkResult, JobPage
from api.threads import Route
from core.audit.service import Actor, record
from core.config import get_settings
from core.db import system_session
from core.entities.schemas import NoOptionsIn
from core.errors import Forbidden, Invalid, NotFound
from core.jobs import operations, queries
from core.jobs.models import JOB_KINDS, JOB_STATES
from core.jobs.service import get_job
from core.memories.schemas import parse_model
from core.tenancy.context import Caller

router = APIRouter(prefix="/v1", tags=["jobs"], route_class=Route)

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
def list_jobs(request: Request) -> Response:
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
    return json_answer({"jobs": [as_seen_by(job, scope=scope) for job in jobs], "next_cursor": next_cursor})


def as_seen_by(job: dict[str, Any], *, scope: int | None) -> dict[str, Any]:
    """A job as its caller may see it: a tenant's key gets each failed attempt's error message, never the
    worker's traceback (server paths, code); the operator (scope None) sees everything."""
    if scope is None or not job.get("attempt_errors"):
        return job
    attempts = [{k: v for k, v in attempt.items() if k != "traceback"} for attempt in job["attempt_errors"]]
    return {**job, "attempt_errors": attempts}


@router.get("/jobs/{job_id}", **operation(summary="Read a job", response=Job, errors=(404,)))
def read_job(job_id: JobIdPath, request: Request) -> Response:
    """A job's kind, state, attempts and last error (a tenant key sees its tenant's jobs only)."""
    scope = tenant_scope(request)
    with system_session() as session:
        job = get_job(session, job_id=job_id, tenant_id=scope)
        names = queries.tenant_names(session, {job.tenant_id})
        view = queries.job_view(job, tenant_name=names.get(job.tenant_id) if job.tenant_id else None)
    return json_answer(as_seen_by(view, scope=scope))


def retry_as(*, job_id: str, scope: int | None, caller: Caller | None = None) -> JSONResponse:
    """Retry on behalf of an authorised caller (this route and the dashboard share it): a tenant admin
    (`caller`) or the operator (none); either way the tenant's audit log records it."""
    settings = get_settings()
    with system_session() as session:
        job = queries.retry(
            session,
            job_id=job_id,
            scope=scope,
            queued_after=timedelta(seconds=settings.outbox_redispatch_seconds),
            running_lease=timedelta(seconds=settings.job_running_lease_seconds),
        )
        if job.tenant_id is not None:
            actor = caller if caller is not None else Actor(tenant_id=job.tenant_id, user="operator")
            record(session, caller_or_actor=actor, action="job.retry", target=f"job:{job_id}")
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
    caller = caller_from_request(request) if scope is not None else None
    if caller is not None and not caller.is_admin:
        raise Forbidden("retrying a job needs an admin key")
    return retry_as(job_id=job_id, scope=scope, caller=caller)


# Operator actions (the operator key; the dashboard has the same buttons).


def _operator_only(request: Request) -> None:
    if tenant_scope(request) is not None:
        raise Forbidden("this needs the operator key")


def _tenant_of(session: Any, name: str | None) -> int | None:
    if name is None:
        return None
    try:
        return queries.tenant_id_by_name(session, name=name)
    except NotFound:
        raise Invalid(f"no tenant named {name!r}", field="tenant") from None


def retry_failed_as(body: Any) -> dict[str, Any]:
    """Retry every failed job of a filter (this route and the dashboard share it)."""
    filters = parse_model(operations.JobFilterIn, {} if body is None else body)
    with system_session() as session:
        ids = operations.retry_failed(session, filters=filters, tenant_id=_tenant_of(session, filters.tenant))
    return {"count": len(ids), "job_ids": ids}


def discard_failed_as(body: Any, *, by: str | None = None) -> dict[str, Any]:
    filters = parse_model(operations.DiscardIn, body)
    if by is not None and filters.by is None:
        filters = filters.model_copy(update={"by": by})
    with system_session() as session:
        ids = operations.discard_failed(session, filters=filters, tenant_id=_tenant_of(session, filters.tenant))
    return {"count": len(ids), "job_ids": ids}


def abandon_as(job_id: str, body: Any, *, cancel: bool, by: str | None = None) -> dict[str, Any]:
    """Discard one failed job, or cancel one queued job; the job as it is now."""
    parsed = parse_model(operations.AbandonIn, body)
    if by is not None and parsed.by is None:
        parsed = parsed.model_copy(update={"by": by})
    with system_session() as session:
        act = operations.cancel if cancel else operations.discard
        job = act(session, job_id=job_id, body=parsed)
        names = queries.tenant_names(session, {job.tenant_id})
        return queries.job_view(job, tenant_name=names.get(job.tenant_id) if job.tenant_id else None)


_FILTER_EXAMPLE = {"kind": "embed", "tenant": "acme", "error_contains": "503"}


@router.post(
    "/jobs:retry",
    status_code=202,
    **operation(
        summary="Retry failed jobs",
        body=operations.JobFilterIn,
        body_required=False,
        example=_FILTER_EXAMPLE,
        response=JobBulkResult,
        status=202,
        errors=(403, 422),
    ),
)
def retry_failed_jobs(request: Request, body: Any = Body(default=None)) -> JSONResponse:
    """Queue again every failed job of the filter (operator key): kind, tenant, a substring of the error,
    or ids; discarded jobs are left alone. At most 10,000 a call; the answer says which."""
    _operator_only(request)
    return JSONResponse(retry_failed_as(body), status_code=202)


@router.post(
    "/jobs:discard",
    **operation(
        summary="Discard failed jobs",
        body=operations.DiscardIn,
        example={**_FILTER_EXAMPLE, "reason": "the source was retired", "by": "ops@example.com"},
        response=JobBulkResult,
        errors=(403, 422),
    ),
)
def discard_failed_jobs(request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    """Mark every failed job of the filter abandoned, with who and why (operator key): they stay failed, off
    the dashboard's failures and out of later bulk retries."""
    _operator_only(request)
    return discard_failed_as(body)


@router.post(
    "/jobs/{job_id}/discard",
    **operation(
        summary="Discard a failed job",
        body=operations.AbandonIn,
        example={"reason": "duplicate of a later import"},
        response=Job,
        errors=(403, 404, 409, 422),
    ),
)
def discard_job(job_id: JobIdPath, request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    """Mark one failed job abandoned, with who and why (operator key); 409 if it is not failed."""
    _operator_only(request)
    return abandon_as(job_id, body, cancel=False)


@router.post(
    "/jobs/{job_id}/cancel",
    **operation(
        summary="Cancel a queued job",
        body=operations.AbandonIn,
        example={"reason": "the tenant asked to stop the import"},
        response=Job,
        errors=(403, 404, 409, 422),
    ),
)
def cancel_job(job_id: JobIdPath, request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    """End a queued job without running it (operator key): it becomes failed, abandoned, its error naming
    who cancelled it and why. 409 for a running or finished job."""
    _operator_only(request)
    return abandon_as(job_id, body, cancel=True)
