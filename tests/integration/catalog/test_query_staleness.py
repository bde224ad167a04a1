"""A saved example query is resolved when saved: a later catalog change that keeps what it resolved to
does not make it stale; removing one of those entities does (search.md, stale-query warning)."""

from __future__ import annotations

import sqlite3

from tests.helpers.api import ids, save, search


def _datasource(client, tenant, name, db):  # type: ignore[no-untyped-def]
    response = client.post("/v1/datasources", json={"name": name, "url": f"sqlite:///{db}"}, headers=tenant.headers())
    assert response.status_code == 201, response.text
    body = {"columns": [{"name": "amount", "type": "INTEGER"}, {"name": "status", "type": "TEXT"}]}
    response = client.put(f"/v1/models/{name}/orders", json=body, headers=tenant.headers())
    assert response.status_code == 200, response.text


def test_second_datasource_with_the_same_tables_keeps_old_queries_fresh(client, tenant, tmp_path):
    db = tmp_path / "shop.db"
    sqlite3.connect(db).close()
    _datasource(client, tenant, "shop", db)
    query = {"source_model": "orders", "dimensions": ["status"], "measures": [{"formula": "amount:sum"}]}
    mid = save(client, tenant, {"content": "revenue by status", "linked_entities": query})
    memory = client.get(f"/v1/memories/{mid}", headers=tenant.headers()).json()
    assert set(memory["entities"]) == {"shop.orders", "shop.orders.status", "shop.orders.amount"}

    _datasource(client, tenant, "shop_eu", db)  # `orders` and `status` are now ambiguous as bare names
    out = search(client, tenant, {"entities": ["shop.orders"]})
    assert ids(out["example_queries"]) == [mid]
    assert not [w for w in out["warnings"] if "stale" in w or "ambiguous" in w], out["warnings"]
    named = search(client, tenant, {"entities": [f"memory:{mid}"]})
    assert not [w for w in named["warnings"] if "stale" in w], named["warnings"]

    # Removing what the query resolved to still warns.
    response = client.patch("/v1/models/shop/orders", json={"remove_columns": ["status"]}, headers=tenant.headers())
    assert response.status_code == 200, response.text
    out = search(client, tenant, {"entities": ["shop.orders"], "include_stale": True})
    (warning,) = [w for w in out["warnings"] if w.startswith(f"example_query memory:{mid}:")]
    assert "attached query has stale references" in warning and "shop.orders.status" in warning
