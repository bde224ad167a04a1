"""The catalog over REST on the real stack (CONTRACT sections 3 and 5), against a SQLite source."""

from __future__ import annotations

import pytest

from tests.helpers.catalog import create_and_ingest, run_queued_jobs, sqlite_source


@pytest.fixture
def shop(client, tenant, tmp_path):  # type: ignore[no-untyped-def]
    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        yield tenant


def get_model(client, tenant, model):  # type: ignore[no-untyped-def]
    response = client.get(f"/v1/models/shop/{model}", headers=tenant.headers())
    assert response.status_code == 200, response.text
    return response.json()


def save(client, tenant, body, expect=201):  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json=body, headers=tenant.headers())
    assert response.status_code == expect, response.text
    return response.json()


def test_ingest_reflects_columns_types_and_keys(client, shop):
    """Ingest turns tables into models with typed columns, primary keys and foreign keys."""
    listing = client.get("/v1/datasources/shop", headers=shop.headers()).json()
    assert listing["models"] == ["customers", "orders", "orders_archive", "regions"]
    orders = get_model(client, shop, "orders")
    columns = {c["name"]: c for c in orders["columns"]}
    assert list(columns) == ["id", "customer_id", "amount", "status", "code", "is_returned", "discount", "created_at"]
    assert columns["id"]["primary_key"] and not columns["amount"]["primary_key"]
    assert columns["amount"]["type"].startswith("NUMERIC")
    assert orders["foreign_keys"] == [{"column": "customer_id", "target": "shop.customers", "target_column": "id"}]


def test_samples_top_values_distinct_count_and_ranges(client, shop):
    """Categorical columns get top values by frequency and the exact distinct count; numeric and
    temporal columns get min .. max."""
    columns = {c["name"]: c for c in get_model(client, shop, "orders")["columns"]}
    status = columns["status"]
    assert status["sampled_values"] == ["paid", "refunded", "cancelled"]
    assert status["distinct_count"] == 3 and status["sampled"] == "paid, refunded, cancelled"
    code = columns["code"]
    assert len(code["sampled_values"]) == 50 and code["distinct_count"] == 60
    assert code["sampled"].endswith(", ... (60 distinct)") and code["sampled"].count(",") == 20
    low, high = columns["amount"]["sampled"].split(" .. ")
    assert (float(low), float(high)) == (1, 120) and columns["amount"]["sampled_values"] is None
    assert columns["discount"]["sampled"] == "0 .. 6"
    low, high = columns["created_at"]["sampled"].split(" .. ")
    assert low.startswith("2024-01-02 00:00:00") and high.startswith("2024-04-30 00:00:00")
    assert sorted(columns["is_returned"]["sampled_values"]) == [False, True]


def test_datasource_validation_and_conflicts(client, tenant, tmp_path):
    """Names with '.' or odd characters are 422, a duplicate 409, a bad URL 422; never a 500."""
    with sqlite_source(tmp_path) as (url, _):
        for bad in ("my.db", "has space", "", "x" * 65, "é"):
            response = client.post("/v1/datasources", json={"name": bad, "url": url}, headers=tenant.headers())
            assert response.status_code == 422, response.text
            assert response.json()["error"]["field"] == "name"
        assert (
            client.post("/v1/datasources", json={"name": "ok", "url": url}, headers=tenant.headers()).status_code == 201
        )
        dup = client.post("/v1/datasources", json={"name": "ok", "url": url}, headers=tenant.headers())
        assert dup.status_code == 409
        for bad_url in ("not a url", "nosuchdriver://x/y", f"sqlite:///{tmp_path}/missing.db"):
            response = client.post("/v1/datasources", json={"name": "b", "url": bad_url}, headers=tenant.headers())
            assert response.status_code == 422 and response.json()["error"]["field"] == "url", response.text
        unreachable = "postgresql+psycopg://u:hunter2@127.0.0.1:1/db"
        response = client.post("/v1/datasources", json={"name": "c", "url": unreachable}, headers=tenant.headers())
        assert response.status_code == 422 and "hunter2" not in response.text
        assert client.get("/v1/datasources/nope", headers=tenant.headers()).status_code == 404
        assert client.post("/v1/datasources/nope/ingest", headers=tenant.headers()).status_code == 404


def test_credentials_are_never_returned(client, tenant):
    """A password in the URL is stored encrypted and every response shows the redacted URL."""
    import os

    url = os.environ.get("ENGRAM_TEST_SOURCE_PG_URL")
    if not url:
        pytest.skip("ENGRAM_TEST_SOURCE_PG_URL is not set (trust auth accepts any password)")
    from sqlalchemy.engine import make_url

    secret_url = make_url(url).set(password="s3cret-pw").render_as_string(hide_password=False)
    response = client.post("/v1/datasources", json={"name": "pg", "url": secret_url}, headers=tenant.headers())
    assert response.status_code == 201, response.text
    for path in ("/v1/datasources", "/v1/datasources/pg"):
        text = client.get(path, headers=tenant.headers()).text
        assert "s3cret-pw" not in text and "***" in text
    from core.db import tenant_session
    from core.entities.models import Datasource

    with tenant_session(tenant.tenant_id) as session:
        row = session.get(Datasource, ("pg", tenant.tenant_id))
        assert row is not None and "s3cret-pw" not in row.url_encrypted + row.url_redacted


def test_reads_need_a_key_and_writes_an_admin(client, shop, member_key):
    key = member_key()
    assert client.get("/v1/datasources").status_code == 401
    assert client.get("/v1/models/shop/orders", headers=shop.headers(key)).status_code == 200
    assert client.delete("/v1/datasources/shop", headers=shop.headers(key)).status_code == 403
    assert client.patch("/v1/models/shop/orders", json={}, headers=shop.headers(key)).status_code == 403


def test_resolver_uses_the_catalog(client, shop):
    """Saves resolve strictly against the tenant's catalog: suffixes stripped, ambiguity is 422 naming
    the candidates, multi-hop keeps the first model and the leaf, inline queries resolve leniently."""
    assert save(client, shop, {"content": "cents", "linked_entities": ["orders.amount:sum"]})["entities"] == [
        "shop.orders.amount"
    ]
    assert save(client, shop, {"content": "rows", "linked_entities": ["orders.*:count"]})["entities"] == ["shop.orders"]
    ambiguous = save(client, shop, {"content": "x", "linked_entities": ["name"]}, expect=422)
    assert (
        "shop.customers.name" in ambiguous["error"]["message"] and "shop.regions.name" in ambiguous["error"]["message"]
    )
    unknown = save(client, shop, {"content": "x", "linked_entities": ["orders.nope"]}, expect=422)
    assert unknown["error"]["field"] == "linked_entities.0"
    hops = save(client, shop, {"content": "hop", "linked_entities": ["orders.customers.regions.name"]})
    assert hops["entities"] == ["shop.orders", "shop.regions.name"]
    query = {
        "source_model": "orders",
        "measures": [{"formula": "amount:sum"}],
        "filters": ["nope_col = 1"],
        "dimensions": ["status", "ghost"],
    }
    lenient = save(client, shop, {"content": "paid revenue", "linked_entities": query})
    assert lenient["entities"][:3] == ["shop.orders", "shop.orders.status", "shop.orders.amount"]
    assert any("ghost" in w for w in lenient["warnings"])


def test_model_edits_measures_aggregations_and_learnings(client, shop):
    """PATCH edits descriptions, hides columns, adds measures and aggregations; inspect lists the
    query-less memories overlapping the model's entity set as learnings."""
    body = {
        "description": "One row per order",
        "columns": [{"name": "status", "description": "Order status"}, {"name": "code", "hidden": True}],
        "measures": [{"name": "aov", "formula": "amount:sum / *:count", "description": "average order value"}],
        "aggregations": [{"name": "p90", "formula": "percentile(amount, 0.9)", "params": {"q": 0.9}}],
    }
    response = client.patch("/v1/models/shop/orders", json=body, headers=shop.headers())
    assert response.status_code == 200, response.text
    model = response.json()
    assert model["description"] == "One row per order"
    columns = {c["name"]: c for c in model["columns"]}
    assert columns["status"]["description"] == "Order status" and columns["code"]["hidden"] is True
    assert model["measures"][0]["id"] == "shop.orders.aov" and model["aggregations"][0]["params"] == {"q": 0.9}
    assert save(client, shop, {"content": "aov excludes refunds", "linked_entities": ["aov"]})["entities"] == [
        "shop.orders.aov"
    ]
    save(client, shop, {"content": "example", "linked_entities": {"source_model": "orders", "dimensions": ["status"]}})
    save(client, shop, {"content": "archive note", "linked_entities": ["orders_archive.amount"]})
    learnings = [m["content"] for m in get_model(client, shop, "orders")["learnings"]]
    assert learnings == ["aov excludes refunds"]
    clash = client.patch(
        "/v1/models/shop/orders", json={"measures": [{"name": "status", "formula": "1"}]}, headers=shop.headers()
    )
    assert clash.status_code == 409
    bad = client.patch("/v1/models/shop/orders", json={"remove_columns": ["ghost"]}, headers=shop.headers())
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "remove_columns"
    assert client.patch("/v1/models/shop/nope", json={}, headers=shop.headers()).status_code == 404
    assert client.patch("/v1/models/shop/orders", json={"hidden": "x"}, headers=shop.headers()).status_code == 422


def test_put_creates_and_replaces_a_model(client, shop):
    body = {
        "description": "regions again",
        "table": "regions",
        "columns": [{"name": "name", "type": "VARCHAR"}],
        "measures": [{"name": "n", "formula": "*:count"}],
    }
    response = client.put("/v1/models/shop/areas", json=body, headers=shop.headers())
    assert response.status_code == 200, response.text
    assert response.json()["origin"] == "manual" and [c["name"] for c in response.json()["columns"]] == ["name"]
    run_queued_jobs(shop.tenant_id, kinds=("refresh_samples",))
    area = get_model(client, shop, "areas")
    assert area["columns"][0]["sampled_values"] == ["region-1", "region-2", "region-3"]
    replaced = client.put("/v1/models/shop/areas", json={"hidden": True}, headers=shop.headers()).json()
    assert replaced["hidden"] is True and replaced["measures"] == [] and replaced["description"] is None
    assert client.put("/v1/models/shop/bad.name", json={}, headers=shop.headers()).status_code in (404, 422)


def test_refresh_samples_on_demand(client, shop):
    response = client.post("/v1/datasources/shop/refresh-samples", json={"models": ["orders"]}, headers=shop.headers())
    assert response.status_code == 202 and "job_id" in response.json()
    results = run_queued_jobs(shop.tenant_id, kinds=("refresh_samples",))
    assert results["refresh_samples"][0]["profiled"] == 8 and results["refresh_samples"][0]["changed"] == 0
    missing = client.post("/v1/datasources/shop/refresh-samples", json={"models": ["nope"]}, headers=shop.headers())
    assert missing.status_code == 404


def test_inspect_learnings_follow_the_calls_agent(client, shop, member_key):
    """Learnings in inspect obey visibility: an agent-scoped learning shows only to calls naming that agent."""
    member = member_key("agent-owner@example.com")
    h = shop.headers(member)
    body = {"content": "agent A's note on amount", "linked_entities": ["shop.orders.amount"], "agent_id": "A"}
    assert client.post("/v1/memories", json=body, headers=h).status_code == 201
    as_a = client.get("/v1/models/shop/orders", params={"agent_id": "A"}, headers=h).json()["learnings"]
    as_b = client.get("/v1/models/shop/orders", params={"agent_id": "B"}, headers=h).json()["learnings"]
    assert [m["content"] for m in as_a] == ["agent A's note on amount"]
    assert as_b == []
