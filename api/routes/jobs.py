"""Job status. Tenant keys see their tenant's jobs; the operator key sees every tenant's."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api.auth import bearer_token, is_operator_key, require_caller
from core.db import system_session
from core.jobs.service import get_job, job_to_dict

router = APIRouter(prefix="/v1")


def tenant_scope(request: Request) -> int | None:
    """None for the operator (all tenants), else the caller's tenant id."""
    if is_operator_key(bearer_token(request)):
        return None
    return require_caller(request).tenant_id


@router.get("/jobs/{job_id}")
def read_job(job_id: str, request: Request) -> dict[str, Any]:
    scope = tenant_scope(request)
    with system_session() as session:
        return job_to_dict(get_job(session, job_id=job_id, tenant_id=scope))
