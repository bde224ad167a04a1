"""Ingest and profiling against real source databases: a SQLite file always, the machine's PostgreSQL
and MariaDB when ENGRAM_TEST_SOURCE_PG_URL / ENGRAM_TEST_SOURCE_MYSQL_URL name them."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.helpers.catalog import create_and_ingest, run_queued_jobs, source_for

DIALECTS = ["sqlite", "postgresql", "mysql"]


def columns_of(client, tenant, model):  # type: ignore[no-untyped-def]
    response = client.get(f"/v1/models/shop/{model}", headers=tenant.headers())
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_ingest_reflects_keys_types_and_samples(client, tenant, tmp_path, dialect):
    """PK/FK and types are reflected; categorical top values, exact distinct counts and min..max ranges
    come from aggregate queries in the source, whatever its dialect."""
    with source_for(dialect, tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        orders = columns_of(client, tenant, "orders")
        columns = {c["name"]: c for c in orders["columns"]}
        assert columns["id"]["primary_key"] and not columns["status"]["primary_key"]
        assert "INT" in columns["id"]["type"].upper() and "CHAR" in columns["status"]["type"].upper()
        assert orders["foreign_keys"] == [{"column": "customer_id", "target": "shop.customers", "target_column": "id"}]
        customers = columns_of(client, tenant, "customers")
        assert customers["foreign_keys"][0]["target"] == "shop.regions"
        assert columns["status"]["sampled_values"] == ["paid", "refunded", "cancelled"]
        assert columns["code"]["distinct_count"] == 60 and len(columns["code"]["sampled_values"]) == 50
        assert columns["code"]["sampled"].endswith("... (60 distinct)")
        low, high = columns["amount"]["sampled"].split(" .. ")
        assert (float(low), float(high)) == (1, 120)
        assert columns["created_at"]["sampled"].startswith("2024-01-02")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_reingest_is_idempotent_and_follows_the_source(client, tenant, tmp_path, dialect):
    """A second ingest changes nothing; after the source drops a column and a table, the next ingest
    removes them (and their memory references), keeping hand-made edits."""
    with source_for(dialect, tmp_path) as (url, schema):
        first = create_and_ingest(client, tenant, url=url, schema=schema)["ingest"][0]
        assert first["models_added"] == 4 and first["columns_added"] == 15
        client.patch("/v1/models/shop/orders", json={"description": "kept"}, headers=tenant.headers())
        before = columns_of(client, tenant, "orders")
        client.post("/v1/datasources/shop/ingest", headers=tenant.headers())
        again = run_queued_jobs(tenant.tenant_id, kinds=("ingest",))["ingest"][0]
        assert {
            k: again[k]
            for k in ("models_added", "models_removed", "columns_added", "columns_updated", "columns_removed")
        } == dict.fromkeys(("models_added", "models_removed", "columns_added", "columns_updated", "columns_removed"), 0)
        assert columns_of(client, tenant, "orders")["columns"] == before["columns"]
        engine = sa.create_engine(url)
        prefix = f"{schema}." if schema else ""
        with engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {prefix}orders DROP COLUMN discount"))
            conn.execute(sa.text(f"DROP TABLE {prefix}orders_archive"))
        engine.dispose()
        client.post("/v1/datasources/shop/ingest", headers=tenant.headers())
        third = run_queued_jobs(tenant.tenant_id, kinds=("ingest",))["ingest"][0]
        assert third["models_removed"] == 1 and third["columns_removed"] == 1
        orders = columns_of(client, tenant, "orders")
        assert "discount" not in [c["name"] for c in orders["columns"]] and orders["description"] == "kept"
        assert client.get("/v1/models/shop/orders_archive", headers=tenant.headers()).status_code == 404
