"""The staleness watcher also notices definition changes of linked entities (CONTRACT section 4 lifecycle)."""

from __future__ import annotations

import pytest

from tests.helpers.api import save
from tests.helpers.catalog import create_and_ingest, sqlite_source
from tests.helpers.lifecycle import prune


@pytest.fixture
def shop(client, tenant, tmp_path):  # type: ignore[no-untyped-def]
    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        yield tenant


def test_changed_measure_formula_marks_linked_memories_stale(client, shop):
    """A memory about a measure is marked stale, with the old and new formula in its reason, when the measure's
    formula changes after the watcher recorded it; memories about other entities stay active."""
    h = shop.headers()
    body = {"measures": [{"name": "revenue", "formula": "amount:sum"}]}
    assert client.patch("/v1/models/shop/orders", json=body, headers=h).status_code == 200
    about = save(client, shop, {"content": "revenue excludes refunds", "linked_entities": ["shop.orders.revenue"]})
    other = save(client, shop, {"content": "status values", "linked_entities": ["shop.orders.status"]})
    assert prune(shop)["marked_stale"] == 0  # first sighting: definitions are recorded, nothing changed
    body = {"measures": [{"name": "revenue", "formula": "amount:sum - refunds:sum"}]}
    assert client.patch("/v1/models/shop/orders", json=body, headers=h).status_code == 200
    assert prune(shop)["marked_stale"] == 1
    stale = client.get("/v1/memories", params={"status": "stale"}, headers=h).json()["memories"]
    assert [m["id"] for m in stale] == [about]
    reason = stale[0]["stale_reason"]
    assert "shop.orders.revenue" in reason and "amount:sum - refunds:sum" in reason
    assert client.get(f"/v1/memories/{other}", headers=h).json()["status"] == "active"


def test_unchanged_definitions_mark_nothing(client, shop):
    save(client, shop, {"content": "amount is in cents", "linked_entities": ["shop.orders.amount"]})
    assert prune(shop)["marked_stale"] == 0
    save(client, shop, {"content": "another note"})  # moves change_seq so the watcher runs again
    assert prune(shop)["marked_stale"] == 0
