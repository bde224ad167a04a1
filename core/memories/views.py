"""The REST shape of memories (the API, the CLI, MCP and exports all show this one)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import CTE, BigInteger, ColumnElement, ScalarSelect, Select, bindparam, func, select
from sqlalchemy.dialects.postgresql import aggregate_order_by
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
        out[a.source_id].append(_association(a.target_id, a.relation_type, a.weight))
    return out


def links_column(tenant: ColumnElement[Any], source_id: Any) -> ScalarSelect[Any]:
    """The associations of the memory ``source_id`` as one JSON array of [target, relation, weight] (NULL for
    none), ordered by target and relation: what :func:`view_to_dict` takes beside a row of VIEW_COLUMNS."""
    link = func.json_build_array(Association.target_id, Association.relation_type, Association.weight)
    return (
        select(func.json_agg(aggregate_order_by(link, Association.target_id, Association.relation_type)))
        .where(Association.tenant_id == tenant, Association.source_id == source_id)
        .scalar_subquery()
    )


def answered_with_links(changed: CTE) -> Select[Any]:
    """The rows of ``changed`` (a write's CTE returning :data:`VIEW_COLUMNS`) with each memory's associations
    beside them, as :func:`view_to_dict` takes them (parameter: tenant)."""
    return select(*changed.c, links_column(bindparam("tenant", type_=BigInteger), changed.c.id))


def _association(target_id: str, relation_type: str, weight: float) -> dict[str, Any]:
    return {"target_id": target_id, "relation_type": relation_type, "weight": float(weight)}


# What the REST shape shows of a memory (memory_to_dict), for statements that read no ORM object.
VIEW_COLUMNS = (
    Memory.id,
    Memory.content,
    Memory.kind,
    Memory.category,
    Memory.importance,
    Memory.occurred_at,
    Memory.tags,
    Memory.source,
    Memory.run_id,
    Memory.persona,
    Memory.agent_id,
    Memory.entities,
    Memory.query,
    Memory.status,
    Memory.stale_reason,
    Memory.superseded_by,
    Memory.created_by,
    Memory.created_at,
    Memory.updated_at,
    Memory.access_count,
    Memory.last_accessed_at,
    Memory.forget_reason,
    Memory.forgotten_by,
    Memory.forgotten_at,
)


class MemoryView(NamedTuple):
    """The columns of :data:`VIEW_COLUMNS` of one row, readable as the :class:`Memory` memory_to_dict reads."""

    id: str
    content: str
    kind: str
    category: str
    importance: float
    occurred_at: datetime
    tags: list[str] | None
    source: str | None
    run_id: str | None
    persona: str | None
    agent_id: str | None
    entities: list[str] | None
    query: dict[str, Any] | None
    status: str
    stale_reason: str | None
    superseded_by: str | None
    created_by: str
    created_at: datetime
    updated_at: datetime
    access_count: int
    last_accessed_at: datetime | None
    forget_reason: str | None
    forgotten_by: str | None
    forgotten_at: datetime | None


assert MemoryView._fields == tuple(column.key for column in VIEW_COLUMNS)


def view_to_dict(row: Sequence[Any], links: Sequence[Sequence[Any]] | None) -> dict[str, Any]:
    """The REST shape of a row of :data:`VIEW_COLUMNS`, with its associations as (target, relation, weight)."""
    associations = [_association(t, r, w) for t, r, w in links or ()]
    return memory_to_dict(cast(Memory, MemoryView._make(row)), associations)


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
