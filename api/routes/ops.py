"""Operations: embedding coverage per doc kind and model (the operator key sees every tenant)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from api.openapi import operation
from api.routes.jobs import tenant_scope
from api.schemas import CoverageReport
from api.threads import Route
from core.config import get_settings
from core.db import scope_to_tenant, system_session
from core.embeddings.coverage import memory_counts
from core.embeddings.providers import get_embedder
from core.embeddings.reindex import progress, set_paused
from core.embeddings.store import CoverageRow, coverage
from core.entities.models import Datasource
from core.errors import Forbidden
from core.memories.schemas import parse_model
from core.tenancy.models import Tenant
from core.tenancy.usage import embedding_quota_spent, next_day_start

router = APIRouter(prefix="/v1/ops", tags=["operations"], route_class=Route)


def coverage_rows(tenant_id: int | None) -> list[dict[str, Any]]:
    """Coverage rows of one tenant, or of every tenant (the operator): memory counts for all of them in one
    read of the counters, the catalog rendered only for tenants that have one."""

    model = get_embedder(get_settings().embedding_model).name
    rows: list[dict[str, Any]] = []
    with system_session() as session:
        live = select(Tenant.id, Tenant.name, Tenant.state).where(Tenant.state != "deleting")
        tenants = session.execute(
            live.where(Tenant.id == tenant_id).order_by(Tenant.name) if tenant_id else live.order_by(Tenant.name)
        ).all()
        spent = embedding_quota_spent(session)
        counts = memory_counts(session, model=model, tenant_ids=[tenant_id] if tenant_id else None)
        with_catalog = set(session.scalars(select(Datasource.tenant_id).distinct()).all())
    for tid, name, state in tenants:
        waiting = _waiting(state=state, quota_spent=tid in spent)
        memories = counts.get(tid, (0, 0))
        if tid in with_catalog:
            with system_session() as session:
                scope_to_tenant(session, tid)
                found = coverage(session, configured_model=model, memory_counts=memories)
        else:
            found = [CoverageRow(doc_kind="memory", model=model, indexed=memories[0], expected=memories[1])]
        rows.extend(
            {
                "tenant": name,
                "doc_kind": row.doc_kind,
                "model": row.model,
                "indexed": row.indexed,
                "expected": row.expected,
                "ratio": row.ratio,
                "waiting": waiting if row.ratio < 1.0 else None,
            }
            for row in found
        )
    return rows


def _waiting(*, state: str, quota_spent: bool) -> str | None:
    """Why a tenant's embedding does not go on, when it does not (coverage then says so)."""
    if state == "suspended":
        return "tenant suspended: embedding goes on when it is resumed"
    if quota_spent:
        return f"quota embedding_texts_per_day reached: embedding resumes {next_day_start().isoformat()}"
    return None


@router.get("/coverage", **operation(summary="Embedding coverage", response=CoverageReport))
def read_coverage(request: Request) -> dict[str, Any]:
    """One row per doc kind and embedding model of the caller's tenant (every tenant's for the operator
    key); `ratio` is indexed / expected, 1.0 when nothing is expected."""
    return {"coverage": coverage_rows(tenant_scope(request))}


# Background reindexing after a model change (core.embeddings.reindex): progress, pause and resume.


class ReindexActIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    by: str | None = Field(default=None, max_length=200, description="who (default: operator)")


class ReindexProgress(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    state: str
    done: int
    remaining: int
    rate_per_s: float
    eta_seconds: float | None = None
    tenants: list[dict[str, Any]]


def _require_operator(request: Request) -> None:
    if tenant_scope(request) is not None:
        raise Forbidden("this needs the operator key")


def reindex_progress() -> dict[str, Any]:
    model = get_embedder(get_settings().embedding_model).name
    with system_session() as session:
        return progress(session, model=model)


def set_reindex_paused(body: Any, *, paused: bool, by: str | None = None) -> dict[str, Any]:
    parsed = parse_model(ReindexActIn, {} if body is None else body)
    model = get_embedder(get_settings().embedding_model).name
    with system_session() as session:
        set_paused(session, model=model, paused=paused, by=parsed.by or by)
    return reindex_progress()


@router.get("/reindex", **operation(summary="Reindexing progress", response=ReindexProgress, errors=(403,)))
def read_reindex(request: Request) -> dict[str, Any]:
    """The configured model's background reindex (operator key): `running`, `paused` or `idle`; memories
    embedded with it (`done`) and not yet (`remaining`) overall and per tenant, the rate of the last minute
    and an ETA."""
    _require_operator(request)
    return reindex_progress()


@router.post(
    "/reindex:pause",
    **operation(
        summary="Pause reindexing",
        body=ReindexActIn,
        body_required=False,
        example={"by": "ops@example.com"},
        response=ReindexProgress,
        errors=(403, 422),
    ),
)
def pause_reindex(request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    """Hold the reindex jobs of the configured model in the queue (operator key); running ones finish.
    Fresh saves and every other job go on."""
    _require_operator(request)
    return set_reindex_paused(body, paused=True)


@router.post(
    "/reindex:resume",
    **operation(
        summary="Resume reindexing",
        body=ReindexActIn,
        body_required=False,
        example={},
        response=ReindexProgress,
        errors=(403, 422),
    ),
)
def resume_reindex(request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    """Let the held reindex jobs go on where they were (operator key)."""
    _require_operator(request)
    return set_reindex_paused(body, paused=False)
