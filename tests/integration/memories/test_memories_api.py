"""Memories over REST on the real stack (CONTRACT sections 2, 4 and 8)."""

from __future__ import annotations

import pytest


def save(client, tenant, body, key=None, expect=201):  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json=body, headers=tenant.headers(key))
    assert response.status_code == expect, response.text
    return response.json()


def test_save_get_roundtrip_with_defaults(client, tenant):
    """A save returns 201 with the contract's fields; get returns every memory field with kind defaults."""
    result = save(client, tenant, {"content": "orders.amount is in cents", "kind": "decision", "tags": ["units"]})
    assert set(result) >= {"memory_id", "entities", "warnings", "similar_existing"}
    memory = client.get(f"/v1/memories/{result['memory_id']}", headers=tenant.headers()).json()
    assert memory["content"] == "orders.amount is in cents"
    assert memory["kind"] == "decision" and memory["category"] == "core"
    assert memory["importance"] == 0.8
    assert memory["tags"] == ["units"] and memory["status"] == "active"
    assert memory["created_by"] == "admin@localhost"
    assert memory["access_count"] == 1
    for field in ("occurred_at", "created_at", "updated_at", "last_accessed_at", "superseded_by", "stale_reason"):
        assert field in memory


def test_learning_alias_and_importance_by_kind(client, tenant):
    """`learning` is an alias of `content`; importance defaults follow the kind table."""
    expected = {"identity": 1.0, "preference": 0.7, "goal": 0.7, "observation": 0.4, "todo": 0.3, "knowledge": 0.5}
    for kind, importance in expected.items():
        mid = save(client, tenant, {"learning": f"a {kind}", "kind": kind})["memory_id"]
        assert client.get(f"/v1/memories/{mid}", headers=tenant.headers()).json()["importance"] == importance


def test_patching_the_kind_moves_a_default_importance_and_keeps_a_chosen_one(client, tenant):
    """Rule: a new kind brings its default importance only when the memory's importance was its old kind's
    default; an importance someone set is kept; a null importance goes back to the kind's default."""
    cases = [
        # (saved importance, new kind, importance after the patch)
        (None, "decision", 0.8),  # observation's default 0.4 -> decision's 0.8
        (0.9, "decision", 0.9),  # chosen: kept
        (0.4, "todo", 0.3),  # equal to the old default: treated as the default
    ]
    for saved, kind, want in cases:
        body = {"content": f"patched kind {kind} {saved}", "kind": "observation"}
        if saved is not None:
            body["importance"] = saved
        mid = save(client, tenant, body)["memory_id"]
        patched = client.patch(f"/v1/memories/{mid}", json={"kind": kind}, headers=tenant.headers())
        assert patched.status_code == 200, patched.text
        assert patched.json()["importance"] == want, (saved, kind)
    patched = client.patch(f"/v1/memories/{mid}", json={"importance": None}, headers=tenant.headers())
    assert patched.json()["importance"] == 0.3


def test_auto_ids_are_sequential_and_never_reused(client, tenant):
    """Auto ids are one more than the largest integer-shaped id ever used, forgotten and supplied included."""
    first = save(client, tenant, {"content": "one"})["memory_id"]
    second = save(client, tenant, {"content": "two"})["memory_id"]
    assert (first, second) == ("1", "2")
    assert client.delete("/v1/memories/2?purge=true", headers=tenant.headers()).status_code == 200
    assert save(client, tenant, {"content": "three"})["memory_id"] == "3"
    save(client, tenant, {"content": "supplied", "id": "41"})
    assert save(client, tenant, {"content": "next"})["memory_id"] == "42"
    save(client, tenant, {"content": "not integer-shaped", "id": "0100"})
    save(client, tenant, {"content": "not integer-shaped either", "id": "100abc"})
    assert save(client, tenant, {"content": "after"})["memory_id"] == "43"


def test_auto_ids_are_per_tenant(client, make_tenant):
    a, b = make_tenant(), make_tenant()
    assert save(client, a, {"content": "a1"})["memory_id"] == "1"
    assert save(client, a, {"content": "a2"})["memory_id"] == "2"
    assert save(client, b, {"content": "b1"})["memory_id"] == "1"


@pytest.mark.parametrize("bad_id", ["a:b", "a/b", "a?b", "a#b", "a b", "a\tb", "a\x01b", "x" * 201, ""])
def test_supplied_id_charset_rejected(client, tenant, bad_id):
    """Supplied ids exclude ':' '/' '?' '#', whitespace and control characters, and are at most 200 chars."""
    response = client.post("/v1/memories", json={"content": "x", "id": bad_id}, headers=tenant.headers())
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "id"


@pytest.mark.parametrize("good_id", ["kb.policy.42", "x" * 200, "émoji-✓", "a_b-c"])
def test_supplied_id_charset_accepted(client, tenant, good_id):
    from urllib.parse import quote

    assert save(client, tenant, {"content": "x", "id": good_id})["memory_id"] == good_id
    response = client.get(f"/v1/memories/{quote(good_id, safe='')}", headers=tenant.headers())
    assert response.status_code == 200 and response.json()["id"] == good_id


def test_upsert_keeps_created_at(client, tenant):
    """Saving an existing id replaces the memory and keeps its created_at."""
    save(client, tenant, {"content": "v1", "id": "kb.1", "tags": ["a"]})
    before = client.get("/v1/memories/kb.1", headers=tenant.headers()).json()
    save(client, tenant, {"content": "v2", "id": "kb.1"})
    after = client.get("/v1/memories/kb.1", headers=tenant.headers()).json()
    assert after["content"] == "v2" and after["tags"] == []
    assert after["created_at"] == before["created_at"]
    assert after["updated_at"] > before["updated_at"]


def test_two_tenants_never_see_each_other(client, make_tenant):
    a, b = make_tenant(), make_tenant()
    save(client, a, {"content": "secret of a", "id": "shared-id"})
    assert client.get("/v1/memories/shared-id", headers=b.headers()).status_code == 404
    assert client.delete("/v1/memories/shared-id", headers=b.headers()).status_code == 404
    assert client.patch("/v1/memories/shared-id", json={"content": "x"}, headers=b.headers()).status_code == 404
    assert client.get("/v1/memories", headers=b.headers()).json()["memories"] == []
    # b may use the same id for its own memory without touching a's
    save(client, b, {"content": "b's own", "id": "shared-id"})
    assert client.get("/v1/memories/shared-id", headers=a.headers()).json()["content"] == "secret of a"


def test_member_cannot_forget_or_patch_admins_memory(client, tenant, member_key):
    """Only the owner or an admin may update or forget a memory: otherwise 403."""
    mid = save(client, tenant, {"content": "admin's note"})["memory_id"]
    member = member_key()
    assert client.get(f"/v1/memories/{mid}", headers=tenant.headers(member)).status_code == 200
    response = client.delete(f"/v1/memories/{mid}", headers=tenant.headers(member))
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert client.patch(f"/v1/memories/{mid}", json={"content": "x"}, headers=tenant.headers(member)).status_code == 403
    own = save(client, tenant, {"content": "member's note"}, key=member)["memory_id"]
    assert client.delete(f"/v1/memories/{own}", headers=tenant.headers(member)).status_code == 200
    # an admin may forget anybody's memory
    other = save(client, tenant, {"content": "another member note"}, key=member)["memory_id"]
    assert client.delete(f"/v1/memories/{other}", headers=tenant.headers()).status_code == 200


def test_agent_scoped_visibility(client, tenant, member_key):
    """core/daily/conversation memories written with an agent_id are visible only to that agent; workspace to all."""
    member = member_key()
    private = save(client, tenant, {"content": "agent A private", "agent_id": "A"}, key=member)["memory_id"]
    shared = save(client, tenant, {"content": "workspace fact", "agent_id": "A", "category": "workspace"}, key=member)[
        "memory_id"
    ]
    h = tenant.headers(member)
    assert client.get(f"/v1/memories/{private}?agent_id=A", headers=h).status_code == 200
    assert client.get(f"/v1/memories/{private}?agent_id=B", headers=h).status_code == 404
    assert client.get(f"/v1/memories/{private}", headers=h).status_code == 404
    assert client.get(f"/v1/memories/{shared}?agent_id=B", headers=h).status_code == 200
    listed = {m["id"] for m in client.get("/v1/memories?agent_id=B", headers=h).json()["memories"]}
    assert shared in listed and private not in listed
    # an admin sees everything in the tenant
    assert client.get(f"/v1/memories/{private}", headers=tenant.headers()).status_code == 200


def test_persona_visibility(client, tenant, member_key):
    member = member_key()
    h = tenant.headers(member)
    scoped = save(client, tenant, {"content": "as analyst", "persona": "analyst"}, key=member)["memory_id"]
    open_ = save(client, tenant, {"content": "no persona"}, key=member)["memory_id"]
    assert client.get(f"/v1/memories/{scoped}?persona=analyst", headers=h).status_code == 200
    assert client.get(f"/v1/memories/{scoped}?persona=other", headers=h).status_code == 404
    assert client.get(f"/v1/memories/{open_}?persona=other", headers=h).status_code == 200


def test_forget_strips_exact_memory_refs_only(client, tenant):
    """Forgetting memory 42 strips `memory:42` from other memories and leaves `memory:421` intact."""
    save(client, tenant, {"content": "forty-two", "id": "42"})
    save(client, tenant, {"content": "four-two-one", "id": "421"})
    linker = save(client, tenant, {"content": "links both", "linked_entities": ["memory:42", "memory:421"]})
    assert linker["entities"] == ["memory:42", "memory:421"]
    response = client.delete("/v1/memories/42?reason=outdated", headers=tenant.headers())
    assert response.status_code == 200 and response.json() == {"memory_id": "42", "status": "forgotten"}
    entities = client.get(f"/v1/memories/{linker['memory_id']}", headers=tenant.headers()).json()["entities"]
    assert entities == ["memory:421"]
    assert client.get("/v1/memories/42", headers=tenant.headers()).status_code == 404
    assert client.delete("/v1/memories/42", headers=tenant.headers()).status_code == 404
    admin_view = client.get("/v1/memories/42?include_forgotten=true", headers=tenant.headers())
    assert admin_view.status_code == 200 and admin_view.json()["status"] == "forgotten"


def test_unknown_memory_ref_is_rejected(client, tenant):
    response = client.post(
        "/v1/memories", json={"content": "x", "linked_entities": ["memory:nope"]}, headers=tenant.headers()
    )
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "linked_entities.0"


def test_purge_leaves_no_row(client, tenant, stack):
    """Purge hard-deletes the row, its embeddings and its links; a forgotten memory can still be purged."""
    from sqlalchemy import text

    from core.db import system_connection

    save(client, tenant, {"content": "target", "id": "t1"})
    save(
        client,
        tenant,
        {"content": "source", "id": "s1", "associations": [{"target_id": "t1", "relation_type": "part_of"}]},
    )
    assert client.delete("/v1/memories/t1", headers=tenant.headers()).status_code == 200
    assert client.delete("/v1/memories/t1?purge=true", headers=tenant.headers()).status_code == 200
    with system_connection() as connection:
        params = {"t": tenant.tenant_id}
        rows = connection.execute(text("SELECT count(*) FROM memories WHERE tenant_id=:t AND id='t1'"), params).scalar()
        links = connection.execute(
            text("SELECT count(*) FROM associations WHERE tenant_id=:t AND (target_id='t1' OR source_id='t1')"), params
        ).scalar()
        embeddings = connection.execute(
            text("SELECT count(*) FROM embeddings WHERE tenant_id=:t AND canonical_id='memory:t1'"), params
        ).scalar()
    assert (rows, links, embeddings) == (0, 0, 0)
    assert client.delete("/v1/memories/t1?purge=true", headers=tenant.headers()).status_code == 404


def test_patch_keeps_created_at_and_revises(client, tenant):
    mid = save(client, tenant, {"content": "draft", "kind": "todo"})["memory_id"]
    before = client.get(f"/v1/memories/{mid}", headers=tenant.headers()).json()
    response = client.patch(
        f"/v1/memories/{mid}", json={"content": "final", "kind": "decision", "tags": ["x"]}, headers=tenant.headers()
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["content"] == "final" and body["kind"] == "decision" and body["tags"] == ["x"]
    assert body["importance"] == 0.8
    assert body["created_at"] == before["created_at"]
    assert client.patch("/v1/memories/missing", json={"content": "x"}, headers=tenant.headers()).status_code == 404


def test_associations_roundtrip_and_validation(client, tenant):
    save(client, tenant, {"content": "base", "id": "b"})
    mid = save(
        client,
        tenant,
        {"content": "update", "associations": [{"target_id": "b", "relation_type": "updates", "weight": 0.9}]},
    )["memory_id"]
    memory = client.get(f"/v1/memories/{mid}", headers=tenant.headers()).json()
    assert memory["associations"] == [{"target_id": "b", "relation_type": "updates", "weight": 0.9}]
    bad = client.post(
        "/v1/memories",
        json={"content": "x", "associations": [{"target_id": "b", "relation_type": "likes"}]},
        headers=tenant.headers(),
    )
    assert bad.status_code == 422 and bad.json()["error"]["field"].startswith("associations.0")
    missing = client.post(
        "/v1/memories", json={"content": "x", "associations": [{"target_id": "zzz"}]}, headers=tenant.headers()
    )
    assert missing.status_code == 422


def test_batch_saves_valid_items_and_reports_errors_in_order(client, tenant):
    items = [{"content": "ok 1"}, {"content": "bad", "kind": "nonsense"}, {"content": "ok 2", "id": "b2"}, {"nope": 1}]
    response = client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert len(results) == 4
    assert results[0]["memory_id"] == "1" and results[2]["memory_id"] == "b2"
    assert results[1]["error"]["code"] == "validation_error" and results[3]["error"]["code"] == "validation_error"
    listed = client.get("/v1/memories", headers=tenant.headers()).json()["memories"]
    assert {m["id"] for m in listed} == {"1", "b2"}


def test_batch_limit(client, tenant):
    response = client.post("/v1/memories:batch", json={"items": [{"content": "x"}] * 1001}, headers=tenant.headers())
    assert response.status_code == 422
    response = client.post(
        "/v1/memories:batch", json={"items": [{"content": f"m{i}"} for i in range(1000)]}, headers=tenant.headers()
    )
    assert response.status_code == 200
    assert len([r for r in response.json()["results"] if "memory_id" in r]) == 1000


def test_list_filters_sort_and_cursor(client, tenant):
    for i in range(7):
        save(
            client,
            tenant,
            {
                "content": f"note {i}",
                "kind": "todo" if i % 2 else "fact",
                "tags": ["even"] if i % 2 == 0 else [],
                "importance": i / 10,
            },
        )
    h = tenant.headers()
    page1 = client.get("/v1/memories?limit=3", headers=h).json()
    assert [m["content"] for m in page1["memories"]] == ["note 6", "note 5", "note 4"]
    page2 = client.get(f"/v1/memories?limit=3&cursor={page1['next_cursor']}", headers=h).json()
    page3 = client.get(f"/v1/memories?limit=3&cursor={page2['next_cursor']}", headers=h).json()
    assert [m["content"] for m in page2["memories"] + page3["memories"]] == ["note 3", "note 2", "note 1", "note 0"]
    assert page3["next_cursor"] is None
    assert {m["kind"] for m in client.get("/v1/memories?kind=todo", headers=h).json()["memories"]} == {"todo"}
    assert len(client.get("/v1/memories?tags=even", headers=h).json()["memories"]) == 4
    by_importance = client.get("/v1/memories?sort=importance&limit=2", headers=h).json()["memories"]
    assert [m["content"] for m in by_importance] == ["note 6", "note 5"]
    assert client.get("/v1/memories?limit=201", headers=h).status_code == 422
    assert client.get("/v1/memories?cursor=garbage!!", headers=h).status_code == 400


def test_list_forgotten_is_admin_only(client, tenant, member_key):
    mid = save(client, tenant, {"content": "to forget"})["memory_id"]
    client.delete(f"/v1/memories/{mid}", headers=tenant.headers())
    forgotten = client.get("/v1/memories?status=forgotten", headers=tenant.headers()).json()["memories"]
    assert [m["id"] for m in forgotten] == [mid]
    assert client.get("/v1/memories", headers=tenant.headers()).json()["memories"] == []
    assert client.get("/v1/memories?status=forgotten", headers=tenant.headers(member_key())).status_code == 403


def test_hydrate_core_first_within_budget(client, tenant):
    """Core memories newest first, then the others newest first; each taken if it still fits the budget."""
    save(client, tenant, {"content": "c" * 10, "id": "core-old"})
    save(client, tenant, {"content": "d" * 10, "id": "daily-1", "category": "daily"})
    save(client, tenant, {"content": "C" * 30, "id": "core-big"})
    save(client, tenant, {"content": "k" * 5, "id": "core-new"})
    response = client.post("/v1/hydrate", json={"budget_bytes": 25}, headers=tenant.headers())
    assert response.status_code == 200, response.text
    body = response.json()
    assert [m["id"] for m in body["memories"]] == ["core-new", "core-old", "daily-1"]
    assert body["bytes"] == 25
    again = client.post("/v1/hydrate", json={"budget_bytes": 25}, headers=tenant.headers()).json()
    assert again == body


def test_keys_create_and_revoke(client, tenant, member_key):
    member = member_key("m2@example.com")
    assert client.get("/v1/memories", headers=tenant.headers(member)).status_code == 200
    # members cannot manage keys
    assert client.post("/v1/keys", json={"user": "x@example.com"}, headers=tenant.headers(member)).status_code == 403
    created = client.post("/v1/keys", json={"user": "y@example.com", "role": "member"}, headers=tenant.headers()).json()
    assert client.delete(f"/v1/keys/{created['id']}", headers=tenant.headers()).status_code == 200
    assert client.get("/v1/memories", headers=tenant.headers(created["api_key"])).status_code == 401
    assert (
        client.post("/v1/keys", json={"user": "z@example.com", "role": "root"}, headers=tenant.headers()).status_code
        == 422
    )


@pytest.mark.parametrize("budget", [0, 9, 40, 75, 10_000])
def test_hydrate_pages_through_sizes_as_the_listing_orders_them(client, tenant, monkeypatch, budget):
    """With pages of three, hydrate takes what a greedy pass over the listing's order takes: core memories
    first, newest first (ties by id, as text), each if its UTF-8 bytes still fit, another agent's core
    memories never; each memory in the REST shape with its associations."""
    from core.memories import listing

    monkeypatch.setattr(listing, "HYDRATE_PAGE", 3)
    items = [
        {"id": f"m{i}", "content": text, "category": category, **extra}
        for i, (text, category, extra) in enumerate(
            [
                ("é" * 4, "core", {}),
                ("plain note", "workspace", {}),
                ("ü🙂", "core", {"agent_id": "me"}),
                ("someone else's", "core", {"agent_id": "other"}),
                ("x" * 30, "core", {}),
                ("short", "workspace", {"associations": [{"target_id": "m1", "relation_type": "updates"}]}),
                ("y" * 12, "daily", {}),
                ("z", "core", {}),
                ("w" * 8, "workspace", {}),
                ("v" * 3, "core", {}),
                ("u" * 6, "workspace", {}),
            ],
            start=1,
        )
    ]
    response = client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
    assert response.status_code == 200 and all("memory_id" in r for r in response.json()["results"]), response.text
    listed = client.get("/v1/memories", params={"limit": 200, "agent_id": "me"}, headers=tenant.headers()).json()
    order = [m for m in listed["memories"] if m["category"] == "core"]
    order += [m for m in listed["memories"] if m["category"] != "core"]
    expected, used = [], 0
    for memory in order:
        size = len(memory["content"].encode())
        if used + size <= budget:
            expected.append(memory)
            used += size
        if used >= budget:
            break
    body = client.post("/v1/hydrate", json={"budget_bytes": budget, "agent_id": "me"}, headers=tenant.headers())
    assert body.status_code == 200, body.text
    assert body.json() == {"memories": expected, "bytes": used}
    assert "m4" not in {m["id"] for m in body.json()["memories"]}


def test_a_listings_tags_filter_keeps_memories_carrying_any_of_the_tags(client, tenant):
    """`tags=a,b` (or repeated) keeps a memory carrying at least one of them, as the parameter's description
    and search's filter say."""
    both = save(client, tenant, {"content": "both", "tags": ["a", "b"]})["memory_id"]
    only_a = save(client, tenant, {"content": "only a", "tags": ["a"]})["memory_id"]
    only_b = save(client, tenant, {"content": "only b", "tags": ["b", "c"]})["memory_id"]
    save(client, tenant, {"content": "neither", "tags": ["c"]})
    save(client, tenant, {"content": "untagged"})
    h = tenant.headers()
    for query in ("tags=a,b", "tags=a&tags=b"):
        listed = client.get(f"/v1/memories?{query}", headers=h).json()["memories"]
        assert {m["id"] for m in listed} == {both, only_a, only_b}, query
    assert {m["id"] for m in client.get("/v1/memories?tags=a", headers=h).json()["memories"]} == {both, only_a}
