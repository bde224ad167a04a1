"""Turn ranked ids into response hits: one query for the memories, the one renderer for the text."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import Executable, any_, select
from sqlalchemy.orm import Session

from core import sql
from core.entities.canonical import CatalogSnapshot
from core.entities.render import render_memory
from core.entities.resolver import stale_references
from core.memories.models import Memory
from core.memories.visibility import visible_clause, visible_shape, visible_values
from core.search.catalog import Prefetch, entity_docs
from core.search.filters import EXAMPLE_QUERIES, tenant_param
from core.search.schemas import EntityHit, ExampleQueryHit, MemoryHit
from core.tenancy.context import Caller

# What a hit shows of a memory (and what its stale-query warning reads).
HIT_COLUMNS = (
    Memory.id,
    Memory.content,
    Memory.kind,
    Memory.category,
    Memory.importance,
    Memory.created_at,
    Memory.query,
    Memory.entities,
    Memory.query_entities,
)


def memories_query(*, tenant_id: int, memory_ids: Sequence[str]) -> sql.Query:
    """The hit columns of these memories of the tenant (:func:`memories_from_rows`), for :func:`core.sql.run_many`."""

    def build() -> Executable:
        return select(*HIT_COLUMNS).where(Memory.tenant_id == tenant_param(), Memory.id == any_(sql.text_array("ids")))

    return sql.Query("hits", build, {"tenant": tenant_id, "ids": list(memory_ids)}, generic=True)


def visible_memories_query(*, caller: Caller, memory_ids: Sequence[str]) -> sql.Query:
    """The hit columns of the memories among ``memory_ids`` that ``caller`` sees and that are not forgotten (a
    search's ``memory:<id>`` inputs), for :func:`core.sql.run_many`."""

    def build() -> Executable:
        return select(*HIT_COLUMNS).where(
            Memory.tenant_id == tenant_param(),
            Memory.id == any_(sql.text_array("ids")),
            Memory.status != "forgotten",
            visible_clause(caller, bound=True),
        )

    values = {"tenant": caller.tenant_id, "ids": list(memory_ids), **visible_values(caller)}
    return sql.Query(("visible-hits", visible_shape(caller)), build, values, generic=True)


class HitMemory(NamedTuple):
    """What a hit shows of a memory: the attributes of :class:`Memory` it reads, read-only."""

    id: str
    content: str
    kind: str
    category: str
    importance: float
    created_at: datetime
    query: dict[str, Any] | None
    entities: list[str]
    query_entities: list[str] | None


assert HitMemory._fields == tuple(column.key for column in HIT_COLUMNS)


def memories_from_rows(rows: Sequence[Any]) -> dict[str, Memory]:
    """The hit columns of each row, by id, readable as a :class:`Memory` (a plain tuple: building ORM objects
    cost more than the query, and these are never written)."""
    return {row[0]: cast(Memory, HitMemory._make(row)) for row in rows}


def _iso(value: datetime) -> str:
    return value.isoformat()


def memory_hits(
    *,
    ranked: Sequence[tuple[str, float]],
    memories: dict[str, Memory],
    bucket: str,
    matched: dict[str, list[str]],
) -> list[MemoryHit] | list[ExampleQueryHit]:
    """Hits in ranking order; ``matched`` gives each memory's matched input entities."""
    hits: list[Any] = []
    for memory_id, score in ranked:
        memory = memories.get(memory_id)
        if memory is None:
            continue
        fields: dict[str, Any] = {
            "id": memory.id,
            "score": score,
            "text": render_memory(memory),
            "matched_entities": matched.get(memory_id, []),
            "kind": memory.kind,
            "category": memory.category,
            "importance": memory.importance,
            "created_at": _iso(memory.created_at),
        }
        if bucket == EXAMPLE_QUERIES:
            hits.append(ExampleQueryHit(**fields, query=memory.query or {}))
        else:
            hits.append(MemoryHit(**fields))
    return hits  # type: ignore[return-value]


def entity_hits(
    session: Session,
    *,
    ranked: Sequence[tuple[str, float]],
    snapshot: CatalogSnapshot,
    tenant_id: int | None = None,
    version: int | None = None,
) -> list[EntityHit]:
    """Hits in ranking order; ``version`` is the snapshot's catalog version (enables background rendering)."""
    docs = entity_docs(
        session,
        snapshot=snapshot,
        doc_ids=[doc_id for doc_id, _ in ranked],
        prefetch=lambda: prefetch_mode(snapshot),
        tenant_id=tenant_id,
        version=version,
    )
    hits = []
    for doc_id, score in ranked:
        kind, text = docs.get(doc_id) or (snapshot.kind_of(doc_id) or "entity", doc_id)
        hits.append(EntityHit(id=doc_id, kind=kind, score=score, text=text))
    return hits


# A catalog this small is rendered whole on the first entity hit of its version (core.search.catalog);
# one up to BACKGROUND_MAX_DOCS is rendered whole by a background thread (searches render their own
# misses meanwhile); a larger one only ever has its hits rendered, per search.
PREFETCH_MAX_DOCS = 5000
BACKGROUND_MAX_DOCS = 50_000


def catalog_size(snapshot: CatalogSnapshot, *, cap: int) -> int:
    """Docs (datasources, models, columns, measures, aggregations), counted up to just past ``cap``."""
    size = 0
    for datasource in snapshot.datasources.values():
        size += 1
        for model in datasource.models.values():
            size += 1 + len(model.columns) + len(model.measures) + len(model.aggregations)
            if size > cap:
                return size
    return size


def is_small(snapshot: CatalogSnapshot) -> bool:
    """At most PREFETCH_MAX_DOCS docs."""
    return catalog_size(snapshot, cap=PREFETCH_MAX_DOCS) <= PREFETCH_MAX_DOCS


def prefetch_mode(snapshot: CatalogSnapshot) -> Prefetch:
    size = catalog_size(snapshot, cap=BACKGROUND_MAX_DOCS)
    if size <= PREFETCH_MAX_DOCS:
        return "now"
    return "background" if size <= BACKGROUND_MAX_DOCS else "never"


def stale_query_warning(memory: Memory, *, snapshot: CatalogSnapshot) -> str | None:
    """The warning for a query-bearing memory when something its attached query resolved to is gone.

    The query was resolved when it was saved (``query_entities``); it is not resolved again here, so a
    catalog change that keeps those entities (a second datasource with the same table names, which would
    make the bare names ambiguous today) does not make it stale. Memories saved before that was recorded
    fall back to their linked entities.
    """
    if not memory.query:
        return None
    resolved = memory.query_entities if memory.query_entities is not None else memory.entities
    stale = stale_references(snapshot, resolved or [])
    if not stale:
        return None
    return (
        f"example_query memory:{memory.id}: attached query has stale references ({'; '.join(stale)}); re-save to clean."
    )
