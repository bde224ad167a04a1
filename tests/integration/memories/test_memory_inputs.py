"""Memory inputs at their edges (CONTRACT sections 4 and 8): the entity filter of a listing, cursors, null
patches, integer ids of any length, event times, and bodies the database could not hold."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.helpers.api import assert_error, save
from tests.helpers.events import listening, sql_calls


def listed(client, tenant, **params):  # type: ignore[no-untyped-def]
    response = client.get("/v1/memories", params=params, headers=tenant.headers())
    assert response.status_code == 200, response.text
    return response.json()


def test_list_by_catalog_entity_takes_the_entity_and_its_dotted_descendants(client, catalog):  # noqa: F811
    column = save(client, catalog, {"content": "amount is in cents", "linked_entities": ["shop.orders.amount"]})
    model = save(client, catalog, {"content": "orders is the fact table", "linked_entities": ["shop.orders"]})
    sibling = save(client, catalog, {"content": "v2 orders", "linked_entities": ["shop_v2.orders"]})
    save(client, catalog, {"content": "no links"})
    assert {m["id"] for m in listed(client, catalog, entity="shop.orders")["memories"]} == {column, model}
    assert [m["id"] for m in listed(client, catalog, entity="shop.orders.amount")["memories"]] == [column]
    assert {m["id"] for m in listed(client, catalog, entity="shop")["memories"]} == {column, model}
    assert [m["id"] for m in listed(client, catalog, entity="shop_v2")["memories"]] == [sibling]
    assert listed(client, catalog, entity="shop.orders_")["memories"] == []  # LIKE wildcards are literal


def _cursor(values):  # type: ignore[no-untyped-def]
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("sort", "values"),
    [
        ("recent", [1, "x"]),
        ("recent", [True, "x"]),
        ("recent", [{"a": 1}, "x"]),
        ("recent", ["2024-01-01T00:00:00", "x"]),  # naive
        ("recent", ["2024-01-01T00:00:00+00:00", 5]),
        ("importance", ["0.5", "2024-01-01T00:00:00+00:00", "x"]),
        ("most_accessed", [1.5, "2024-01-01T00:00:00+00:00", "x"]),
        ("most_accessed", [2**40, "2024-01-01T00:00:00+00:00", "x"]),
    ],
)
def test_a_cursor_with_keys_of_the_wrong_type_is_400(client, tenant, sort, values):
    save(client, tenant, {"content": "one"})
    response = client.get("/v1/memories", params={"sort": sort, "cursor": _cursor(values)}, headers=tenant.headers())
    assert assert_error(response, 400)["field"] == "cursor"


def test_cursors_the_api_returns_still_page(client, tenant):
    for i in range(5):
        save(client, tenant, {"content": f"note {i}", "importance": i / 10})
    for sort in ("recent", "importance", "most_accessed"):
        page = listed(client, tenant, sort=sort, limit=2)
        seen = [m["id"] for m in page["memories"]]
        while page["next_cursor"]:
            page = listed(client, tenant, sort=sort, limit=2, cursor=page["next_cursor"])
            seen += [m["id"] for m in page["memories"]]
        assert sorted(seen) == sorted({*seen}) and len(seen) == 5


def test_patch_null_importance_and_occurred_at_fall_back_to_the_defaults(client, tenant):
    memory_id = save(
        client, tenant, {"content": "x", "kind": "decision", "importance": 0.1, "occurred_at": "2020-01-01T00:00:00Z"}
    )
    response = client.patch(
        f"/v1/memories/{memory_id}", json={"importance": None, "occurred_at": None}, headers=tenant.headers()
    )
    assert response.status_code == 200, response.text
    memory = client.get(f"/v1/memories/{memory_id}", headers=tenant.headers()).json()
    assert memory["importance"] == 0.8  # decision's default
    assert memory["occurred_at"] == memory["created_at"]


def test_generated_ids_never_land_on_a_supplied_id_of_any_length(client, tenant):
    huge = "1" + "0" * 40
    save(client, tenant, {"content": "supplied", "id": huge})
    nxt = save(client, tenant, {"content": "generated"})
    assert nxt == str(10**40 + 1)
    assert client.get(f"/v1/memories/{huge}", headers=tenant.headers()).json()["content"] == "supplied"
    batch = client.post(
        "/v1/memories:batch", json={"items": [{"content": "a"}, {"content": "b"}]}, headers=tenant.headers()
    ).json()["results"]
    assert [r["memory_id"] for r in batch] == [str(10**40 + 2), str(10**40 + 3)]


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_an_event_time_outside_years_1_to_9999_in_utc_is_422(client, tenant, when):
    response = client.post("/v1/memories", json={"content": "x", "occurred_at": when}, headers=tenant.headers())
    assert assert_error(response, 422)["field"] == "occurred_at"
    memory_id = save(client, tenant, {"content": "y"})
    response = client.patch(f"/v1/memories/{memory_id}", json={"occurred_at": when}, headers=tenant.headers())
    assert assert_error(response, 422)["field"] == "occurred_at"
    response = client.get("/v1/memories", params={"since": when}, headers=tenant.headers())
    assert assert_error(response, 422)["field"] == "since"
    assert [m["id"] for m in listed(client, tenant)["memories"]] == [memory_id]


def _deep(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"content": "x", "linked_entities": [f"memory:{i}" for i in range(1001)]}, "linked_entities"),
        ({"content": "x", "associations": [{"target_id": str(i)} for i in range(1001)]}, "associations"),
        ({"content": "x", "tags": [str(i) for i in range(1001)]}, "tags"),
        ({"content": "x", "source": "s" * 10_001}, "source"),
        ({"content": "x", "query": {"measures": _deep(40)}}, "query.measures"),
    ],
)
def test_oversized_lists_fields_and_nesting_are_422(client, tenant, body, field):
    error = assert_error(client.post("/v1/memories", json=body, headers=tenant.headers()), 422)
    assert error["field"].startswith(field)


def test_non_finite_numbers_are_422(client, tenant):
    headers = {**tenant.headers(), "Content-Type": "application/json"}
    response = client.post("/v1/memories", content=b'{"content": "x", "query": {"limit": NaN}}', headers=headers)
    assert assert_error(response, 422)["field"] == "query.limit"
    assert listed(client, tenant)["memories"] == []


def test_import_of_self_referencing_or_deep_front_matter_is_a_4xx(client, tenant):
    headers = {**tenant.headers(), "Content-Type": "text/markdown"}
    recursive = "---\nkey: a\nquery: &q {x: *q}\n---\nbody\n"
    assert_error(client.post("/v1/memories:import", content=recursive.encode(), headers=headers), 422)
    deep_yaml = "---\nkey: b\nquery: " + "[" * 2000 + "]" * 2000 + "\n---\nbody\n"
    assert_error(client.post("/v1/memories:import", content=deep_yaml.encode(), headers=headers), 422)
    deep_json = b'{"markdown": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    response = client.post(
        "/v1/memories:import", content=deep_json, headers={**tenant.headers(), "Content-Type": "application/json"}
    )
    assert_error(response, 400)
    assert listed(client, tenant)["memories"] == []


def test_search_time_bounds_mix_naive_and_aware_times(client, tenant):
    save(client, tenant, {"content": "deploy on new year", "occurred_at": "2024-01-01T00:00:00Z"})
    body = {"question": "deploy", "occurred_after": "2024-01-01T00:00:00", "occurred_before": "2024-01-01T00:00:00Z"}
    response = client.post("/v1/search", json=body, headers=tenant.headers())
    assert response.status_code == 200, response.text
    assert [m["text"] for m in response.json()["memories"]] == ["deploy on new year"]
    body["occurred_after"] = "0001-01-01T00:00:00+14:00"
    error = assert_error(client.post("/v1/search", json=body, headers=tenant.headers()), 422)
    assert error["field"] == "occurred_after"


def test_memory_refs_inside_a_search_query_are_looked_up_or_dropped(client, tenant):
    kept = save(client, tenant, {"content": "orders are counted weekly"})
    body = {"query": {"dimensions": ["memory:nope", f"memory:{kept}"]}}
    response = client.post("/v1/search", json=body, headers=tenant.headers())
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["resolved_input_entities"] == [f"memory:{kept}"]
    assert any("memory:nope" in w for w in result["warnings"])


def test_a_listing_page_is_one_statement_with_its_associations_whatever_the_filters(client, tenant):
    """Every filter at once, paged in every sort: the pages hold exactly the memories the filters keep, in the
    sort's order, each with its associations, and each page is one core.sql statement (no ORM query)."""
    from sqlalchemy.orm import Session

    kept = []
    for i in range(7):
        body = {"content": f"kept {i}", "kind": "fact", "tags": ["a", "b"], "run_id": "r1", "importance": i / 10}
        body |= {"occurred_at": f"2024-0{i + 1}-01T00:00:00Z"}
        if i == 3:
            body["associations"] = [{"target_id": kept[0], "relation_type": "updates", "weight": 0.5}]
        kept.append(save(client, tenant, body))
    save(client, tenant, {"content": "other kind", "kind": "decision", "tags": ["a"], "run_id": "r1"})
    save(client, tenant, {"content": "other run", "kind": "fact", "tags": ["a", "b"], "run_id": "r2"})
    save(client, tenant, {"content": "too late", "kind": "fact", "tags": ["a", "b"], "run_id": "r1",
                          "occurred_at": "2025-01-01T00:00:00Z"})  # fmt: skip
    filters = {"kind": "fact", "tags": "a,b", "run_id": "r1", "occurred_after": "2024-01-01T00:00:00Z"}
    filters |= {"occurred_before": "2024-12-31T00:00:00Z", "since": "2000-01-01T00:00:00Z"}
    orm: list[object] = []

    # (Only the tenant's sessions: threads other tests left behind may use the database meanwhile.)
    def through_the_orm(state: Any) -> None:
        if state.session.info.get("tenant_id") == tenant.tenant_id:
            orm.append(state)

    with sql_calls(tenant.tenant_id) as calls:
        with listening(Session, do_orm_execute=through_the_orm):
            for sort in ("recent", "importance", "most_accessed"):
                page = listed(client, tenant, sort=sort, limit=3, **filters)
                seen = list(page["memories"])
                while page["next_cursor"]:
                    page = listed(client, tenant, sort=sort, limit=3, cursor=page["next_cursor"], **filters)
                    seen += page["memories"]
                # Newest first, weightiest first, and (none read yet) newest first again.
                assert [m["id"] for m in seen] == kept[::-1], sort
                links = {m["id"]: m["associations"] for m in seen}
                assert links[kept[3]] == [{"target_id": kept[0], "relation_type": "updates", "weight": 0.5}]
                assert links[kept[1]] == []
    assert orm == [] and [len(keys) for keys in calls] == [1] * 9  # three pages a sort, one statement a page


def test_an_integer_past_64_bits_in_an_attached_query_reads_back_exactly_everywhere(client, tenant):
    """JSON has no bound on integers and neither has PostgreSQL's jsonb: a query saved with one (here in a
    key the inline query keeps as given) answers every read with the same integer, never a 500."""
    big, small = 123456789012345678901234567890, -(2**70)
    body = {
        "content": "orders by region",
        "linked_entities": {"source_model": "orders", "limit": big, "offset": small, "note": [big, 1.5]},
    }
    memory_id = save(client, tenant, body)
    got = client.get(f"/v1/memories/{memory_id}", headers=tenant.headers())
    assert got.status_code == 200, got.text
    stored = got.json()["query"]
    assert stored["limit"] == big and stored["offset"] == small and stored["note"] == [big, 1.5]
    assert json.loads(got.text)["query"]["limit"] == big  # (the integer itself, not a float near it)
    assert [m["id"] for m in listed(client, tenant)["memories"]] == [memory_id]
    history = client.get(f"/v1/memories/{memory_id}/history", headers=tenant.headers())
    assert history.status_code == 200, history.text
    found = client.post("/v1/search", json={"question": "orders by region"}, headers=tenant.headers())
    assert found.status_code == 200, found.text
    assert [hit["query"]["limit"] for hit in found.json()["example_queries"]] == [big]
    hydrated = client.post("/v1/hydrate", json={"budget_bytes": 4000}, headers=tenant.headers())
    assert hydrated.status_code == 200, hydrated.text
    exported = client.get("/v1/memories:export", headers=tenant.headers())
    assert exported.status_code == 200, exported.text
    assert str(big) in exported.text
