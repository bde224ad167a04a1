"""The REST shape of memories (the API, the CLI, MCP and exports all show this one)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.memories.models import Association, Memory


def associations_for(session: Session, memory_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {mid: [] for mid in memory_ids}
    if not memory_ids:
        return out
    rows = session.scalars(
        select(Association).where(Association.source_id.in_(list(memory_ids))).order_by(Association.target_id)
    ).all()
    for a in rows:
        out[a.source_id].append({"target_id": a.target_id, "relation_type": a.relation_type, "weight": a.weight})
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def memory_to_dict(memory: Memory, associations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The REST shape of a memory; a forgotten one (only admins read those) also says why, by whom, when."""
    out = {
        "id": memory.id,
        "content": memory.content,
        "kind": memory.kind,
        "category": memory.category,
        "importance": memory.importance,
        "occurred_at": _iso(memory.occurred_at),
        "tags": list(memory.tags or []),
        "source": memory.source,
        "run_id": memory.run_id,
        "persona": memory.persona,
        "agent_id": memory.agent_id,
        "entities": list(memory.entities or []),
        "query": memory.query,
        "associations": associations or [],
        "status": memory.status,
        "stale_reason": memory.stale_reason,
        "superseded_by": memory.superseded_by,
        "created_by": memory.created_by,
        "created_at": _iso(memory.created_at),
        "updated_at": _iso(memory.updated_at),
        "access_count": memory.access_count,
        "last_accessed_at": _iso(memory.last_accessed_at),
    }
    if memory.status == "forgotten":
        out.update(
            forget_reason=memory.forget_reason,
            forgotten_by=memory.forgotten_by,
            forgotten_at=_iso(memory.forgotten_at),
        )
    return out


def memories_to_dicts(session: Session, memories: Sequence[Memory]) -> list[dict[str, Any]]:
    links = associations_for(session, [m.id for m in memories])
    return [memory_to_dict(m, links[m.id]) for m in memories]
