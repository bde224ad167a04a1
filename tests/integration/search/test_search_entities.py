"""Search over the catalog: entity hits, datasource rooting, hidden docs, stale queries (search.md)."""

from __future__ import annotations

import pytest

from tests.helpers.api import ids, save, search


def test_entity_surfaces_itself(client, catalog):
    """entities=["<ds>.<model>.<col>"] puts that entity in the entities bucket, in supplied order."""
    out = search(client, catalog, {"entities": ["shop.orders.amount", "shop.orders"], "max_memories": 0})
    assert [(h["id"], h["kind"]) for h in out["entities"]] == [
        ("shop.orders.amount", "column"),
        ("shop.orders", "model"),
    ]
    assert "order amount in cents" in out["entities"][0]["text"]
    assert out["resolved_input_entities"] == ["shop.orders.amount", "shop.orders"]


def test_memory_refs_never_in_entities_bucket(client, catalog):
    mid = save(client, catalog, {"content": "note", "linked_entities": ["shop.orders.amount"]})
    out = search(client, catalog, {"entities": [f"memory:{mid}", "shop.orders.amount"]})
    assert ids(out["entities"]) == ["shop.orders.amount"]
    assert ids(out["memories"]) == [mid]
    assert out["memories"][0]["matched_entities"] == [f"memory:{mid}", "shop.orders.amount"]


def test_fulltext_entity_hits_and_datasource_rooting(client, catalog):
    """Question-only search finds entities; under a datasource only exact or dotted descendants surface."""
    out = search(client, catalog, {"question": "amount", "max_entities": 10})
    assert {"shop.orders.amount", "shop_v2.orders.amount"} <= set(ids(out["entities"]))
    scoped = search(client, catalog, {"question": "amount", "datasource": "shop", "max_entities": 10})
    assert "shop.orders.amount" in ids(scoped["entities"])
    assert all(h["id"] == "shop" or h["id"].startswith("shop.") for h in scoped["entities"])


def test_hidden_models_and_columns_never_surface(client, catalog):
    """Hidden docs are out of the entities bucket; memories tagged with them still rank by BM25."""
    for body in (
        {"question": "zanzibar token", "max_entities": 20},
        {"question": "internal", "max_entities": 20},
    ):
        found = ids(search(client, catalog, body)["entities"])
        assert "shop.orders.secret" not in found and not any(i.startswith("shop.internal") for i in found)
    tagged = save(client, catalog, {"content": "secret is rotated", "linked_entities": ["shop.orders.secret"]})
    out = search(client, catalog, {"entities": ["shop.orders.secret"]})
    assert out["entities"] == []
    assert "entity 'shop.orders.secret' is on a hidden model/column; dropped from entities bucket." in out["warnings"]
    assert ids(out["memories"]) == [tagged]


def test_not_rooted_refs_dropped_with_warnings(client, catalog):
    untagged = save(client, catalog, {"content": "untagged amount note"})
    out = search(client, catalog, {"entities": ["shop_v2.orders.amount", f"memory:{untagged}"], "datasource": "shop"})
    assert out["entities"] == []
    assert (
        "entity 'shop_v2.orders.amount' is not rooted at datasource 'shop'; dropped from entities bucket."
        in out["warnings"]
    )
    assert f"memory:{untagged} is not rooted at datasource 'shop'; dropped." in out["warnings"]
    assert out["memories"] == []


def test_datasource_filters_memories(client, catalog):
    """Memories surface under a datasource when one of their entities is rooted there; untagged ones never."""
    both = save(
        client,
        catalog,
        {"content": "amount rounding", "linked_entities": ["shop.orders.amount", "shop_v2.orders.amount"]},
    )
    v2 = save(client, catalog, {"content": "amount rounding v2", "linked_entities": ["shop_v2.orders.amount"]})
    plain = save(client, catalog, {"content": "amount rounding untagged"})
    for body in ({"question": "amount rounding"}, {}, {"mode": "recent"}):
        assert set(ids(search(client, catalog, {**body, "datasource": "shop"})["memories"])) == {both}
        assert set(ids(search(client, catalog, {**body, "datasource": "shop_v2"})["memories"])) == {both, v2}
        assert plain in ids(search(client, catalog, body)["memories"])


def test_stale_query_warning(client, catalog):
    """An example query naming a vanished column is surfaced with a warning, also when named explicitly."""
    mid = save(
        client,
        catalog,
        {
            "content": "orders by status",
            "linked_entities": {"source_model": "shop.orders", "dimensions": ["status"]},
        },
    )
    response = client.patch("/v1/models/shop/orders", json={"remove_columns": ["status"]}, headers=catalog.headers())
    assert response.status_code == 200, response.text
    # The catalog marks the memory stale: it surfaces only with include_stale, warning attached.
    assert search(client, catalog, {"entities": ["shop.orders"]})["example_queries"] == []
    out = search(client, catalog, {"entities": ["shop.orders"], "include_stale": True})
    assert ids(out["example_queries"]) == [mid]
    assert out["example_queries"][0]["query"]["dimensions"] == ["status"]
    assert any(
        w.startswith(f"example_query memory:{mid}: attached query has stale references") for w in out["warnings"]
    )
    named = search(client, catalog, {"entities": [f"memory:{mid}"], "max_example_queries": 0})
    assert named["example_queries"] == []
    assert any(w.startswith(f"example_query memory:{mid}:") for w in named["warnings"])


def test_entities_and_question_fuse(client, catalog):
    """Both inputs: channels 1 and 2 run for memories and entities; the entity bucket is RRF-fused."""
    mid = save(client, catalog, {"content": "aov excludes refunds", "linked_entities": ["shop.orders.aov"]})
    out = search(client, catalog, {"entities": ["shop.orders.aov"], "question": "average order value"})
    assert out["channels"]["entity_bm25"] and out["channels"]["fulltext"]
    assert ids(out["entities"])[0] == "shop.orders.aov"
    # First in every channel that ran: relevance 1.
    assert out["entities"][0]["score"] == pytest.approx(1.0)
    assert ids(out["memories"]) == [mid]


def test_entity_hit_text_and_hidden_flags_follow_catalog_edits(client, catalog):
    """Entity docs and hidden verdicts are cached per catalog snapshot: an edit shows in the next search."""
    first = search(client, catalog, {"entities": ["shop.orders.status"], "max_memories": 0})
    assert "fulfilment status" in first["entities"][0]["text"]
    response = client.patch(
        "/v1/models/shop/orders",
        json={"columns": [{"name": "status", "description": "shipping state of the parcel"}]},
        headers=catalog.headers(),
    )
    assert response.status_code == 200, response.text
    second = search(client, catalog, {"entities": ["shop.orders.status"], "max_memories": 0})
    assert "shipping state of the parcel" in second["entities"][0]["text"]
    assert "fulfilment status" not in second["entities"][0]["text"]
    # Full-text finds the column; once hidden it never surfaces again, though it was cached as shown.
    assert "shop.orders.status" in ids(search(client, catalog, {"question": "parcel shipping state"})["entities"])
    response = client.patch(
        "/v1/models/shop/orders", json={"columns": [{"name": "status", "hidden": True}]}, headers=catalog.headers()
    )
    assert response.status_code == 200, response.text
    assert "shop.orders.status" not in ids(search(client, catalog, {"question": "parcel shipping state"})["entities"])


def test_catalog_write_between_entity_searches_is_seen(client, catalog):
    """An entity search resolves with the tenant's last catalog snapshot while it confirms the catalog
    version in the entity channel's round trip; after a catalog write it starts again on the new one."""
    body = {"entities": ["shop.orders.status"], "max_memories": 0}
    for _ in range(2):  # the second search resolves with the snapshot the first one loaded
        out = search(client, catalog, body)
        assert ids(out["entities"]) == ["shop.orders.status"] and out["warnings"] == []
    response = client.patch(
        "/v1/models/shop/orders", json={"columns": [{"name": "status", "hidden": True}]}, headers=catalog.headers()
    )
    assert response.status_code == 200, response.text
    for _ in range(2):
        out = search(client, catalog, body)
        assert out["entities"] == []
        # Exactly one warning: nothing of the attempt on the outdated snapshot leaks into the response.
        assert out["warnings"] == [
            "entity 'shop.orders.status' is on a hidden model/column; dropped from entities bucket."
        ]


def test_large_catalog_is_rendered_in_the_background(client, catalog, monkeypatch):
    """A catalog above PREFETCH_MAX_DOCS is rendered whole by a background thread (kept only for the
    catalog version it was started for); searches render their own misses meanwhile, the same text."""
    from core.search import catalog as search_catalog
    from core.search import hits

    monkeypatch.setattr(hits, "PREFETCH_MAX_DOCS", 0)
    body = {"entities": ["shop.orders.status"], "max_memories": 0}
    first = search(client, catalog, body)
    search_catalog.wait_for_renders()
    assert "fulfilment status" in first["entities"][0]["text"]
    assert any(memo.get("complete") for _, memo in search_catalog._memos.values())
    # Every doc of the version is cached now: a doc never hit before renders without a query of its own.
    for _ in range(2):
        out = search(client, catalog, {"entities": ["shop.orders.aov"], "max_memories": 0})
        assert "average order value" in out["entities"][0]["text"]
    response = client.patch(
        "/v1/models/shop/orders",
        json={"columns": [{"name": "status", "description": "shipping state of the parcel"}]},
        headers=catalog.headers(),
    )
    assert response.status_code == 200, response.text
    second = search(client, catalog, body)
    search_catalog.wait_for_renders()
    assert "shipping state of the parcel" in second["entities"][0]["text"]
    assert "shipping state of the parcel" in search(client, catalog, body)["entities"][0]["text"]
    # A render started for an older catalog version keeps nothing.
    memo: dict = {}
    search_catalog._render_all(memo=memo, tenant_id=catalog.tenant_id, version=-1)
    assert memo == {}


def test_a_memory_ref_the_caller_cannot_see_is_dropped_as_missing(client, catalog):
    """``memory:<id>`` inputs are looked up as the caller sees them: a forgotten memory, another agent's
    agent-scoped memory and an unknown id are dropped with the same warning; a visible one is searched by."""
    seen = save(client, catalog, {"content": "seen note", "linked_entities": ["shop.orders.amount"]})
    gone = save(client, catalog, {"content": "gone note"})
    assert client.delete(f"/v1/memories/{gone}", headers=catalog.headers()).status_code == 200
    private = save(client, catalog, {"content": "planner's own", "category": "core", "agent_id": "planner"})
    refs = [f"memory:{m}" for m in (seen, gone, private, "999999999")]
    out = search(client, catalog, {"entities": refs, "agent_id": "writer"})
    assert out["resolved_input_entities"] == [f"memory:{seen}"]
    for missing in (gone, private, "999999999"):
        assert f"entity 'memory:{missing}' dropped: No memory with id '{missing}'" in out["warnings"], out["warnings"]
    assert ids(out["memories"]) == [seen]
    # The agent whose memory it is searches by it.
    mine = search(client, catalog, {"entities": [f"memory:{private}"], "agent_id": "planner"})
    assert mine["resolved_input_entities"] == [f"memory:{private}"] and mine["warnings"] == []
