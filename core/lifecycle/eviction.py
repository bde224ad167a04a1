"""The per-agent entry cap: when an agent holds more live memories than `agent_entry_cap`, the coldest
go first, non-`core` before `core` (a core entry goes only when no other entry of that agent remains).

Cold is the lowest *heat*, where

    heat = importance x (1 + ln(1 + access_count)) x 0.5 ^ (days since last use / importance_half_life_days)

and last use is the later of the last write and the last read. Importance already decays on schedule
(core.lifecycle.decay); the recency factor additionally favours what agents read or wrote lately, and reads
count logarithmically so a handful of hot entries cannot pin themselves forever. Ties go to the least
recently used, then the lowest id. Memories without an agent_id form one pool of their own.
Evicted memories are purged, like expired ones (see core.lifecycle.expiry).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, func, literal, select
from sqlalchemy.orm import Session

from core.lifecycle.expiry import LIVE
from core.lifecycle.removal import remove_memories
from core.memories.models import Memory


def heat_sql(*, now: datetime, half_life_days: float) -> ColumnElement[float]:
    last_use = func.greatest(Memory.updated_at, func.coalesce(Memory.last_accessed_at, Memory.updated_at))
    idle_days = func.extract("epoch", literal(now) - last_use) / 86400.0
    return (
        Memory.importance
        * (1 + func.ln(1 + Memory.access_count))
        * func.power(0.5, func.greatest(idle_days, 0) / half_life_days)
    )


def evict_over_cap(session: Session, *, tenant_id: int, cap: int, now: datetime, half_life_days: float) -> int:
    """Purge each over-cap agent's coldest memories until it holds `cap`; returns how many went."""
    live = [Memory.tenant_id == tenant_id, Memory.status.in_(LIVE)]
    over = (
        session.execute(select(Memory.agent_id).where(*live).group_by(Memory.agent_id).having(func.count() > cap))
        .scalars()
        .all()
    )
    total = 0
    for agent_id in over:
        last_use = func.greatest(Memory.updated_at, func.coalesce(Memory.last_accessed_at, Memory.updated_at))
        keep_order = func.row_number().over(
            order_by=(
                (Memory.category == "core").desc(),
                heat_sql(now=now, half_life_days=half_life_days).desc(),
                last_use.desc(),
                Memory.id.desc(),
            )
        )
        agent = Memory.agent_id.is_(None) if agent_id is None else Memory.agent_id == agent_id
        ranked = select(Memory.id, keep_order.label("rank")).where(*live, agent).subquery()
        ids = session.scalars(select(ranked.c.id).where(ranked.c.rank > cap)).all()
        total += remove_memories(
            session,
            tenant_id=tenant_id,
            memory_ids=ids,
            reason=f"evicted: agent entry cap of {cap} reached",
            purge=True,
        )
    return total
