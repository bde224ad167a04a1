"""Reading the catalog: the resolver's snapshot (cached per tenant and catalog version), the change feed
for search, and rendered catalog docs for embeddings.

Memory saves (core.memories.links) and search (core.search.catalog) call :func:`load_snapshot` directly.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NamedTuple

from sqlalchemy import select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from core.entities import render
from core.entities.canonical import MEMORY_PREFIX, CatalogSnapshot, is_memory_ref, split_canonical
from core.entities.models import (
    CatalogAggregation,
    CatalogColumn,
    CatalogForeignKey,
    CatalogMeasure,
    CatalogModel,
    CatalogState,
    Datasource,
)
from core.memories.models import Tombstone

DocKind = str
CatalogChange = tuple[str, DocKind, str | None, bool, int]
"""(doc_id, doc_kind, text or None when deleted, hidden, change_seq)"""


class CatalogDoc(NamedTuple):
    doc_id: str
    doc_kind: DocKind
    text: str
    hidden: bool
    change_seq: int


# --- catalog version and the snapshot cache ---

_CACHE_TENANTS = 256
_cache: OrderedDict[int, tuple[int, CatalogSnapshot]] = OrderedDict()
_cache_lock = threading.Lock()


def catalog_version(session: Session) -> int:
    return int(session.scalar(select(CatalogState.version)) or 0)


def touch_catalog(session: Session, *, tenant_id: int, change_seq: int) -> None:
    """Move the tenant's catalog version (call once per catalog write, with its change_seq)."""
    stmt = pg_insert(CatalogState).values(tenant_id=tenant_id, version=change_seq)
    session.execute(stmt.on_conflict_do_update(index_elements=["tenant_id"], set_={"version": change_seq}))


def load_snapshot(session: Session, tenant_id: int) -> CatalogSnapshot:
    """The tenant's catalog for the resolver: one indexed query when the cached version is current.

    The version is read before the rows, so a concurrent write can only make the cached snapshot newer
    than its key (and reloaded next time), never older.
    """
    version = catalog_version(session)
    with _cache_lock:
        hit = _cache.get(tenant_id)
        if hit is not None and hit[0] == version:
            _cache.move_to_end(tenant_id)
            return hit[1]
    snapshot = _read_snapshot(session)
    with _cache_lock:
        _cache[tenant_id] = (version, snapshot)
        _cache.move_to_end(tenant_id)
        while len(_cache) > _CACHE_TENANTS:
            _cache.popitem(last=False)
    return snapshot


def _read_snapshot(session: Session) -> CatalogSnapshot:
    return CatalogSnapshot.from_rows(
        datasources=[(name, False) for name in session.scalars(select(Datasource.name)).all()],
        models=session.execute(select(CatalogModel.datasource, CatalogModel.name, CatalogModel.hidden)),
        columns=session.execute(
            select(CatalogColumn.datasource, CatalogColumn.model, CatalogColumn.name, CatalogColumn.hidden)
        ),
        measures=session.execute(select(CatalogMeasure.datasource, CatalogMeasure.model, CatalogMeasure.name)),
        aggregations=session.execute(
            select(CatalogAggregation.datasource, CatalogAggregation.model, CatalogAggregation.name)
        ),
        foreign_keys=session.execute(
            select(
                CatalogForeignKey.datasource,
                CatalogForeignKey.model,
                CatalogForeignKey.column,
                CatalogForeignKey.target_datasource,
                CatalogForeignKey.target_model,
            )
        ),
    )


# --- rendered docs ---


def _hidden_models(session: Session) -> set[tuple[str, str]]:
    rows = session.execute(select(CatalogModel.datasource, CatalogModel.name).where(CatalogModel.hidden.is_(True)))
    return set(rows)


def _docs(session: Session, *, where: dict[str, object]) -> list[CatalogDoc]:
    """Docs of every kind, each table filtered by ``where[kind]`` (a SQL predicate) when given."""
    hidden_models = _hidden_models(session)
    docs: list[CatalogDoc] = []
    if "datasource" in where:
        for ds in session.scalars(select(Datasource).where(where["datasource"])):  # type: ignore[arg-type]
            docs.append(CatalogDoc(ds.name, "datasource", render.render_datasource(ds), False, ds.change_seq))
    if "model" in where:
        for m in session.scalars(select(CatalogModel).where(where["model"])):  # type: ignore[arg-type]
            docs.append(CatalogDoc(f"{m.datasource}.{m.name}", "model", render.render_model(m), m.hidden, m.change_seq))
    leaves: tuple[tuple[str, Any, Any], ...] = (
        ("column", CatalogColumn, render.render_column),
        ("measure", CatalogMeasure, render.render_measure),
        ("aggregation", CatalogAggregation, render.render_aggregation),
    )
    for kind, table, renderer in leaves:
        if kind not in where:
            continue
        for leaf in session.scalars(select(table).where(where[kind])):  # type: ignore[arg-type]
            hidden = (leaf.datasource, leaf.model) in hidden_models or bool(getattr(leaf, "hidden", False))
            doc_id = f"{leaf.datasource}.{leaf.model}.{leaf.name}"
            docs.append(CatalogDoc(doc_id, kind, renderer(leaf), hidden, leaf.change_seq))  # type: ignore[arg-type]
    return _dedupe_leaves(docs)


def _dedupe_leaves(docs: list[CatalogDoc]) -> list[CatalogDoc]:
    """A column shadows a measure or aggregation of the same name (the resolver's precedence)."""
    seen: set[str] = set()
    out = []
    for doc in docs:
        if doc.doc_id not in seen:
            seen.add(doc.doc_id)
            out.append(doc)
    return out


def catalog_changes(session: Session, *, since: int) -> list[CatalogChange]:
    """Catalog docs written after ``since`` (text, hidden flag) and catalog docs deleted after it (text
    None), in change_seq order. Hidden docs are reported as hidden: search must never surface them."""
    where: dict[str, object] = {
        "datasource": Datasource.change_seq > since,
        "model": CatalogModel.change_seq > since,
        "column": CatalogColumn.change_seq > since,
        "measure": CatalogMeasure.change_seq > since,
        "aggregation": CatalogAggregation.change_seq > since,
    }
    # Every catalog doc belongs to a datasource (foreign keys): a tenant without one (memories only) has
    # nothing to render, and its catch-ups skip the six queries of the docs (deletions are tombstones).
    has_catalog = session.scalars(select(Datasource.name).limit(1)).first() is not None
    changes: list[CatalogChange] = [
        (d.doc_id, d.doc_kind, d.text, d.hidden, d.change_seq)
        for d in (_docs(session, where=where) if has_catalog else [])
    ]
    live = {c[0] for c in changes}
    tombstones = session.execute(
        select(Tombstone.doc_id, Tombstone.change_seq).where(
            Tombstone.change_seq > since, Tombstone.doc_id.not_like(MEMORY_PREFIX + "%")
        )
    )
    for doc_id, seq in tombstones:
        if doc_id not in live:
            changes.append((doc_id, _kind_of_deleted(doc_id), None, False, int(seq)))
    changes.sort(key=lambda c: c[4])
    return changes


def _kind_of_deleted(doc_id: str) -> str:
    """Tombstones keep no kind; a 3-part id is reported as a column (the index deletes by id anyway)."""
    return ("datasource", "model", "column")[min(doc_id.count("."), 2)]


def render_docs(session: Session, *, doc_ids: Iterable[str]) -> list[CatalogDoc]:
    """The current docs among ``doc_ids`` (catalog canonical ids), hidden ones included and flagged."""
    parts: dict[int, list[tuple[str, ...]]] = {1: [], 2: [], 3: []}
    for doc_id in doc_ids:
        if is_memory_ref(doc_id):
            continue
        try:
            split = tuple(p for p in split_canonical(doc_id) if p is not None)
        except ValueError:
            continue
        parts[len(split)].append(split)
    where: dict[str, object] = {}
    if parts[1]:
        where["datasource"] = Datasource.name.in_([p[0] for p in parts[1]])
    if parts[2]:
        where["model"] = tuple_(CatalogModel.datasource, CatalogModel.name).in_(parts[2])
    if parts[3]:
        for kind, table in (
            ("column", CatalogColumn),
            ("measure", CatalogMeasure),
            ("aggregation", CatalogAggregation),
        ):
            where[kind] = tuple_(table.datasource, table.model, table.name).in_(parts[3])
    return _docs(session, where=where) if where else []


def datasource_doc_ids(session: Session, *, datasource: str, models: list[str] | None = None) -> list[str]:
    """Every catalog doc id of a datasource (or of some of its models), for an embedding refresh."""
    ids = [datasource] if models is None else []
    model_filter = [CatalogModel.datasource == datasource]
    if models is not None:
        model_filter.append(CatalogModel.name.in_(models))
    ids += [f"{datasource}.{m}" for m in session.scalars(select(CatalogModel.name).where(*model_filter))]
    for table in (CatalogColumn, CatalogMeasure, CatalogAggregation):
        stmt = select(table.model, table.name).where(table.datasource == datasource)
        if models is not None:
            stmt = stmt.where(table.model.in_(models))
        ids += [f"{datasource}.{m}.{n}" for m, n in session.execute(stmt)]
    return list(dict.fromkeys(ids))
