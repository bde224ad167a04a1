"""Removing catalog entities, in the caller's transaction: catalog rows, their embeddings, tombstones for
the search index, and every memory reference to them (memories.md, "Cascade-on-delete").

A reference matches a removed entity exactly or as a strict dotted descendant, never as a character
prefix (``mydb.orders`` strips ``mydb.orders.amount`` but not ``mydb.orders_archive``); this is
:func:`core.entities.canonical.entity_matches_cascade`, written as SQL on the ``entities`` array so the
strip is one UPDATE. A memory left with no entities is kept. A query-bearing memory whose query names a
removed entity is marked stale (its query is left as it was, for the agent to re-save).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Text, bindparam, delete, func, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from core.entities.canonical import entity_matches_cascade, split_canonical
from core.entities.models import (
    CatalogAggregation,
    CatalogColumn,
    CatalogMeasure,
    CatalogModel,
    Datasource,
)
from core.entities.store import datasource_doc_ids, touch_catalog
from core.memories.models import Memory
from core.vectors import Embedding

LEAF_TABLES = {"column": CatalogColumn, "measure": CatalogMeasure, "aggregation": CatalogAggregation}
STALE_PREFIX = "attached query references removed entities: "
_WORD_RE = re.compile(r"\w+")


@dataclass
class Removal:
    """Canonical ids to remove, by kind: datasource, model, column, measure, aggregation."""

    ids: dict[str, list[str]] = field(default_factory=dict)

    def add(self, *, kind: str, canonical_id: str) -> None:
        self.ids.setdefault(kind, []).append(canonical_id)

    def all_ids(self) -> list[str]:
        return [i for ids in self.ids.values() for i in ids]


@dataclass
class CascadeResult:
    removed_docs: int = 0
    memories_updated: int = 0
    memories_marked_stale: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def escape_like(value: str) -> str:
    """Make ``value`` literal inside a LIKE pattern (``_`` is common in names and would match any char)."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def query_mentions(query: Mapping[str, Any] | None, entity: str) -> bool:
    """Whether an attached query names ``entity`` (its last segment appears as a word in the query).

    The memory's entity list mixes linked entities and the query's; this keeps a removed entity that
    the query never used from marking the query stale.
    """
    if not query:
        return False
    words = set(_WORD_RE.findall(json.dumps(query)))
    return entity.rsplit(".", 1)[-1] in words


def strip_memory_refs(session: Session, *, tenant_id: int, removed: Sequence[str], change_seq: int) -> CascadeResult:
    """Strip references to ``removed`` (and their descendants) from every memory, in one UPDATE."""
    result = CascadeResult()
    if not removed:
        return result
    ids, patterns = list(removed), [escape_like(r) + ".%" for r in removed]

    def array_sql(template: str, suffix: str) -> Any:
        # `e` ranges over one memory's entities; the predicate is entity_matches_cascade in SQL.
        match = f"(e = ANY(:ids_{suffix}) OR e LIKE ANY(:patterns_{suffix}))"
        return text(template.format(match=match)).bindparams(
            bindparam(f"ids_{suffix}", ids, type_=ARRAY(Text)),
            bindparam(f"patterns_{suffix}", patterns, type_=ARRAY(Text)),
        )

    def has_match(suffix: str) -> Any:
        return array_sql("EXISTS (SELECT 1 FROM unnest(memories.entities) AS e WHERE {match})", suffix)

    touched = select(Memory.id, Memory.entities, Memory.query, Memory.status).where(
        Memory.tenant_id == tenant_id, func.jsonb_typeof(Memory.query) == "object", has_match("q")
    )
    stale: dict[str, list[str]] = {}
    for memory_id, entities, query, status in session.execute(touched):
        gone = [e for e in entities if any(entity_matches_cascade(entry=e, canonical_id=r) for r in removed)]
        mentioned = [e for e in gone if query_mentions(query, e)]
        if mentioned and status == "active":
            stale[memory_id] = mentioned
    strip = (
        update(Memory)
        .where(Memory.tenant_id == tenant_id, has_match("w"))
        .values(
            entities=array_sql("array(SELECT e FROM unnest(memories.entities) AS e WHERE NOT {match})", "v"),
            change_seq=change_seq,
        )
        .execution_options(synchronize_session=False)
    )
    result.memories_updated = int(session.execute(strip).rowcount or 0)  # type: ignore[attr-defined]
    for memory_id, entities in stale.items():
        mark_stale(session, memory_id=memory_id, vanished=entities, change_seq=change_seq)
    result.memories_marked_stale = len(stale)
    return result


def mark_stale(session: Session, *, memory_id: str, vanished: Iterable[str], change_seq: int) -> None:
    session.execute(
        update(Memory)
        .where(Memory.id == memory_id, Memory.status == "active")
        .values(
            status="stale",
            stale_reason=STALE_PREFIX + ", ".join(vanished) + "; re-save the memory to clean it",
            change_seq=change_seq,
        )
        .execution_options(synchronize_session=False)
    )


def remove_entities(session: Session, *, tenant_id: int, removal: Removal, change_seq: int) -> CascadeResult:
    """Delete catalog entities and everything beneath them, with all the consequences, in this transaction."""
    roots = removal.all_ids()
    if not roots:
        return CascadeResult()
    doc_ids = _doc_ids_under(session, removal=removal)
    for kind, ids in removal.ids.items():
        _delete_rows(session, kind=kind, ids=ids)
    patterns = [escape_like(r) + ".%" for r in roots]
    session.execute(
        delete(Embedding)
        .where(
            Embedding.canonical_id.in_(roots)
            | text("embeddings.canonical_id LIKE ANY(:embedding_patterns)").bindparams(
                bindparam("embedding_patterns", patterns, type_=ARRAY(Text))
            )
        )
        .execution_options(synchronize_session=False)
    )
    write_tombstones(session, tenant_id=tenant_id, doc_ids=doc_ids, change_seq=change_seq)
    result = strip_memory_refs(session, tenant_id=tenant_id, removed=roots, change_seq=change_seq)
    result.removed_docs = len(doc_ids)
    touch_catalog(session, tenant_id=tenant_id, change_seq=change_seq)
    return result


# Docs gone for good at a change seq, which derived indexes past it delete (parameters: tenant, refs = the doc
# ids, distinct, change_seq). For a catalog removal here and a memory's purge (core.memories.edits).
TOMBSTONES_SQL = """
    INSERT INTO tombstones (tenant_id, doc_id, change_seq)
    SELECT :tenant, ref, :change_seq FROM unnest(CAST(:refs AS text[])) AS ref
    ON CONFLICT (tenant_id, doc_id) DO UPDATE SET change_seq = excluded.change_seq"""
_TOMBSTONES = text(TOMBSTONES_SQL)


def write_tombstones(session: Session, *, tenant_id: int, doc_ids: Iterable[str], change_seq: int) -> None:
    refs = list(dict.fromkeys(doc_ids))
    if refs:
        session.execute(_TOMBSTONES, {"tenant": tenant_id, "refs": refs, "change_seq": change_seq})


def _doc_ids_under(session: Session, *, removal: Removal) -> list[str]:
    doc_ids: list[str] = []
    for kind, ids in removal.ids.items():
        for canonical_id in ids:
            ds, model, _leaf = split_canonical(canonical_id)
            if kind == "datasource":
                doc_ids += datasource_doc_ids(session, datasource=ds)
            elif kind == "model":
                assert model is not None
                doc_ids += datasource_doc_ids(session, datasource=ds, models=[model])
            else:
                doc_ids.append(canonical_id)
    return list(dict.fromkeys(doc_ids))


def _delete_rows(session: Session, *, kind: str, ids: list[str]) -> None:
    # Children go with their parent through the composite foreign keys (ON DELETE CASCADE).
    keys = [tuple(p for p in split_canonical(i) if p is not None) for i in ids]
    if kind == "datasource":
        stmt: Any = delete(Datasource).where(Datasource.name.in_([k[0] for k in keys]))
    elif kind == "model":
        stmt = delete(CatalogModel).where(tuple_(CatalogModel.datasource, CatalogModel.name).in_(keys))
    else:
        table: Any = LEAF_TABLES[kind]
        stmt = delete(table).where(tuple_(table.datasource, table.model, table.name).in_(keys))
    session.execute(stmt.execution_options(synchronize_session=False))
