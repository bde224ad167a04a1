"""The ingest benchmark: a generated 20-column table in SQLite and PostgreSQL, ingested and profiled by
the same functions the ``ingest`` and ``refresh_samples`` jobs call. Data generation runs inside each
source database (a recursive CTE, ``generate_series``) and is not timed."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import click
import sqlalchemy as sa

import core.schema  # noqa: F401 - every table known to the ORM
from api.serve.embedded import EmbeddedPostgres
from core.config import get_settings, reset_settings_cache
from core.db import dispose_engine, system_session, tenant_session
from core.entities.ingest import run_ingest
from core.entities.profiling import refresh_samples
from core.entities.schemas import DatasourceIn
from core.entities.service import create_datasource
from core.migrate import upgrade
from core.tenancy.service import create_tenant, get_tenant_by_name

# (name, type, SQL over the row number i): nine categorical columns of growing cardinality (two past
# the 50-value overflow), eleven numeric and temporal ones.
_COLUMNS: list[tuple[str, str, str, str]] = [
    ("id", "INTEGER PRIMARY KEY", "i", "i"),
    ("customer_id", "INTEGER", "i % 50000", "i % 50000"),
    ("region", "VARCHAR(20)", "'region-' || (i % 5)", "'region-' || (i % 5)"),
    ("status", "VARCHAR(20)", "'status-' || (i % 4)", "'status-' || (i % 4)"),
    ("channel", "VARCHAR(20)", "'channel-' || (i % 8)", "'channel-' || (i % 8)"),
    ("category", "VARCHAR(40)", "'category-' || (i % 30)", "'category-' || (i % 30)"),
    ("sku", "VARCHAR(40)", "'sku-' || (i % 1000)", "'sku-' || (i % 1000)"),
    ("code", "VARCHAR(40)", "'code-' || ((i * 7919) % 100000)", "'code-' || ((i::bigint * 7919) % 100000)"),
    ("country", "VARCHAR(40)", "'country-' || (i % 50)", "'country-' || (i % 50)"),
    ("is_active", "BOOLEAN", "i % 2", "i % 2 = 0"),
    ("is_returned", "BOOLEAN", "i % 9 = 0", "i % 9 = 0"),
    ("amount", "NUMERIC(12, 2)", "(i % 100000) / 100.0", "(i % 100000) / 100.0"),
    ("quantity", "INTEGER", "1 + i % 20", "1 + i % 20"),
    ("discount", "FLOAT", "(i % 30) / 100.0", "(i % 30) / 100.0"),
    ("tax", "FLOAT", "(i % 17) * 0.5", "(i % 17) * 0.5"),
    ("score", "INTEGER", "i % 1000", "i % 1000"),
    ("weight", "FLOAT", "(i % 5000) / 10.0", "(i % 5000) / 10.0"),
    (
        "created_at",
        "TIMESTAMP",
        "datetime(1704067200 + i * 30, 'unixepoch')",
        "timestamp '2024-01-01' + i * interval '30 seconds'",
    ),
    (
        "shipped_at",
        "TIMESTAMP",
        "datetime(1704067200 + i * 31, 'unixepoch')",
        "timestamp '2024-01-01' + i * interval '31 seconds'",
    ),
    ("birth_date", "DATE", "date(0 + (i % 20000) * 86400, 'unixepoch')", "date '1970-01-01' + (i % 20000)"),
]
TABLE = "bench_orders"


def _create(engine: sa.Engine, *, rows: int, schema: str | None, dialect: str) -> None:
    qualified = f"{schema}.{TABLE}" if schema else TABLE
    columns = ", ".join(f"{name} {kind}" for name, kind, _, _ in _COLUMNS)
    names = ", ".join(name for name, *_ in _COLUMNS)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {qualified} ({columns})"))
        if dialect == "sqlite":
            values = ", ".join(expr for _, _, expr, _ in _COLUMNS)
            conn.execute(
                sa.text(
                    f"WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < {int(rows)}) "
                    f"INSERT INTO {qualified} ({names}) SELECT {values} FROM seq"
                )
            )
        else:
            values = ", ".join(expr for _, _, _, expr in _COLUMNS)
            conn.execute(
                sa.text(f"INSERT INTO {qualified} ({names}) SELECT {values} FROM generate_series(1, {int(rows)}) i")
            )
            conn.execute(sa.text(f"ANALYZE {qualified}"))


@contextmanager
def _engram_database() -> Iterator[None]:
    """The configured engram database, else a throwaway embedded PostgreSQL."""

    if get_settings().database_url:
        yield
        return

    base = Path(tempfile.mkdtemp(prefix="engram-bench-", dir="/tmp"))
    base.chmod(0o755)
    pg = EmbeddedPostgres(data_dir=base / "pg")
    previous = os.environ.get("ENGRAM_DATABASE_URL")
    os.environ["ENGRAM_DATABASE_URL"] = pg.start()
    os.environ.setdefault("ENGRAM_SECRET_KEY", "engram-bench-secret")
    reset_settings_cache()
    try:
        yield
    finally:
        dispose_engine()
        pg.stop()
        if previous is None:
            os.environ.pop("ENGRAM_DATABASE_URL", None)
        reset_settings_cache()


def _time_ingest(*, tenant_id: int, name: str, url: str, schema: str | None) -> float:
    with tenant_session(tenant_id) as session:
        create_datasource(session, tenant_id=tenant_id, body=DatasourceIn(name=name, url=url, schema=schema))
    started = time.perf_counter()
    with tenant_session(tenant_id) as session:
        run_ingest(session, tenant_id=tenant_id, datasource=name, follow_up=False)
    with tenant_session(tenant_id) as session:
        result = refresh_samples(session, tenant_id=tenant_id, datasource=name)
    elapsed = time.perf_counter() - started
    if result["errors"] or result["profiled"] != len(_COLUMNS):
        raise RuntimeError(f"profiling incomplete: {result}")
    return elapsed


def run_ingest_bench(*, rows: int, pg_url: str, figure: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    figures = []
    with _engram_database():
        upgrade()
        tenant_name = f"bench-ingest-{uuid.uuid4().hex[:8]}"
        with system_session() as session:
            create_tenant(session, name=tenant_name)
            tenant = get_tenant_by_name(session, name=tenant_name)
            assert tenant is not None
            tenant_id = tenant.id
        with tempfile.TemporaryDirectory(prefix="engram-bench-src-") as directory:
            path = Path(directory) / "source.db"
            engine = sa.create_engine(f"sqlite:///{path}")
            _create(engine, rows=rows, schema=None, dialect="sqlite")
            engine.dispose()
            seconds = _time_ingest(tenant_id=tenant_id, name="bench_sqlite", url=f"sqlite:///{path}", schema=None)
            figures.append(figure("ingest", "seconds", seconds, "s", rows=rows, dialect="sqlite"))
        schema = f"engram_bench_{uuid.uuid4().hex[:8]}"
        admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
        except sa.exc.OperationalError as exc:
            click.echo(f"postgresql skipped: {pg_url} does not answer ({str(exc).splitlines()[0]})", err=True)
            admin.dispose()
            return figures
        try:
            _create(admin, rows=rows, schema=schema, dialect="postgresql")
            seconds = _time_ingest(tenant_id=tenant_id, name="bench_pg", url=pg_url, schema=schema)
            figures.append(figure("ingest", "seconds", seconds, "s", rows=rows, dialect="postgresql"))
        finally:
            with suppress(sa.exc.SQLAlchemyError), admin.connect() as conn:
                conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
            admin.dispose()
    return figures
