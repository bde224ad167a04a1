"""Datasources (create, read, delete) and model inspection. Functions take the caller's session; the
caller owns the unit of work. Catalog writes bump the tenant's change_seq once and stamp what they touch."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Text, bindparam, cast, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from core.changes import bump_change_seq
from core.crypto import decrypt_url, encrypt_url, redact_url
from core.entities.cascade import CascadeResult, Removal, remove_entities
from core.entities.models import (
    CatalogAggregation,
    CatalogColumn,
    CatalogForeignKey,
    CatalogMeasure,
    CatalogModel,
    Datasource,
)
from core.entities.schemas import DatasourceIn
from core.entities.sources import check_reachable, parse_source_url
from core.entities.store import touch_catalog
from core.errors import Conflict, NotFound
from core.jobs.service import enqueue
from core.memories.models import Memory
from core.memories.views import memories_to_dicts
from core.memories.visibility import visible_clause
from core.tenancy.context import Caller
from core.tenancy.quotas import check_datasource_quota

MAX_LEARNINGS = 100


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def get_datasource(session: Session, *, name: str, lock: bool = False) -> Datasource:
    stmt = select(Datasource).where(Datasource.name == name)
    datasource = session.scalar(stmt.with_for_update() if lock else stmt)
    if datasource is None:
        raise NotFound(f"datasource {name!r} not found")
    return datasource


def get_model(session: Session, *, datasource: str, name: str, lock: bool = False) -> CatalogModel:
    stmt = select(CatalogModel).where(CatalogModel.datasource == datasource, CatalogModel.name == name)
    model = session.scalar(stmt.with_for_update() if lock else stmt)
    if model is None:
        get_datasource(session, name=datasource)
        raise NotFound(f"model {datasource}.{name} not found")
    return model


def source_url(datasource: Datasource) -> str:
    """The decrypted URL, for connecting only: never return or log it."""
    return decrypt_url(datasource.url_encrypted)


def create_datasource(session: Session, *, tenant_id: int, body: DatasourceIn) -> Datasource:
    """Register a database; 409 when the name is taken, 422 when the URL does not connect."""
    url = parse_source_url(body.url)
    if session.scalar(select(Datasource.name).where(Datasource.name == body.name)) is not None:
        raise Conflict(f"datasource {body.name!r} already exists", field="name")
    check_reachable(url)
    check_datasource_quota(session, tenant_id=tenant_id)
    _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
    now = datetime.now(UTC)
    inserted = session.execute(
        pg_insert(Datasource)
        .values(
            tenant_id=tenant_id,
            name=body.name,
            description=body.description,
            dialect=url.get_backend_name(),
            url_encrypted=encrypt_url(url),
            url_redacted=redact_url(url),
            schema_name=body.schema_name,
            created_at=now,
            updated_at=now,
            change_seq=change_seq,
        )
        .on_conflict_do_nothing()
        .returning(Datasource.name)
    ).scalar()
    if inserted is None:  # a concurrent create won the race
        raise Conflict(f"datasource {body.name!r} already exists", field="name")
    touch_catalog(session, tenant_id=tenant_id, change_seq=change_seq)
    enqueue(session, tenant_id=tenant_id, kind="embed", payload={"doc_ids": [body.name]})
    return get_datasource(session, name=body.name)


def delete_datasource(session: Session, *, tenant_id: int, name: str) -> CascadeResult:
    get_datasource(session, name=name, lock=True)
    _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
    removal = Removal()
    removal.add(kind="datasource", canonical_id=name)
    return remove_entities(session, tenant_id=tenant_id, removal=removal, change_seq=change_seq)


def delete_model(session: Session, *, tenant_id: int, datasource: str, name: str) -> CascadeResult:
    get_model(session, datasource=datasource, name=name, lock=True)
    _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
    removal = Removal()
    removal.add(kind="model", canonical_id=f"{datasource}.{name}")
    return remove_entities(session, tenant_id=tenant_id, removal=removal, change_seq=change_seq)


def datasource_to_dict(datasource: Datasource, *, models: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": datasource.name,
        "url": datasource.url_redacted,
        "dialect": datasource.dialect,
        "description": datasource.description,
        "schema": datasource.schema_name,
        "created_at": _iso(datasource.created_at),
        "updated_at": _iso(datasource.updated_at),
        "last_ingested_at": _iso(datasource.last_ingested_at),
    }
    if models is not None:
        out["models"] = models
    return out


def list_datasources(session: Session) -> list[dict[str, Any]]:
    counts = dict(
        session.execute(select(CatalogModel.datasource, func.count()).group_by(CatalogModel.datasource)).all()
    )
    rows = session.scalars(select(Datasource).order_by(Datasource.name)).all()
    return [{**datasource_to_dict(d), "model_count": counts.get(d.name, 0)} for d in rows]


def read_datasource(session: Session, *, name: str) -> dict[str, Any]:
    datasource = get_datasource(session, name=name)
    models = session.scalars(
        select(CatalogModel.name).where(CatalogModel.datasource == name).order_by(CatalogModel.name)
    ).all()
    return datasource_to_dict(datasource, models=list(models))


def column_to_dict(column: CatalogColumn) -> dict[str, Any]:
    return {
        "name": column.name,
        "id": f"{column.datasource}.{column.model}.{column.name}",
        "type": column.data_type,
        "nullable": column.nullable,
        "primary_key": column.is_primary_key,
        "label": column.label,
        "description": column.description,
        "hidden": column.hidden,
        "origin": column.origin,
        "sql": column.sql,
        "sampled": column.sampled,
        "sampled_values": column.sampled_values,
        "distinct_count": column.distinct_count,
        "sampled_at": _iso(column.sampled_at),
    }


def inspect_model(session: Session, *, caller: Caller, datasource: str, name: str) -> dict[str, Any]:
    """A model with its columns (and samples), foreign keys, measures, aggregations and learnings."""
    model = get_model(session, datasource=datasource, name=name)
    key = (CatalogColumn.datasource == datasource, CatalogColumn.model == name)
    columns = session.scalars(
        select(CatalogColumn).where(*key).order_by(CatalogColumn.position, CatalogColumn.name)
    ).all()
    measures = session.scalars(
        select(CatalogMeasure)
        .where(CatalogMeasure.datasource == datasource, CatalogMeasure.model == name)
        .order_by(CatalogMeasure.name)
    ).all()
    aggregations = session.scalars(
        select(CatalogAggregation)
        .where(CatalogAggregation.datasource == datasource, CatalogAggregation.model == name)
        .order_by(CatalogAggregation.name)
    ).all()
    fks = session.scalars(
        select(CatalogForeignKey)
        .where(CatalogForeignKey.datasource == datasource, CatalogForeignKey.model == name)
        .order_by(CatalogForeignKey.column)
    ).all()
    model_id = f"{datasource}.{name}"
    entity_set = [model_id] + [f"{model_id}.{leaf.name}" for leaf in (*columns, *measures, *aggregations)]  # type: ignore[attr-defined]
    return {
        "id": model_id,
        "datasource": datasource,
        "name": name,
        "table": model.table_name,
        "label": model.label,
        "description": model.description,
        "hidden": model.hidden,
        "origin": model.origin,
        "columns": [column_to_dict(c) for c in columns],
        "foreign_keys": [
            {
                "column": f.column,
                "target": f"{f.target_datasource}.{f.target_model}",
                "target_column": f.target_column,
            }
            for f in fks
        ],
        "measures": [
            {
                "name": m.name,
                "id": f"{model_id}.{m.name}",
                "formula": m.formula,
                "label": m.label,
                "description": m.description,
            }
            for m in measures
        ],
        "aggregations": [
            {
                "name": a.name,
                "id": f"{model_id}.{a.name}",
                "formula": a.formula,
                "params": a.params,
                "description": a.description,
            }
            for a in aggregations
        ],
        "learnings": learnings(session, caller=caller, entity_set=entity_set),
    }


def query_absent() -> ColumnElement[bool]:
    """A memory without an attached query: SQL NULL, or the JSON null a save of ``query=None`` stores."""
    return func.coalesce(func.jsonb_typeof(Memory.query), "null") == "null"


def learnings(session: Session, *, caller: Caller, entity_set: list[str]) -> list[dict[str, Any]]:
    """Visible active query-less memories whose entities overlap ``entity_set`` (GIN-indexed ``&&``)."""
    overlap = Memory.entities.op("&&")(cast(bindparam("entity_set", entity_set, type_=ARRAY(Text)), ARRAY(Text)))
    rows = session.scalars(
        select(Memory)
        .where(overlap, query_absent(), Memory.status == "active", visible_clause(caller))
        .order_by(Memory.importance.desc(), Memory.created_at.desc())
        .limit(MAX_LEARNINGS)
    ).all()
    return memories_to_dicts(session, rows)
