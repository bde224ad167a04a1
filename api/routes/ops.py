"""Operations: embedding coverage per doc kind and model (the operator key sees every tenant)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from sqlalchemy import select

from api.openapi import BEARER, operation
from api.routes.jobs import tenant_scope
from api.schemas import CoverageReport
from core.config import get_settings
from core.db import scope_to_tenant, system_session
from core.embeddings.providers import get_embedder
from core.embeddings.store import CoverageRow, coverage
from core.tenancy.models import Tenant

router = APIRouter(prefix="/v1/ops", tags=["operations"], dependencies=[Depends(BEARER)])


def coverage_rows(tenant_id: int | None) -> list[dict[str, Any]]:
    """Coverage rows of one tenant, or of every tenant (the operator): memory counts for all of them in one
    read of the counters, the catalog rendered only for tenants that have one."""
    from core.embeddings.coverage import memory_counts
    from core.entities.models import Datasource

    model = get_embedder(get_settings().embedding_model).name
    rows: list[dict[str, Any]] = []
    with system_session() as session:
        tenants = session.execute(
            select(Tenant.id, Tenant.name).where(Tenant.id == tenant_id).order_by(Tenant.name)
            if tenant_id
            else select(Tenant.id, Tenant.name).order_by(Tenant.name)
        ).all()
        counts = memory_counts(session, model=model, tenant_ids=[tenant_id] if tenant_id else None)
        with_catalog = set(session.scalars(select(Datasource.tenant_id).distinct()).all())
    for tid, name in tenants:
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
            }
            for row in found
        )
    return rows


@router.get("/coverage", **operation(summary="Embedding coverage", response=CoverageReport))
def read_coverage(request: Request) -> dict[str, Any]:
    """One row per doc kind and embedding model of the caller's tenant (every tenant's for the operator
    key); `ratio` is indexed / expected, 1.0 when nothing is expected."""
    return {"coverage": coverage_rows(tenant_scope(request))}
