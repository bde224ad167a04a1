"""The tenant's audit log (admin keys): who did what, newest first."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from api.auth import require_admin
from api.openapi import operation, query_from
from api.schemas import AuditPage
from api.threads import Route
from core.audit.service import list_entries
from core.db import tenant_session
from core.memories.schemas import Time, parse_model
from core.tenancy.context import Caller

router = APIRouter(prefix="/v1", tags=["audit"], route_class=Route)


class AuditFilters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=200, description="page size (at most 200)")
    cursor: str | None = Field(default=None, description="the `next_cursor` of the previous page")
    action: str | None = Field(
        default=None, max_length=60, description="an action (`memory.save`) or a family of them (`memory`)"
    )
    actor: str | None = Field(default=None, max_length=320, description="a user, key id or agent id")
    since: Time | None = Field(default=None, description="only entries at or after this time (ISO 8601)")


@router.get(
    "/audit",
    **operation(summary="Read the audit log", response=AuditPage, errors=(400, 403), query=query_from(AuditFilters)),
)
def read_audit(request: Request, caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """Every write and admin action of the tenant (and the operator's actions on it), newest first:
    `at`, `action`, `actor` (`user`, `key_id`, `agent_id`), `target` and `request_id`. Append-only: the
    service itself cannot change or remove an entry; entries older than the retention setting are pruned."""
    filters: AuditFilters = parse_model(AuditFilters, dict(request.query_params))
    with tenant_session(caller.tenant_id) as session:
        entries, next_cursor = list_entries(
            session,
            tenant_id=caller.tenant_id,
            limit=filters.limit,
            cursor=filters.cursor,
            action=filters.action,
            actor=filters.actor,
            since=filters.since,
        )
    return {"entries": entries, "next_cursor": next_cursor}
