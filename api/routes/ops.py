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
from core.embeddings.store import coverage
from core.tenancy.models import Tenant

router = APIRouter(prefix="/v1/ops", tags=["operations"], dependencies=[Depends(BEARER)])


def coverage_rows(tenant_id: int | None) -> list[dict[str, Any]]:
    model = get_embedder(get_settings().embedding_model).name
    rows: list[dict[str, Any]] = []
    with system_session() as session:
        tenants = session.execute(
            select(Tenant.id, Tenant.name).where(Tenant.id == tenant_id)
            if tenant_id
            else select(Tenant.id, Tenant.name)
        ).all()
    for tid, name in tenants:
        with system_session() as session:
            scope_to_tenant(session, tid)
            for row in coverage(session, configured_model=model):
                rows.append(
                    {
                        "tenant": name,
                        "doc_kind": row.doc_kind,
                        "model": row.model,
                        "indexed": row.indexed,
                        "expected": row.expected,
                        "ratio": row.ratio,
                    }
                )
    return rows


@router.get("/coverage", **operation(summary="Embedding coverage", response=CoverageReport))
def read_coverage(request: Request) -> dict[str, Any]:
    """One row per doc kind and embedding model of the caller's tenant (every tenant's for the operator
    key); `ratio` is indexed / expected, 1.0 when nothing is expected."""
    return {"coverage": coverage_rows(tenant_scope(request))}
