"""Ingest: reflect a source database's tables, columns, types, primary and foreign keys into the catalog.

Idempotent: a re-ingest updates what changed, adds what is new and removes reflected tables and columns
that vanished (through the cascade, so memory references go too), in one transaction. A source that
cannot be reached, or that lists no table at all where it had some, fails the ingest and changes nothing. Models and
columns defined by hand (``origin = "manual"``) are never removed by an ingest. Follow-up jobs (sample
refresh, reference cleanup, embedding refresh) are queued in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy import delete, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session

from core.changes import bump_change_seq
from core.entities.cascade import Removal, remove_entities
from core.entities.models import (
    CATEGORICAL,
    NUMERIC,
    OTHER,
    TEMPORAL,
    CatalogColumn,
    CatalogForeignKey,
    CatalogModel,
    Datasource,
)
from core.entities.service import get_datasource, source_url
from core.entities.sources import SourceError, source_engine
from core.entities.store import datasource_doc_ids, touch_catalog
from core.jobs.service import enqueue

_COLUMN_FIELDS = ("data_type", "type_family", "nullable", "is_primary_key", "position", "origin")


@dataclass
class ReflectedTable:
    name: str
    columns: list[dict[str, Any]] = field(default_factory=list)  # CatalogColumn field values
    foreign_keys: list[tuple[str, str, str]] = field(default_factory=list)  # (column, table, column)


def type_family(sa_type: Any) -> str:
    """How a column is profiled: strings, enums and booleans are categorical."""
    if isinstance(sa_type, sa.String | sa.Boolean | sa.Enum):
        return CATEGORICAL
    if isinstance(sa_type, sa.Integer | sa.Numeric | sa.Float):
        return NUMERIC
    if isinstance(sa_type, sa.Date | sa.DateTime | sa.Time | sa.Interval):
        return TEMPORAL
    return OTHER


def _type_name(sa_type: Any, engine: Engine) -> str:
    try:
        return str(sa_type.compile(dialect=engine.dialect))[:200]
    except Exception:  # NullType and exotic types cannot always be compiled; the class name still informs
        return type(sa_type).__name__.upper()[:200]


def reflect(engine: Engine, *, schema: str | None) -> tuple[list[ReflectedTable], list[str]]:
    """Tables of ``schema`` with their columns and keys, and warnings for what cannot be cataloged."""
    inspector = sa.inspect(engine)
    warnings: list[str] = []
    names = []
    for name in inspector.get_table_names(schema=schema):
        if "." in name or not name:
            warnings.append(f"table {name!r} skipped: a model name cannot contain '.'")
        else:
            names.append(name)
    if not names:
        return [], warnings
    columns = inspector.get_multi_columns(schema=schema, filter_names=names)
    pks = inspector.get_multi_pk_constraint(schema=schema, filter_names=names)
    fks = inspector.get_multi_foreign_keys(schema=schema, filter_names=names)
    tables = []
    for name in sorted(names):
        key = (schema, name)
        pk_columns = set((cast(dict[Any, Any], pks).get(key) or {}).get("constrained_columns") or [])
        table = ReflectedTable(name=name)
        for position, col in enumerate(columns.get(key, [])):
            if "." in col["name"]:
                warnings.append(f"column {name}.{col['name']} skipped: a column name cannot contain '.'")
                continue
            table.columns.append(
                {
                    "name": col["name"],
                    "data_type": _type_name(col["type"], engine),
                    "type_family": type_family(col["type"]),
                    "nullable": bool(col.get("nullable", True)),
                    "is_primary_key": col["name"] in pk_columns,
                    "position": position,
                    "origin": "reflected",
                }
            )
        for fk in fks.get(key, []):
            if fk.get("referred_schema") not in (None, schema) or fk["referred_table"] not in names:
                continue  # a target outside the ingested schema is not a model of this datasource
            for column, target in zip(fk["constrained_columns"], fk["referred_columns"], strict=False):
                table.foreign_keys.append((column, fk["referred_table"], target))
        tables.append(table)
    return tables, warnings


def apply_reflection(
    session: Session, *, tenant_id: int, datasource: Datasource, tables: list[ReflectedTable]
) -> dict[str, Any]:
    """Converge the catalog of ``datasource`` on ``tables``; returns counts of what changed."""
    ds = datasource.name
    _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
    summary = dict.fromkeys(
        ("models_added", "models_removed", "columns_added", "columns_updated", "columns_removed"), 0
    )
    models = {m.name: m for m in session.scalars(select(CatalogModel).where(CatalogModel.datasource == ds))}
    columns = {
        (c.model, c.name): c for c in session.scalars(select(CatalogColumn).where(CatalogColumn.datasource == ds))
    }
    removal = Removal()
    reflected = {t.name: t for t in tables}
    for name, existing in models.items():
        if existing.origin == "reflected" and name not in reflected:
            removal.add(kind="model", canonical_id=f"{ds}.{name}")
            summary["models_removed"] += 1
    for table in tables:
        model = models.get(table.name)
        if model is None:
            model = CatalogModel(
                tenant_id=tenant_id,
                datasource=ds,
                name=table.name,
                table_name=table.name,
                hidden=False,
                origin="reflected",
                change_seq=change_seq,
            )
            session.add(model)
            summary["models_added"] += 1
        elif (model.origin, model.table_name) != ("reflected", table.name):
            model.origin, model.table_name, model.change_seq = "reflected", table.name, change_seq
    # No ORM relationships order the inserts, so the models must exist before their columns.
    session.flush()
    for table in tables:
        seen = set()
        for spec in table.columns:
            seen.add(spec["name"])
            column = columns.get((table.name, spec["name"]))
            if column is None:
                session.add(
                    CatalogColumn(
                        tenant_id=tenant_id,
                        datasource=ds,
                        model=table.name,
                        hidden=False,
                        change_seq=change_seq,
                        **spec,
                    )
                )
                summary["columns_added"] += 1
            elif any(getattr(column, f) != spec[f] for f in _COLUMN_FIELDS):
                for f in _COLUMN_FIELDS:
                    setattr(column, f, spec[f])
                column.change_seq = change_seq
                summary["columns_updated"] += 1
        for (model_name, column_name), column in columns.items():
            if model_name == table.name and column.origin == "reflected" and column_name not in seen:
                removal.add(kind="column", canonical_id=f"{ds}.{model_name}.{column_name}")
                summary["columns_removed"] += 1
    session.flush()
    fks_changed = _replace_foreign_keys(session, tenant_id=tenant_id, datasource=ds, tables=tables)
    cascade = remove_entities(session, tenant_id=tenant_id, removal=removal, change_seq=change_seq)
    datasource.last_ingested_at = datetime.now(UTC)
    if any(summary.values()) or fks_changed:
        touch_catalog(session, tenant_id=tenant_id, change_seq=change_seq)
    return {**summary, "memories_updated": cascade.memories_updated, "change_seq": change_seq}


def _replace_foreign_keys(session: Session, *, tenant_id: int, datasource: str, tables: list[ReflectedTable]) -> bool:
    current = set(
        session.execute(
            select(
                CatalogForeignKey.model,
                CatalogForeignKey.column,
                CatalogForeignKey.target_model,
                CatalogForeignKey.target_column,
            ).where(CatalogForeignKey.datasource == datasource)
        )
    )
    wanted = {(t.name, col, target, target_col) for t in tables for col, target, target_col in t.foreign_keys}
    if current == wanted:
        return False
    session.execute(delete(CatalogForeignKey).where(CatalogForeignKey.datasource == datasource))
    rows = [
        {
            "tenant_id": tenant_id,
            "datasource": datasource,
            "model": m,
            "column": c,
            "target_datasource": datasource,
            "target_model": tm,
            "target_column": tc,
        }
        for m, c, tm, tc in sorted(wanted)
    ]
    if rows:
        session.execute(sa.insert(CatalogForeignKey).values(rows))
    return True


def _refuse_emptied_source(session: Session, *, datasource: str) -> None:
    """A source that lists no table where the catalog has reflected ones is taken for broken, not emptied.

    A database restored half-way, a dropped schema or a role that lost its grants all look like this, and
    converging on it would remove every model and strip every memory's links. A table that really went
    is removed by the next ingest that still sees the others; a source emptied on purpose is deleted.
    """
    reflected = session.scalar(
        select(sa.func.count())
        .select_from(CatalogModel)
        .where(CatalogModel.datasource == datasource, CatalogModel.origin == "reflected")
    )
    if reflected:
        raise SourceError(
            f"the source lists no tables where {reflected} were ingested before; the catalog is kept "
            "(delete the datasource if it was emptied on purpose)"
        )


def run_ingest(session: Session, *, tenant_id: int, datasource: str, follow_up: bool = True) -> dict[str, Any]:
    """Reflect the source and converge the catalog; with ``follow_up``, queue the jobs that come after."""
    row = get_datasource(session, name=datasource, lock=True)
    url = make_url(source_url(row))
    with source_engine(url, pool_size=1) as engine:
        tables, warnings = reflect(engine, schema=row.schema_name)
    if not tables:
        _refuse_emptied_source(session, datasource=datasource)
    result: dict[str, Any] = apply_reflection(session, tenant_id=tenant_id, datasource=row, tables=tables)
    result["models"] = len(tables)
    result["warnings"] = warnings
    if follow_up:
        jobs: dict[str, dict[str, Any]] = {
            "refresh_samples": {"datasource": datasource},
            "ingest_cleanup": {"datasource": datasource},
            "embed": {"doc_ids": datasource_doc_ids(session, datasource=datasource)},
        }
        result["follow_up_jobs"] = {
            kind: enqueue(session, tenant_id=tenant_id, kind=kind, payload=payload).id for kind, payload in jobs.items()
        }
    return result
