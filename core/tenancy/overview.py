"""The operator's list of tenants (`engram tenant list`): names with their live keys and memories."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.memories.models import Memory
from core.tenancy.models import ApiKey, Tenant


def tenant_overview(session: Session) -> list[dict[str, Any]]:
    """Every tenant, oldest first, with its unrevoked keys and its memories that are not forgotten."""
    keys = (
        select(ApiKey.tenant_id, func.count().label("n"))
        .where(ApiKey.revoked_at.is_(None))
        .group_by(ApiKey.tenant_id)
        .subquery()
    )
    memories = (
        select(Memory.tenant_id, func.count().label("n"))
        .where(Memory.status != "forgotten")
        .group_by(Memory.tenant_id)
        .subquery()
    )
    rows = session.execute(
        select(Tenant.name, Tenant.created_at, func.coalesce(keys.c.n, 0), func.coalesce(memories.c.n, 0))
        .outerjoin(keys, keys.c.tenant_id == Tenant.id)
        .outerjoin(memories, memories.c.tenant_id == Tenant.id)
        .order_by(Tenant.created_at, Tenant.id)
    ).all()
    return [
        {"name": name, "keys": int(n_keys), "memories": int(n_memories), "created_at": created.isoformat()}
        for name, created, n_keys, n_memories in rows
    ]
