"""Quotas (CONTRACT section 9): a write past one is 403 quota_exceeded naming it and writes nothing (per item in
a batch or an import); requests_per_minute holds for all of a tenant's keys together."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from tests.helpers.api import OPERATOR, key_headers, provision


def _kept(tenant: str) -> tuple[int, int]:
    """(memories not forgotten counted in the table, the count kept on the tenant's row)."""
    from core.db import system_session

    with system_session() as session:
        row = session.execute(
            text(
                "SELECT (SELECT count(*) FROM memories m WHERE m.tenant_id = t.id AND m.status <> 'forgotten'), "
                "t.memory_count FROM tenants t WHERE t.name = :name"
            ),
            {"name": tenant},
        ).one()
    return int(row[0]), int(row[1])


def test_a_save_past_max_memories_is_refused_naming_the_quota_and_writes_nothing(client):
    made = provision(client, quotas={"max_memories": 2})
    headers = key_headers(made)
    for content in ("one", "two"):
        assert client.post("/v1/memories", json={"content": content}, headers=headers).status_code == 201
    refused = client.post("/v1/memories", json={"content": "three"}, headers=headers)
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded" and "max_memories" in error["message"] and "2" in error["message"]
    assert client.get("/v1/memories", headers=headers).json()["memories"].__len__() == 2
    # Revising a kept memory adds none; forgetting one frees a place.
    assert client.post("/v1/memories", json={"id": "1", "content": "one, revised"}, headers=headers).status_code == 201
    assert client.delete("/v1/memories/2", headers=headers).status_code == 200
    assert client.post("/v1/memories", json={"content": "three"}, headers=headers).status_code == 201
    # Upserting the forgotten id brings it back: that is a memory more.
    again = client.post("/v1/memories", json={"id": "2", "content": "two again"}, headers=headers)
    assert again.status_code == 403 and again.json()["error"]["code"] == "quota_exceeded"
    assert _kept(made["tenant"]) == (2, 2)


def test_a_batch_past_max_memories_saves_the_items_that_fit_and_refuses_the_rest(client):
    made = provision(client, quotas={"max_memories": 3})
    headers = key_headers(made)
    assert client.post("/v1/memories", json={"id": "a", "content": "a"}, headers=headers).status_code == 201
    items = [{"id": "a", "content": "a again"}] + [{"content": f"new {i}"} for i in range(4)]
    results = client.post("/v1/memories:batch", json={"items": items}, headers=headers).json()["results"]
    assert "memory_id" in results[0]  # an upsert of a kept memory
    assert ["memory_id" in r for r in results[1:]] == [True, True, False, False]
    assert results[3]["error"]["code"] == "quota_exceeded" and "max_memories" in results[3]["error"]["message"]
    assert _kept(made["tenant"]) == (3, 3)


def test_a_batch_that_fills_max_memories_exactly_is_saved_whole(client):
    made = provision(client, quotas={"max_memories": 4})
    headers = key_headers(made)
    assert client.post("/v1/memories", json={"content": "first"}, headers=headers).status_code == 201
    items = [{"content": f"new {i}"} for i in range(3)]
    results = client.post("/v1/memories:batch", json={"items": items}, headers=headers).json()["results"]
    assert [r.get("memory_id") for r in results] == ["2", "3", "4"]
    refused = client.post("/v1/memories:batch", json={"items": [{"content": "one more"}]}, headers=headers)
    assert refused.json()["results"][0]["error"]["code"] == "quota_exceeded"
    assert _kept(made["tenant"]) == (4, 4)


def test_a_save_racing_the_offboarding_of_its_tenant_writes_nothing(client):
    """The key was checked a moment before the tenant was marked for deletion: the save, under the tenant's
    row, sees the state and refuses (as the key would now be refused), whatever the shape of the save."""
    from core.db import system_session, tenant_session
    from core.errors import Unauthorized
    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import save_memories
    from core.tenancy.service import authenticate
    from tests.helpers.api import tenant_id_of

    made = provision(client)
    with system_session() as session:
        caller = authenticate(session, api_key=made["api_key"])
        session.execute(text("UPDATE tenants SET state = 'deleting' WHERE name = :n"), {"n": made["tenant"]})
    for items in ([SaveMemoryIn(content="new")], [SaveMemoryIn(content="upsert", id="x")]):
        with pytest.raises(Unauthorized), tenant_session(tenant_id_of(made["tenant"])) as session:
            save_memories(session, caller=caller, items=items, action="memory.save")
    assert _kept(made["tenant"]) == (0, 0)


def test_an_import_past_max_memories_is_refused_whole(client):
    source = provision(client)
    for i in range(3):
        client.post("/v1/memories", json={"content": f"exported {i}"}, headers=key_headers(source))
    exported = client.get("/v1/memories:export", params={"format": "markdown"}, headers=key_headers(source)).text
    target = provision(client, quotas={"max_memories": 2})
    refused = client.post(
        "/v1/memories:import",
        content=exported.encode(),
        headers={**key_headers(target), "Content-Type": "text/markdown"},
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "quota_exceeded"
    assert _kept(target["tenant"]) == (0, 0)


def test_concurrent_batches_never_pass_max_memories(client):
    """Each batch checks the quota under the tenant's row lock: 8 batches of 25 racing for 60 places."""
    made = provision(client, quotas={"max_memories": 60})
    headers = key_headers(made)
    statuses: list[int] = []

    def post(batch: int) -> None:
        items = [{"content": f"batch {batch} item {i}"} for i in range(25)]
        response = client.post("/v1/memories:batch", json={"items": items}, headers=headers)
        statuses.append(response.status_code)

    threads = [threading.Thread(target=post, args=(b,)) for b in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 8
    assert _kept(made["tenant"]) == (60, 60)


def test_the_kept_count_follows_every_way_a_memory_comes_and_goes(client):
    made = provision(client)
    headers = key_headers(made)
    client.post("/v1/memories:batch", json={"items": [{"content": f"m{i}", "run_id": "r1"} for i in range(5)]},
                headers=headers)  # fmt: skip
    client.post("/v1/memories", json={"content": "purged soon"}, headers=headers)
    client.delete("/v1/memories/6", params={"purge": "true"}, headers=headers)
    client.delete("/v1/memories/1", headers=headers)
    client.delete("/v1/memories/1", params={"purge": "true"}, headers=headers)
    client.post("/v1/memories", json={"id": "2", "content": "revised"}, headers=headers)
    assert _kept(made["tenant"]) == (4, 4)


def test_max_datasources(client, tmp_path):
    import sqlite3

    made = provision(client, quotas={"max_datasources": 1})
    headers = key_headers(made)
    for name in ("one", "two"):
        sqlite3.connect(tmp_path / f"{name}.db").execute("CREATE TABLE t (x int)").connection.close()
    first = client.post("/v1/datasources", json={"name": "one", "url": f"sqlite:///{tmp_path / 'one.db'}"},
                        headers=headers)  # fmt: skip
    assert first.status_code == 201, first.text
    second = client.post("/v1/datasources", json={"name": "two", "url": f"sqlite:///{tmp_path / 'two.db'}"},
                         headers=headers)  # fmt: skip
    assert second.status_code == 403 and second.json()["error"]["code"] == "quota_exceeded"
    assert "max_datasources" in second.json()["error"]["message"]
    assert [d["name"] for d in client.get("/v1/datasources", headers=headers).json()["datasources"]] == ["one"]


def test_requests_per_minute_counts_every_key_of_the_tenant_together(client):
    made = provision(client, quotas={"requests_per_minute": 5})
    admin = key_headers(made)
    member = client.post("/v1/keys", json={"user": "m@example.com"}, headers=admin)
    assert member.status_code == 201
    member_headers = {"Authorization": f"Bearer {member.json()['api_key']}"}
    statuses = [client.get("/v1/memories", headers=h).status_code for h in (member_headers, admin) * 3]
    assert statuses == [200] * 4 + [429, 429]  # the key's creation was the first of the five
    refused = client.get("/v1/memories", headers=member_headers)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert "requests_per_minute" in refused.json()["error"]["message"]
    # Lifting the quota lets the keys in at once.
    lifted = client.patch(f"/v1/tenants/{made['tenant']}", json={"quotas": {"requests_per_minute": None}},
                          headers=OPERATOR)  # fmt: skip
    assert lifted.status_code == 200
    assert client.get("/v1/memories", headers=admin).status_code == 200


@pytest.mark.parametrize("quota", ["max_memories", "max_datasources", "embedding_texts_per_day"])
def test_defaults_for_new_tenants_are_settings(client, monkeypatch, quota):
    from core.config import reset_settings_cache

    monkeypatch.setenv(f"ENGRAM_DEFAULT_{quota.upper()}", "7")
    reset_settings_cache()
    try:
        made = provision(client)
        assert made["quotas"][quota] == 7
        named = provision(client, quotas={quota: 9})
        assert named["quotas"][quota] == 9
    finally:
        monkeypatch.delenv(f"ENGRAM_DEFAULT_{quota.upper()}")
        reset_settings_cache()


def test_a_refusal_sends_quota_exceeded_once_a_minute(client):
    """The refused write rolls back; its `quota.exceeded` event is committed on its own, and a client retrying
    does not turn every attempt into an event."""
    made = provision(client, quotas={"max_memories": 1})
    headers = key_headers(made)
    hook = client.post(
        "/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "events": ["quota.exceeded"]}, headers=headers
    )
    assert hook.status_code == 201, hook.text
    assert client.post("/v1/memories", json={"content": "fits"}, headers=headers).status_code == 201
    assert client.post("/v1/memories", json={"content": "refused"}, headers=headers).status_code == 403
    batch = client.post("/v1/memories:batch", json={"items": [{"content": "also refused"}]}, headers=headers)
    assert batch.json()["results"][0]["error"]["code"] == "quota_exceeded"
    deliveries = client.get(f"/v1/webhooks/{hook.json()['id']}/deliveries", headers=headers).json()["deliveries"]
    assert [(d["type"], d["data"]) for d in deliveries] == [("quota.exceeded", {"quota": "max_memories", "limit": 1})]
