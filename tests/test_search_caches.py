"""What search keeps between calls (compiled queries, dense matrices, catalog memos) never outlives a write."""

from __future__ import annotations

from tests.test_search_api import ids, save, search


def test_writes_and_forgets_show_in_the_next_search(client, tenant):
    """A warmed search sees the next revision, forget and association at once (hits and graph hops alike)."""
    top = save(client, tenant, {"content": "invoice reconciliation runs nightly", "sync_embed": True})
    hop = save(
        client,
        tenant,
        {"content": "see the runbook", "associations": [{"target_id": top, "weight": 0.9}], "sync_embed": True},
    )
    body = {"question": "invoice reconciliation", "max_memories": 3}
    for _ in range(3):  # warm every cache on this corpus
        out = search(client, tenant, body)
    assert ids(out["memories"])[:2] == [top, hop]
    response = client.patch(
        f"/v1/memories/{top}", json={"content": "invoice reconciliation runs hourly"}, headers=tenant.headers()
    )
    assert response.status_code == 200, response.text
    out = search(client, tenant, body)
    assert out["memories"][0]["id"] == top and out["memories"][0]["text"] == "invoice reconciliation runs hourly"
    assert client.delete(f"/v1/memories/{hop}", headers=tenant.headers()).status_code == 200
    assert ids(search(client, tenant, body)["memories"]) == [top]
    assert client.delete(f"/v1/memories/{top}", headers=tenant.headers()).status_code == 200
    assert search(client, tenant, body)["memories"] == []
    assert search(client, tenant, {"entities": [f"memory:{top}"]})["memories"] == []


def test_callers_never_share_compiled_visibility(client, tenant, member_key):
    """Compiled queries are keyed by caller and filters: one caller's visibility never serves another."""
    key = member_key()
    a = save(client, tenant, {"content": "ledger close checklist", "agent_id": "a"}, key=key)
    b = save(client, tenant, {"content": "ledger close checklist too", "agent_id": "b"}, key=key)
    for _ in range(2):
        for agent, expected in (("a", {a}), ("b", {b})):
            for body in ({"question": "ledger close"}, {"entities": [f"memory:{a}", f"memory:{b}"]}):
                seen = set(ids(search(client, tenant, {**body, "agent_id": agent}, key=key)["memories"]))
                assert seen == expected, (agent, body)
        for kind, expected in (("fact", {a, b}), ("todo", set())):
            seen = set(ids(search(client, tenant, {"question": "ledger close", "kind": kind})["memories"]))
            assert seen == expected
