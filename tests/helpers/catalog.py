"""Shared pieces of the catalog tests: a source database built on any dialect, and inline job runs."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

PG_URL_ENV = "ENGRAM_TEST_SOURCE_PG_URL"
MYSQL_URL_ENV = "ENGRAM_TEST_SOURCE_MYSQL_URL"
STATUSES = ["paid"] * 3 + ["refunded"] * 2 + ["cancelled"]


def source_metadata(schema: str | None) -> sa.MetaData:
    md = sa.MetaData(schema=schema)
    regions = sa.Table("regions", md, sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", sa.String(50)))
    customers = sa.Table(
        "customers",
        md,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(100)),
        sa.Column("region_id", sa.Integer, sa.ForeignKey(regions.c.id)),
    )
    sa.Table(
        "orders",
        md,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("customer_id", sa.Integer, sa.ForeignKey(customers.c.id)),
        sa.Column("amount", sa.Numeric(10, 2)),
        sa.Column("status", sa.String(20)),
        sa.Column("code", sa.String(20)),
        sa.Column("is_returned", sa.Boolean),
        sa.Column("discount", sa.Integer),
        sa.Column("created_at", sa.DateTime),
    )
    sa.Table(
        "orders_archive",
        md,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("amount", sa.Numeric(10, 2)),
    )
    return md


def fill_source(engine: sa.Engine, *, schema: str | None) -> None:
    md = source_metadata(schema)
    md.create_all(engine)
    t = md.tables
    prefix = f"{schema}." if schema else ""
    start = datetime(2024, 1, 1)
    with engine.begin() as conn:
        conn.execute(t[prefix + "regions"].insert(), [{"id": i, "name": f"region-{i}"} for i in range(1, 4)])
        conn.execute(
            t[prefix + "customers"].insert(),
            [{"id": i, "name": f"customer-{i}", "region_id": 1 + i % 3} for i in range(1, 11)],
        )
        conn.execute(
            t[prefix + "orders"].insert(),
            [
                {
                    "id": i,
                    "customer_id": 1 + i % 10,
                    "amount": Decimal(i),
                    "status": STATUSES[i % 6],
                    "code": f"C{i % 60:02d}",
                    "is_returned": i % 4 == 0,
                    "discount": i % 7,
                    "created_at": start + timedelta(days=i),
                }
                for i in range(1, 121)
            ],
        )
        conn.execute(t[prefix + "orders_archive"].insert(), [{"id": 1, "amount": Decimal(5)}])


@contextmanager
def sqlite_source(directory: Any) -> Iterator[tuple[str, str | None]]:
    path = directory / f"source-{uuid.uuid4().hex[:8]}.db"
    url = f"sqlite:///{path}"
    engine = sa.create_engine(url)
    fill_source(engine, schema=None)
    engine.dispose()
    yield url, None


@contextmanager
def server_source(env: str) -> Iterator[tuple[str, str | None]]:
    """A fresh schema (PostgreSQL) or database (MariaDB) on the server named by ``env``, dropped after."""
    url = os.environ.get(env)
    if not url:
        pytest.skip(f"{env} is not set: no server source database to test against")
    schema = f"engram_test_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    ddl = "SCHEMA" if admin.dialect.name == "postgresql" else "DATABASE"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE {ddl} {schema}"))
    except sa.exc.OperationalError as exc:
        pytest.skip(f"{env} does not answer: {exc}")
    try:
        fill_source(admin, schema=schema)
        yield url, schema
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP {ddl} {schema}" + (" CASCADE" if ddl == "SCHEMA" else "")))
        admin.dispose()


@contextmanager
def source_for(dialect: str, directory: Any) -> Iterator[tuple[str, str | None]]:
    if dialect == "sqlite":
        with sqlite_source(directory) as source:
            yield source
    else:
        with server_source(PG_URL_ENV if dialect == "postgresql" else MYSQL_URL_ENV) as source:
            yield source


def run_queued_jobs(tenant_id: int, *, kinds: tuple[str, ...], timeout: float = 60.0) -> dict[str, Any]:
    """Run this tenant's queued jobs of ``kinds`` in-process until none is queued or running (jobs queue
    follow-ups; a session-scoped worker may have claimed some, which are then awaited)."""
    import time

    from core.db import system_session
    from core.jobs.models import Job
    from workers.runner import run_job

    results: dict[str, Any] = {}
    with system_session() as session:
        # Jobs that finished before this call are not its results.
        seen = set(
            session.scalars(sa.select(Job.id).where(Job.tenant_id == tenant_id, Job.state.in_(("succeeded", "failed"))))
        )
    deadline = time.monotonic() + timeout
    while True:
        with system_session() as session:
            jobs = session.execute(
                sa.select(Job.id, Job.state)
                .where(Job.tenant_id == tenant_id, Job.kind.in_(kinds), Job.id.not_in(seen))
                .order_by(Job.created_at)
            ).all()
        pending = [(job_id, state) for job_id, state in jobs if state in ("queued", "running")]
        finished = [job_id for job_id, state in jobs if state not in ("queued", "running")]
        for job_id in finished:
            with system_session() as session:
                job = session.get(Job, job_id)
                assert job is not None and job.state == "succeeded", (job.kind, job.error) if job else job_id
                results.setdefault(job.kind, []).append(job.result)
            seen.add(job_id)
        if not pending:
            return results
        assert time.monotonic() < deadline, f"jobs still pending: {pending}"
        queued = [job_id for job_id, state in pending if state == "queued"]
        for job_id in queued:
            run_job(job_id, session_factory=system_session, max_attempts=1)
        if not queued:
            time.sleep(0.05)


def create_and_ingest(client: Any, tenant: Any, *, url: str, schema: str | None, name: str = "shop") -> dict:
    body: dict[str, Any] = {"name": name, "url": url}
    if schema:
        body["schema"] = schema
    response = client.post("/v1/datasources", json=body, headers=tenant.headers())
    assert response.status_code == 201, response.text
    response = client.post(f"/v1/datasources/{name}/ingest", headers=tenant.headers())
    assert response.status_code == 202, response.text
    return run_queued_jobs(tenant.tenant_id, kinds=("ingest", "refresh_samples", "ingest_cleanup"))
