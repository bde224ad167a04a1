"""Every revision is kept (CONTRACT section 4: PATCH, GET /v1/memories/{id}/history, export/import) and a
forgotten memory says why, by whom and when."""

from __future__ import annotations

from core.memories.transfer import parse_markdown

HISTORY_FIELDS = {"content", "kind", "category", "tags", "importance", "entities", "changed_by", "changed_at"}


def save(client, tenant, body, key=None):  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json=body, headers=tenant.headers(key))
    assert response.status_code == 201, response.text
    return response.json()["memory_id"]


def history(client, tenant, memory_id, key=None, expect=200, **params):  # type: ignore[no-untyped-def]
    response = client.get(f"/v1/memories/{memory_id}/history", headers=tenant.headers(key), params=params)
    assert response.status_code == expect, response.text
    return response.json()["versions"] if expect == 200 else response.json()


def test_patch_keeps_the_earlier_version_newest_first(client, tenant, member_key):
    """A PATCH adds a revision; history lists them newest first, the current one first, with who and when."""
    key = member_key("writer@example.com")
    mid = save(client, tenant, {"content": "refunds take 30 days", "kind": "fact", "tags": ["policy"]}, key)
    first = history(client, tenant, mid, key)
    assert len(first) == 1 and set(first[0]) == HISTORY_FIELDS
    assert first[0]["content"] == "refunds take 30 days" and first[0]["changed_by"] == "writer@example.com"
    patched = client.patch(
        f"/v1/memories/{mid}", json={"content": "refunds take 45 days", "kind": "decision"}, headers=tenant.headers()
    )
    assert patched.status_code == 200, patched.text
    versions = history(client, tenant, mid, key)
    assert [v["content"] for v in versions] == ["refunds take 45 days", "refunds take 30 days"]
    assert [v["kind"] for v in versions] == ["decision", "fact"]
    assert [v["importance"] for v in versions] == [0.8, 0.5]
    assert versions[0]["changed_by"] == "admin@localhost" and versions[1]["changed_by"] == "writer@example.com"
    assert versions[0]["changed_at"] >= versions[1]["changed_at"]
    client.patch(f"/v1/memories/{mid}", json={"tags": ["policy", "refunds"]}, headers=tenant.headers())
    assert [v["tags"] for v in history(client, tenant, mid, key)] == [["policy", "refunds"], ["policy"], ["policy"]]
    # A patch that changes none of the versioned fields is not a revision.
    client.patch(f"/v1/memories/{mid}", json={"tags": ["policy", "refunds"]}, headers=tenant.headers())
    assert len(history(client, tenant, mid, key)) == 3


def test_upsert_by_post_is_a_revision(client, tenant):
    save(client, tenant, {"id": "plan", "content": "plan is basic", "tags": ["a"]})
    save(client, tenant, {"id": "plan", "content": "plan is pro", "kind": "decision"})
    versions = history(client, tenant, "plan")
    assert [(v["content"], v["kind"], v["tags"]) for v in versions] == [
        ("plan is pro", "decision", []),
        ("plan is basic", "fact", ["a"]),
    ]


def test_history_is_visible_as_get_is(client, tenant, make_tenant, member_key):
    """404 for absent, another tenant's, another agent's, and forgotten memories; admins see forgotten ones."""
    mid = save(client, tenant, {"content": "agent note", "agent_id": "a1", "category": "core"})
    assert len(history(client, tenant, mid, agent_id="a1")) == 1
    history(client, tenant, mid, key=member_key(), agent_id="a2", expect=404)
    history(client, make_tenant(), mid, expect=404)
    history(client, tenant, "no-such-memory", expect=404)
    assert client.delete(f"/v1/memories/{mid}?reason=wrong", headers=tenant.headers()).status_code == 200
    assert history(client, tenant, mid, expect=404)["error"]["code"] == "not_found"
    assert len(history(client, tenant, mid, include_forgotten="true")) == 1


def test_forgotten_memory_shows_reason_who_and_when(client, tenant, member_key):
    key = member_key("owner@example.com")
    mid = save(client, tenant, {"content": "temporary password hint"}, key)
    live = client.get(f"/v1/memories/{mid}", headers=tenant.headers()).json()
    assert "forget_reason" not in live
    response = client.delete(f"/v1/memories/{mid}", params={"reason": "contains a secret"}, headers=tenant.headers(key))
    assert response.status_code == 200
    got = client.get(f"/v1/memories/{mid}", params={"include_forgotten": "true"}, headers=tenant.headers()).json()
    assert got["status"] == "forgotten" and got["forget_reason"] == "contains a secret"
    assert got["forgotten_by"] == "owner@example.com" and got["forgotten_at"] >= got["created_at"]
    listed = client.get("/v1/memories", params={"status": "forgotten"}, headers=tenant.headers()).json()["memories"]
    assert [m["forget_reason"] for m in listed if m["id"] == mid] == ["contains a secret"]


def test_forget_strips_refs_as_a_revision(client, tenant):
    target = save(client, tenant, {"content": "target"})
    other = save(client, tenant, {"content": "points at target", "linked_entities": [f"memory:{target}"]})
    client.delete(f"/v1/memories/{target}", headers=tenant.headers())
    versions = history(client, tenant, other)
    assert [v["entities"] for v in versions] == [[], [f"memory:{target}"]]


def test_export_import_carries_history(client, tenant, make_tenant):
    """An export lists each memory's revisions; importing it elsewhere restores them with author and time."""
    mid = save(client, tenant, {"id": "kb-1", "content": "v1 text", "tags": ["kb"]})
    client.patch(f"/v1/memories/{mid}", json={"content": "v2 text"}, headers=tenant.headers())
    client.patch(f"/v1/memories/{mid}", json={"content": "v3 text", "importance": 0.9}, headers=tenant.headers())
    before = history(client, tenant, mid)
    exported = client.get("/v1/memories:export", headers=tenant.headers()).text
    (block,) = [b for b in parse_markdown(exported) if b.front_matter["key"] == "kb-1"]
    assert [v["content"] for v in block.front_matter["history"]] == ["v3 text", "v2 text", "v1 text"]
    other = make_tenant()
    imported = client.post(
        "/v1/memories:import", content=exported, headers={**other.headers(), "Content-Type": "text/markdown"}
    )
    assert imported.status_code == 200, imported.text
    after = history(client, other, mid)
    assert after == before
    # Importing the same file again adds nothing: the export's newest version is the state it restores.
    client.post("/v1/memories:import", content=exported, headers={**other.headers(), "Content-Type": "text/markdown"})
    assert history(client, other, mid) == before


def test_import_rejects_a_malformed_history(client, tenant):
    text = "---\nkey: h1\nhistory: [{content: 5}]\n---\nbody\n"
    response = client.post(
        "/v1/memories:import", content=text, headers={**tenant.headers(), "Content-Type": "text/markdown"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"].startswith("blocks.0.history")


def test_a_catalog_cascade_shows_as_the_engines_revision(client, tenant, tmp_path):
    """A column removed from the catalog strips it from the memories linking it: the history's first
    version is the memory as it now stands, recorded as changed by the engine."""
    import sqlite3

    db = tmp_path / "shop.db"
    sqlite3.connect(db).close()
    headers = tenant.headers()
    created = client.post("/v1/datasources", json={"name": "shop", "url": f"sqlite:///{db}"}, headers=headers)
    assert created.status_code == 201, created.text
    body = {"columns": [{"name": "amount", "type": "INTEGER"}, {"name": "status", "type": "TEXT"}]}
    assert client.put("/v1/models/shop/orders", json=body, headers=headers).status_code == 200
    mid = save(client, tenant, {"content": "status is free text", "linked_entities": ["shop.orders.status"]})
    response = client.patch("/v1/models/shop/orders", json={"remove_columns": ["status"]}, headers=headers)
    assert response.status_code == 200, response.text
    versions = history(client, tenant, mid)
    assert [v["entities"] for v in versions] == [[], ["shop.orders.status"]]
    assert [v["changed_by"] for v in versions] == ["engram", "admin@localhost"]


def test_import_of_a_hand_written_history(client, tenant):
    """A history written by hand (no author or time) imports under the file's current content."""
    text = (
        "---\nkey: hw1\nkind: fact\nhistory:\n"
        "- {content: old words, kind: fact, category: core, importance: 0.5}\n"
        "- {content: older words, kind: fact, category: core, importance: 0.5, tags: [x]}\n"
        "---\nnew words\n"
    )
    response = client.post(
        "/v1/memories:import", content=text, headers={**tenant.headers(), "Content-Type": "text/markdown"}
    )
    assert response.status_code == 200, response.text
    versions = history(client, tenant, "hw1")
    assert [v["content"] for v in versions] == ["new words", "old words", "older words"]
    assert [v["changed_by"] for v in versions] == ["admin@localhost", "import", "import"]
    assert versions[2]["tags"] == ["x"] and all(v["changed_at"] for v in versions)
