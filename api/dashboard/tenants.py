"""The operators' tenants page: every tenant's state, quotas, today's usage, job backlog and embedding
coverage, a page at a time (paged by name, searchable by name prefix: usable with 10,000 tenants), with
suspend / resume and quota edits. The page calls the JSON below with the dashboard's session cookie."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import FileResponse, Response
from sqlalchemy import text

from api.auth import forget_tenant_callers
from api.dashboard.routes import STATIC_DIR, is_operator_request, login_page, require_operator
from api.routes.tenants import page_limit
from api.threads import Route
from core.config import get_settings
from core.db import system_session
from core.embeddings.providers import get_embedder
from core.errors import Invalid
from core.tenancy import operations

router = APIRouter(prefix="/dashboard", route_class=Route)


@router.get("/tenants", include_in_schema=False)
def tenants_page(request: Request) -> Response:
    if not is_operator_request(request):
        return login_page()
    return FileResponse(STATIC_DIR / "tenants.html", media_type="text/html", headers={"Cache-Control": "no-store"})


def _backlog_and_coverage(session: Any, names: list[str]) -> dict[str, dict[str, Any]]:
    """Per tenant of the page: jobs queued and running, and the share of its memories with a vector of the
    configured model (by count: the exact, hash-checked figure is GET /v1/ops/coverage)."""
    if not names:
        return {}
    model = get_embedder(get_settings().embedding_model).name
    rows = session.execute(
        text(
            """
            SELECT t.name, t.memory_count,
                   (SELECT count(*) FROM jobs j WHERE j.tenant_id = t.id AND j.state = 'queued') AS queued,
                   (SELECT count(*) FROM jobs j WHERE j.tenant_id = t.id AND j.state = 'running') AS running,
                   (SELECT count(*) FROM embeddings e
                     WHERE e.tenant_id = t.id AND e.model = :model AND e.doc_kind = 'memory') AS vectors
            FROM tenants t WHERE t.name = ANY(:names)
            """
        ),
        {"names": names, "model": model},
    ).mappings()
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        memories = int(row["memory_count"])
        ratio = 1.0 if memories == 0 else min(1.0, int(row["vectors"]) / memories)
        found[row["name"]] = {
            "backlog": {"queued": int(row["queued"]), "running": int(row["running"])},
            "coverage": round(ratio, 4),
        }
    return found


@router.get("/api/tenants", include_in_schema=False)
def api_tenants(request: Request) -> dict[str, Any]:
    require_operator(request)
    params = request.query_params
    with system_session() as session:
        page, next_cursor = operations.list_tenants(
            session,
            limit=page_limit(params.get("limit")),
            cursor=params.get("cursor") or None,
            state=params.get("state") or None,
            prefix=params.get("q") or None,
        )
        extra = _backlog_and_coverage(session, [t["tenant"] for t in page])
        counts = operations.count_tenants(session)
    for tenant in page:
        tenant.update(extra.get(tenant["tenant"], {}))
    return {"tenants": page, "next_cursor": next_cursor, "counts": counts}


@router.patch("/api/tenants/{name}", include_in_schema=False)
def api_patch_tenant(name: str, request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    require_operator(request, changes_state=True)
    if not isinstance(body, dict) or not set(body) <= {"state", "quotas"}:
        raise Invalid('body must be {"state"?, "quotas"?}')
    with system_session() as session:
        tenant, _ = operations.update_tenant(session, name=name, state=body.get("state"), quotas=body.get("quotas"))
        tenant_id = tenant.id
    forget_tenant_callers(tenant_id)
    with system_session() as session:
        return operations.describe(session, name=name)
