"""Catalog job handlers: ingest, refresh_samples, ingest_cleanup (named in workers.handlers.HANDLERS).

A missing datasource, one this server refuses to open, or one that cannot be reached (missing SQLite file,
refused connection, bad credentials) fails the job at once and changes nothing: the contract says such an
ingest "fails the job", and a caller polling the job must see `failed` with the reason, not hours of silent
backoff. Once the source is back, `POST /v1/jobs/{id}/retry` or a new ingest runs it again.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from core.db import scope_to_tenant
from core.entities.cleanup import cleanup_datasource_refs
from core.entities.ingest import run_ingest
from core.entities.profiling import refresh_samples
from core.entities.sources import SourceError, SourceRefused
from core.errors import NotFound
from core.jobs.models import Job
from core.jobs.service import PermanentJobError
from core.webhooks.service import emit


def _datasource_of(session: Session, job: Job) -> tuple[int, str]:
    if job.tenant_id is None:
        raise PermanentJobError(f"{job.kind} job without a tenant")
    datasource = job.payload.get("datasource")
    if not isinstance(datasource, str) or not datasource:
        raise PermanentJobError(f"{job.kind} job payload has no datasource")
    scope_to_tenant(session, job.tenant_id)
    return job.tenant_id, datasource


def _optional_names(job: Job, key: str) -> list[str] | None:
    value = job.payload.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PermanentJobError(f"{job.kind} job payload: {key} must be a list of names")
    return value


def run_ingest_job(session: Session, job: Job) -> dict[str, Any]:
    tenant_id, datasource = _datasource_of(session, job)
    try:
        result = run_ingest(session, tenant_id=tenant_id, datasource=datasource)
    except (NotFound, SourceRefused) as exc:
        raise PermanentJobError(exc.message) from None
    except SourceError as exc:
        raise PermanentJobError(f"source database: {exc}") from None

    emit(session, tenant_id=tenant_id, type="ingest.succeeded", data={"job_id": job.id, "datasource": datasource})
    return result


def run_refresh_samples_job(session: Session, job: Job) -> dict[str, Any]:
    tenant_id, datasource = _datasource_of(session, job)
    try:
        return refresh_samples(
            session,
            tenant_id=tenant_id,
            datasource=datasource,
            models=_optional_names(job, "models"),
            columns=_optional_names(job, "columns"),
        )
    except (NotFound, SourceRefused) as exc:
        raise PermanentJobError(exc.message) from None
    except SourceError as exc:
        raise PermanentJobError(f"source database: {exc}") from None


def run_ingest_cleanup_job(session: Session, job: Job) -> dict[str, Any]:
    tenant_id, datasource = _datasource_of(session, job)
    return cleanup_datasource_refs(session, tenant_id=tenant_id, datasource=datasource)
