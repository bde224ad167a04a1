"""Catalog deletions cascade (memories.md, "Cascade-on-delete") and the post-ingest cleanup."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.helpers.catalog import create_and_ingest, run_queued_jobs, sqlite_source


@pytest.fixture
def shop(client, tenant, tmp_path):  # type: ignore[no-untyped-def]
    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        yield tenant, url


def save(client, tenant, body):  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json=body, headers=tenant.headers())
    assert response.status_code == 201, response.text
    return response.json()["memory_id"]


def memory(client, tenant, memory_id):  # type: ignore[no-untyped-def]
    return client.get(f"/v1/memories/{memory_id}", headers=tenant.headers()).json()


def test_cascade_matches_dotted_descendants_never_character_prefixes(client, shop):
    """Deleting model `orders` strips shop.orders and shop.orders.* but never shop.orders_archive; a
    memory left with no entities is kept; embeddings go and tombstones are written, in one change."""
    from core.db import tenant_session
    from core.entities.store import catalog_changes
    from core.vectors import Embedding

    tenant, _ = shop
    run_queued_jobs(tenant.tenant_id, kinds=("embed",))
    both = save(client, tenant, {"content": "both", "linked_entities": ["orders.amount", "orders_archive.amount"]})
    only = save(client, tenant, {"content": "only orders", "linked_entities": ["shop.orders"]})
    with tenant_session(tenant.tenant_id) as session:
        before = {e for e in session.scalars(sa.select(Embedding.canonical_id))}
    assert {"shop.orders", "shop.orders.amount", "shop.orders_archive.amount"} <= before
    response = client.delete("/v1/models/shop/orders", headers=tenant.headers())
    assert response.status_code == 200 and response.json()["memories_updated"] == 2, response.text
    assert memory(client, tenant, both)["entities"] == ["shop.orders_archive.amount"]
    kept = memory(client, tenant, only)
    assert kept["entities"] == [] and kept["status"] == "active"
    with tenant_session(tenant.tenant_id) as session:
        after = {e for e in session.scalars(sa.select(Embedding.canonical_id))}
        changes = catalog_changes(session, since=0)
    assert not {e for e in after if e == "shop.orders" or e.startswith("shop.orders.")}
    assert "shop.orders_archive.amount" in after
    deleted = {c[0] for c in changes if c[2] is None}
    assert {"shop.orders", "shop.orders.amount", "shop.orders.status"} <= deleted
    assert "shop.orders_archive" not in deleted
    assert len({c[4] for c in changes if c[2] is None}) == 1  # one transaction, one change_seq


def test_deleting_a_datasource_cascades_to_everything_under_it(client, shop, make_tenant, tmp_path):
    tenant, _ = shop
    note = save(client, tenant, {"content": "note", "linked_entities": ["shop", "customers.name"]})
    response = client.delete("/v1/datasources/shop", headers=tenant.headers())
    assert response.status_code == 200 and response.json()["removed_docs"] == 20
    assert memory(client, tenant, note)["entities"] == []
    assert client.get("/v1/models/shop/customers", headers=tenant.headers()).status_code == 404
    assert client.delete("/v1/datasources/shop", headers=tenant.headers()).status_code == 404


def test_change_feed_reports_hidden_docs_as_hidden(client, shop):
    """Hiding a model restamps its whole subtree; the feed reports those docs hidden (search must skip them)."""
    from core.db import tenant_session
    from core.entities.store import catalog_changes

    tenant, _ = shop
    with tenant_session(tenant.tenant_id) as session:
        since = max(c[4] for c in catalog_changes(session, since=0))
    client.patch("/v1/models/shop/customers", json={"hidden": True}, headers=tenant.headers())
    client.patch(
        "/v1/models/shop/orders", json={"columns": [{"name": "code", "hidden": True}]}, headers=tenant.headers()
    )
    with tenant_session(tenant.tenant_id) as session:
        changes = {c[0]: c for c in catalog_changes(session, since=since)}
    assert set(changes) == {
        "shop.customers",
        "shop.customers.id",
        "shop.customers.name",
        "shop.customers.region_id",
        "shop.orders.code",
    }
    assert all(c[3] for c in changes.values()) and changes["shop.orders.code"][1] == "column"
    assert "Sample values" in changes["shop.orders.code"][2]


def test_ingest_cleanup_strips_dropped_column_refs_and_marks_stale_queries(client, shop):
    """After the source drops a column, cleanup strips the references and marks a query naming it stale."""
    tenant, url = shop
    learning = save(
        client, tenant, {"content": "discount is a percentage", "linked_entities": ["orders.discount", "orders.status"]}
    )
    example = save(
        client,
        tenant,
        {
            "content": "discounted revenue",
            "linked_entities": {"source_model": "orders", "measures": [{"formula": "discount:avg"}]},
        },
    )
    unrelated = save(
        client,
        tenant,
        {"content": "status query", "linked_entities": {"source_model": "orders", "dimensions": ["status"]}},
    )
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE orders DROP COLUMN discount"))
    engine.dispose()
    client.post("/v1/datasources/shop/ingest", headers=tenant.headers())
    run_queued_jobs(tenant.tenant_id, kinds=("ingest", "ingest_cleanup"))
    assert memory(client, tenant, learning)["entities"] == ["shop.orders.status"]
    stale = client.get(f"/v1/memories/{example}", headers=tenant.headers()).json()
    assert stale["status"] == "stale" and "shop.orders.discount" in stale["stale_reason"]
    assert stale["query"]["measures"] == [{"formula": "discount:avg"}]
    assert memory(client, tenant, unrelated)["status"] == "active"


def test_cleanup_strips_only_definitive_not_found(client, shop):
    """A probe that fails keeps the reference; a definitive 'not found' is stripped."""
    from core.db import tenant_session
    from core.entities.cleanup import cleanup_datasource_refs

    tenant, _ = shop
    mid = save(client, tenant, {"content": "x", "linked_entities": ["orders.amount", "orders.status", "regions.name"]})

    def probe(entity: str) -> bool:
        if entity == "shop.orders.status":
            raise ConnectionError("catalog unreachable")
        return entity != "shop.orders.amount"

    with tenant_session(tenant.tenant_id) as session:
        result = cleanup_datasource_refs(session, tenant_id=tenant.tenant_id, datasource="shop", probe=probe)
    assert result["memories_updated"] == 1
    assert memory(client, tenant, mid)["entities"] == ["shop.orders.status", "shop.regions.name"]
