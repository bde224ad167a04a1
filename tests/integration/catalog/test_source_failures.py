"""A source that cannot be reached fails its ingest and changes nothing (CONTRACT: "An unreachable source
... fails the job and changes nothing: no file is created, models and memory links stay"). Only a
reachable source that really lost a table loses its model."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests.helpers.catalog import PG_URL_ENV, create_and_ingest, fill_source, run_queued_jobs, sqlite_source


def _save_linked(client, tenant) -> str:  # type: ignore[no-untyped-def]
    body = {"content": "refunds are orders with status refunded", "linked_entities": ["shop.orders.status"]}
    response = client.post("/v1/memories", json=body, headers=tenant.headers())
    assert response.status_code == 201, response.text
    return str(response.json()["memory_id"])


def _catalog(client, tenant, memory_id: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    models = client.get("/v1/datasources/shop", headers=tenant.headers()).json()["models"]
    memory = client.get(f"/v1/memories/{memory_id}", headers=tenant.headers()).json()
    return {"models": sorted(models), "entities": memory["entities"]}


def _ingest_once(client, tenant) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Queue an ingest and run it once (one attempt, as the last of its retries would)."""
    from core.db import system_session
    from workers.runner import run_job

    response = client.post("/v1/datasources/shop/ingest", headers=tenant.headers())
    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    outcome = run_job(job_id, session_factory=system_session, max_attempts=1)
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers()).json()
    assert outcome.state == job["state"]
    return dict(job)


def test_a_removed_sqlite_file_fails_the_ingest_and_keeps_the_catalog(client, tenant, tmp_path):
    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        memory_id = _save_linked(client, tenant)
        before = _catalog(client, tenant, memory_id)
        assert before["models"] == ["customers", "orders", "orders_archive", "regions"]
        assert before["entities"] == ["shop.orders.status"]
        path = make_url(url).database
        assert path is not None
        os.rename(path, f"{path}.moved")
        job = _ingest_once(client, tenant)
        assert job["state"] == "failed" and "no SQLite database file" in job["error"], job
        assert not os.path.exists(path), "the ingest created a file at the vanished path"
        assert _catalog(client, tenant, memory_id) == before
        # Back in place, the next ingest succeeds and changes nothing either.
        os.rename(f"{path}.moved", path)
        assert _ingest_once(client, tenant)["state"] == "succeeded"
        assert _catalog(client, tenant, memory_id) == before


def test_a_source_listing_no_tables_fails_but_a_lost_table_is_removed(client, tenant, tmp_path):
    """Zero tables where there were four is a broken source; one table fewer is a real change."""
    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        memory_id = _save_linked(client, tenant)
        before = _catalog(client, tenant, memory_id)
        path = make_url(url).database
        assert path is not None
        os.rename(path, f"{path}.full")
        sqlite3.connect(path).close()  # an empty SQLite database at the same path
        job = _ingest_once(client, tenant)
        assert job["state"] == "failed" and "lists no tables where 4 were ingested" in job["error"], job
        assert _catalog(client, tenant, memory_id) == before
        os.replace(f"{path}.full", path)
        with sqlite3.connect(path) as connection:
            connection.execute("DROP TABLE orders_archive")
        job = _ingest_once(client, tenant)
        assert job["state"] == "succeeded" and job["result"]["models_removed"] == 1, job
        assert _catalog(client, tenant, memory_id)["models"] == ["customers", "orders", "regions"]
        assert _catalog(client, tenant, memory_id)["entities"] == ["shop.orders.status"]


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A throwaway database on the machine's PostgreSQL (ENGRAM_TEST_SOURCE_PG_URL), dropped after."""
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.skip(f"{PG_URL_ENV} is not set")
    name = f"engram_src_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(sa.text(f"CREATE DATABASE {name}"))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        pytest.skip(f"{PG_URL_ENV} does not answer: {exc}")
    source_url = make_url(url).set(database=name).render_as_string(hide_password=False)
    engine = sa.create_engine(source_url)
    fill_source(engine, schema=None)
    engine.dispose()
    try:
        yield source_url
    finally:
        with admin.connect() as connection:
            connection.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def test_a_dropped_postgresql_database_fails_the_ingest_and_keeps_the_catalog(client, tenant, pg_database):
    create_and_ingest(client, tenant, url=pg_database, schema=None)
    memory_id = _save_linked(client, tenant)
    before = _catalog(client, tenant, memory_id)
    assert before["models"] == ["customers", "orders", "orders_archive", "regions"]
    admin = sa.create_engine(os.environ[PG_URL_ENV], isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f"DROP DATABASE {make_url(pg_database).database} WITH (FORCE)"))
    admin.dispose()
    job = _ingest_once(client, tenant)
    assert job["state"] == "failed" and "cannot reach the source" in job["error"], job
    assert "does not exist" not in job["error"]  # the driver's text stays in the server log
    assert _catalog(client, tenant, memory_id) == before
    refresh = client.post("/v1/datasources/shop/refresh-samples", headers=tenant.headers())
    assert refresh.status_code == 202
    with pytest.raises(AssertionError, match="cannot reach the source"):
        run_queued_jobs(tenant.tenant_id, kinds=("refresh_samples",))


def test_a_refused_source_fails_at_once_and_keeps_the_catalog(client, tenant, pg_database, monkeypatch):
    """A source registered in local mode, opened by a hosted worker: refused at connect time, for good."""
    from core.config import reset_settings_cache

    create_and_ingest(client, tenant, url=pg_database, schema=None)
    memory_id = _save_linked(client, tenant)
    before = _catalog(client, tenant, memory_id)
    monkeypatch.setenv("ENGRAM_DATASOURCE_POLICY", "hosted")
    reset_settings_cache()
    try:
        job = _ingest_once(client, tenant)
    finally:
        monkeypatch.undo()  # back to the suite's local mode
        reset_settings_cache()
    assert job["state"] == "failed" and "not allowed on this server" in job["error"], job
    assert _catalog(client, tenant, memory_id) == before


@pytest.fixture
def own_postgres() -> Iterator[Any]:
    """A PostgreSQL server of the test's own (embedded, throwaway), to stop and to change passwords on."""
    import shutil
    import tempfile
    from pathlib import Path

    from api.serve.embedded import EmbeddedPostgres

    base = Path(tempfile.mkdtemp(prefix="engram-source-pg-", dir="/tmp"))
    base.chmod(0o755)
    server = EmbeddedPostgres(data_dir=base / "pg", durable=False)
    try:
        admin_url = make_url(server.start())
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(sa.text("CREATE DATABASE shop"))
        admin.dispose()
        source = sa.create_engine(admin_url.set(database="shop"))
        fill_source(source, schema=None)
        source.dispose()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_a_changed_password_and_a_stopped_server_fail_the_ingest_and_keep_the_catalog(client, tenant, own_postgres):
    source_url = make_url(own_postgres.url).set(database="shop")
    create_and_ingest(client, tenant, url=source_url.render_as_string(hide_password=False), schema=None)
    memory_id = _save_linked(client, tenant)
    before = _catalog(client, tenant, memory_id)
    assert before["models"] == ["customers", "orders", "orders_archive", "regions"]
    admin = sa.create_engine(source_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text("ALTER ROLE postgres PASSWORD 'changed-elsewhere'"))
    admin.dispose()
    failures = [_ingest_once(client, tenant)]
    own_postgres.stop()
    failures.append(_ingest_once(client, tenant))
    for job in failures:
        assert job["state"] == "failed" and "cannot reach the source" in job["error"], job
    # Bad credentials and a stopped server read the same to the tenant; the catalog is untouched.
    assert failures[0]["error"] == failures[1]["error"]
    assert _catalog(client, tenant, memory_id) == before
