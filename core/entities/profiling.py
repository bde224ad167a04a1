"""Sample values: aggregate queries in the source database, never rows pulled into Python.

Rule: strings, enums and booleans are categorical; integers, decimals and floats are numeric; dates,
times and intervals are temporal; anything else (JSON, binary, UUID, untyped) is not profiled, nor are
computed columns added by hand (``sql``).

- categorical: ``GROUP BY col ORDER BY count DESC LIMIT 51`` gives the top-50 values (``sampled_values``);
  when a 51st value exists, one ``COUNT(DISTINCT ...)`` query per table gives the exact
  ``distinct_count``; ``sampled`` is the top-20 comma-joined, with ``... (N distinct)`` past 50 distinct;
- numeric and temporal: one ``MIN``/``MAX`` query per table for all of them; ``sampled`` is ``min .. max``.

Queries of one refresh run concurrently on a small connection pool; the catalog write at the end is one
short transaction that stamps only the columns whose samples changed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import func, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from core.changes import bump_change_seq
from core.crypto import scrub
from core.entities.models import CATEGORICAL, NUMERIC, TEMPORAL, CatalogColumn, CatalogModel
from core.entities.service import get_datasource, source_url
from core.entities.sources import source_engine
from core.jobs.service import enqueue

TOP_VALUES = 50
SAMPLED_TEXT_VALUES = 20
MAX_VALUE_CHARS = 500
PARALLEL_QUERIES = 4


@dataclass
class Profile:
    sampled: str | None
    sampled_values: list[Any] | None = None
    distinct_count: int | None = None


def _jsonable(value: Any, *, boolean: bool = False) -> Any:
    if isinstance(value, bool):
        return value
    if boolean and value in (0, 1):  # SQLite and MySQL store booleans as integers
        return bool(value)
    text = value if isinstance(value, str) else str(value)
    return text[:MAX_VALUE_CHARS]


def _display(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    return str(value)


def sampled_text(values: list[Any], *, distinct_count: int) -> str:
    text = ", ".join(str(v) for v in values[:SAMPLED_TEXT_VALUES])
    if distinct_count > TOP_VALUES:
        text += f", ... ({distinct_count} distinct)"
    return text


class _TableProfiler:
    def __init__(self, engine: Engine, *, schema: str | None, table: str, columns: list[CatalogColumn]):
        self.engine = engine
        self.table = sa.table(table, *(sa.column(c.name) for c in columns), schema=schema)
        self.columns = columns

    def top_values(self, name: str) -> list[tuple[Any, int]]:
        col = self.table.c[name]
        count = func.count().label("n")
        stmt = (
            select(col.label("v"), count)
            .where(col.is_not(None))
            .group_by(col)
            .order_by(count.desc(), col)
            .limit(TOP_VALUES + 1)
        )
        with self.engine.connect() as connection:
            return [(row[0], int(row[1])) for row in connection.execute(stmt)]

    def distinct_counts(self, names: list[str]) -> dict[str, int]:
        stmt = select(*(func.count(sa.distinct(self.table.c[n])) for n in names)).select_from(self.table)
        with self.engine.connect() as connection:
            row = connection.execute(stmt).one()
        return {n: int(v) for n, v in zip(names, row, strict=True)}

    def ranges(self, names: list[str]) -> dict[str, Profile]:
        parts = [agg(self.table.c[n]) for n in names for agg in (func.min, func.max)]
        with self.engine.connect() as connection:
            row = connection.execute(select(*parts).select_from(self.table)).one()
        out = {}
        for i, name in enumerate(names):
            low, high = row[2 * i], row[2 * i + 1]
            out[name] = Profile(sampled=None if low is None else f"{_display(low)} .. {_display(high)}")
        return out


def profile_columns(
    engine: Engine,
    *,
    schema: str | None,
    tables: dict[str, list[CatalogColumn]],
    parallel: int = PARALLEL_QUERIES,
) -> tuple[dict[tuple[str, str], Profile], list[str]]:
    """Profiles keyed by (table, column), and errors (a failing column is skipped, the rest goes on)."""
    profiles: dict[tuple[str, str], Profile] = {}
    errors: list[str] = []
    profilers = {t: _TableProfiler(engine, schema=schema, table=t, columns=cols) for t, cols in tables.items()}
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        tops = {
            (t, c.name): pool.submit(p.top_values, c.name)
            for t, p in profilers.items()
            for c in p.columns
            if c.type_family == CATEGORICAL
        }
        ranged = {
            t: pool.submit(p.ranges, names)
            for t, p in profilers.items()
            if (names := [c.name for c in p.columns if c.type_family in (NUMERIC, TEMPORAL)])
        }
        overflow: dict[str, list[str]] = {}
        kinds = {(t, c.name): c.data_type for t, p in profilers.items() for c in p.columns}
        for (table, name), future in tops.items():
            try:
                rows = future.result()
            except SQLAlchemyError as exc:
                errors.append(f"{table}.{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            boolean = "BOOL" in kinds[(table, name)].upper()
            values = [_jsonable(v, boolean=boolean) for v, _ in rows[:TOP_VALUES]]
            profiles[(table, name)] = Profile(sampled=None, sampled_values=values, distinct_count=len(rows))
            if len(rows) > TOP_VALUES:
                overflow.setdefault(table, []).append(name)
        counted = {t: pool.submit(profilers[t].distinct_counts, names) for t, names in overflow.items()}
        for table, count_future in counted.items():
            try:
                for name, n in count_future.result().items():
                    profiles[(table, name)].distinct_count = n
            except SQLAlchemyError as exc:
                errors.append(f"{table}: distinct count: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                for name in overflow[table]:
                    profiles.pop((table, name), None)
        for table, range_future in ranged.items():
            try:
                profiles.update({(table, n): p for n, p in range_future.result().items()})
            except SQLAlchemyError as exc:
                errors.append(f"{table}: min/max: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    for profile in profiles.values():
        if profile.sampled_values is not None:
            assert profile.distinct_count is not None
            profile.sampled = sampled_text(profile.sampled_values, distinct_count=profile.distinct_count)
    return profiles, errors


def refresh_samples(
    session: Session,
    *,
    tenant_id: int,
    datasource: str,
    models: list[str] | None = None,
    columns: list[str] | None = None,
    parallel: int = PARALLEL_QUERIES,
) -> dict[str, Any]:
    """Profile the table-backed models of a datasource (or some of them) and store what changed."""
    row = get_datasource(session, name=datasource)
    model_stmt = select(CatalogModel.name, CatalogModel.table_name).where(
        CatalogModel.datasource == datasource, CatalogModel.table_name.is_not(None)
    )
    if models is not None:
        model_stmt = model_stmt.where(CatalogModel.name.in_(models))
    table_of = dict(session.execute(model_stmt).all())
    col_stmt = select(CatalogColumn).where(
        CatalogColumn.datasource == datasource,
        CatalogColumn.model.in_(list(table_of)),
        CatalogColumn.sql.is_(None),
        CatalogColumn.type_family.in_([CATEGORICAL, NUMERIC, TEMPORAL]),
    )
    if columns is not None:
        col_stmt = col_stmt.where(CatalogColumn.name.in_(columns))
    to_profile = session.scalars(col_stmt).all()
    by_table: dict[str, list[CatalogColumn]] = {}
    for column in to_profile:
        by_table.setdefault(str(table_of[column.model]), []).append(column)
    url = make_url(source_url(row))
    # The engram transaction stays idle while the source works; it takes its locks only afterwards.
    with source_engine(url, pool_size=parallel) as engine:
        profiles, errors = profile_columns(engine, schema=row.schema_name, tables=by_table, parallel=parallel)
    _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
    now = datetime.now(UTC)
    changed = []
    for column in to_profile:
        profile = profiles.get((str(table_of[column.model]), column.name))
        if profile is None:
            continue
        new = (profile.sampled, profile.sampled_values, profile.distinct_count)
        if (column.sampled, column.sampled_values, column.distinct_count) != new:
            column.sampled, column.sampled_values, column.distinct_count = new
            column.change_seq = change_seq
            changed.append(f"{datasource}.{column.model}.{column.name}")
        column.sampled_at = now
    if changed:
        enqueue(session, tenant_id=tenant_id, kind="embed", payload={"doc_ids": changed})
    return {
        "profiled": len(profiles),
        "changed": len(changed),
        "errors": [scrub(e, url=url) for e in errors],
    }
