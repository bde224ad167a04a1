"""Scoped API keys (CONTRACT section 2): a key bound to an agent/persona acts as it whatever a call names,
and a read-only key gets 403 on every write."""

from __future__ import annotations

import pytest


def make_key(client, tenant, **binding):  # type: ignore[no-untyped-def]
    body = {"user": "bound@example.com", "role": "member", **binding}
    response = client.post("/v1/keys", json=body, headers=tenant.headers())
    assert response.status_code == 201, response.text
    return response.json()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_agent_bound_key_acts_as_its_agent(client, tenant):
    """Saves are stamped with the bound agent; naming another agent anywhere is 403; the binding decides
    visibility exactly as if the call had named the agent."""
    issued = make_key(client, tenant, agent_id="agent-a")
    assert issued["agent_id"] == "agent-a" and issued["persona"] is None and issued["read_only"] is False
    key = issued["api_key"]
    saved = client.post("/v1/memories", json={"content": "a private note", "id": "pa"}, headers=auth(key))
    assert saved.status_code == 201, saved.text
    memory = client.get("/v1/memories/pa", headers=tenant.headers()).json()
    assert memory["agent_id"] == "agent-a"
    # The same agent named explicitly is fine; another one is refused, on every way of naming it.
    assert client.get("/v1/memories/pa?agent_id=agent-a", headers=auth(key)).status_code == 200
    other = [
        client.post("/v1/memories", json={"content": "x", "agent_id": "agent-b"}, headers=auth(key)),
        client.get("/v1/memories?agent_id=agent-b", headers=auth(key)),
        client.get("/v1/memories/pa?agent_id=agent-b", headers=auth(key)),
        client.post("/v1/search", json={"question": "note", "agent_id": "agent-b"}, headers=auth(key)),
        client.post(
            "/v1/memories:batch", json={"items": [{"content": "x", "agent_id": "agent-b"}]}, headers=auth(key)
        ),
    ]
    assert [r.status_code for r in other] == [403] * len(other)
    assert other[0].json()["error"]["field"] == "agent_id"
    # Another agent's private memory stays invisible (404) to the bound key.
    client.post("/v1/memories", json={"content": "b's", "id": "pb", "agent_id": "agent-b"}, headers=tenant.headers())
    assert client.get("/v1/memories/pb", headers=auth(key)).status_code == 404


def test_persona_bound_key_sees_its_persona_only(client, tenant):
    key = make_key(client, tenant, persona="support")["api_key"]
    sales = {"content": "sales only", "id": "s1", "persona": "sales"}
    client.post("/v1/memories", json=sales, headers=tenant.headers())
    saved = client.post("/v1/memories", json={"content": "support note", "id": "s2"}, headers=auth(key))
    assert saved.status_code == 201
    assert client.get("/v1/memories/s2", headers=tenant.headers()).json()["persona"] == "support"
    assert client.get("/v1/memories/s1", headers=auth(key)).status_code == 404
    assert client.get("/v1/memories/s1?persona=sales", headers=auth(key)).status_code == 403


def test_read_only_key_gets_403_on_every_write(client, tenant):
    key = make_key(client, tenant, read_only=True)["api_key"]
    client.post("/v1/memories", json={"content": "existing", "id": "r1"}, headers=tenant.headers())
    # Reads, including the POSTs that only read, work.
    assert client.get("/v1/memories/r1", headers=auth(key)).status_code == 200
    assert client.get("/v1/memories", headers=auth(key)).status_code == 200
    assert client.post("/v1/search", json={"question": "existing"}, headers=auth(key)).status_code == 200
    assert client.post("/v1/hydrate", json={"budget_bytes": 100}, headers=auth(key)).status_code == 200
    writes = [
        client.post("/v1/memories", json={"content": "new"}, headers=auth(key)),
        client.post("/v1/memories:batch", json={"items": [{"content": "new"}]}, headers=auth(key)),
        client.patch("/v1/memories/r1", json={"content": "changed"}, headers=auth(key)),
        client.delete("/v1/memories/r1", headers=auth(key)),
        client.delete("/v1/runs/run-1", headers=auth(key)),
        client.post("/v1/memories:import", content=b"", headers=auth(key)),
        client.post("/v1/jobs/job-x/retry", headers=auth(key)),
    ]
    assert [r.status_code for r in writes] == [403] * len(writes), [r.text for r in writes]
    assert writes[0].json()["error"]["code"] == "forbidden"
    assert client.get("/v1/memories/r1", headers=tenant.headers()).json()["content"] == "existing"


def test_read_only_admin_key_cannot_change_keys_or_catalog(client, tenant):
    response = client.post(
        "/v1/keys", json={"user": "auditor@example.com", "role": "admin", "read_only": True}, headers=tenant.headers()
    )
    assert response.status_code == 201
    key = response.json()["api_key"]
    assert client.get("/v1/keys", headers=auth(key)).status_code == 200
    refused = [
        client.post("/v1/keys", json={"user": "x@example.com"}, headers=auth(key)),
        client.delete(f"/v1/keys/{response.json()['id']}", headers=auth(key)),
        client.post("/v1/datasources", json={"name": "ds", "url": "sqlite:///x.db"}, headers=auth(key)),
        client.post("/v1/datasources/ds/ingest", headers=auth(key)),
        client.delete("/v1/datasources/ds", headers=auth(key)),
    ]
    assert [r.status_code for r in refused] == [403] * len(refused)


def test_key_listing_shows_bindings_and_never_secrets(client, tenant):
    issued = make_key(client, tenant, agent_id="bot", persona="p1", read_only=True)
    listed = client.get("/v1/keys", headers=tenant.headers())
    assert listed.status_code == 200
    keys = {k["id"]: k for k in listed.json()["keys"]}
    assert keys[issued["id"]] | {"created_at": None} == {
        "id": issued["id"],
        "user": "bound@example.com",
        "role": "member",
        "agent_id": "bot",
        "persona": "p1",
        "read_only": True,
        "created_at": None,
    }
    assert issued["api_key"] not in listed.text
    client.delete(f"/v1/keys/{issued['id']}", headers=tenant.headers())
    assert issued["id"] not in {k["id"] for k in client.get("/v1/keys", headers=tenant.headers()).json()["keys"]}
    assert client.get("/v1/memories", headers=auth(issued["api_key"])).status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"user": "a@example.com", "read_only": "yes"}, "read_only"),
        ({"user": "a@example.com", "agent_id": 5}, "agent_id"),
        ({"user": "a@example.com", "persona": ""}, "persona"),
        ({"user": "a@example.com", "agent_id": "x" * 201}, "agent_id"),
        ({"user": "a@example.com", "role": "admin", "agent_id": "bot"}, "role"),
        ({"user": "a@example.com", "scope": "all"}, "scope"),
    ],
)
def test_bad_bindings_are_422(client, tenant, body, field):
    response = client.post("/v1/keys", json=body, headers=tenant.headers())
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


def test_local_client_and_mcp_path_enforce_the_binding_too(client, tenant):
    """The in-process client (what the MCP server calls) applies the same binding and read-only guard."""
    from engram_client import EngramError as EngramAPIError

    from api.sdk import LocalEngramClient

    read_only = make_key(client, tenant, read_only=True)["api_key"]
    bound = make_key(client, tenant, agent_id="agent-a")["api_key"]
    with LocalEngramClient(api_key=read_only, install_queue=False) as local:
        assert local.list_memories().memories is not None
        with pytest.raises(EngramAPIError) as refused:
            local.save_memory(content="not allowed")
        assert refused.value.status == 403
    with LocalEngramClient(api_key=bound, install_queue=False) as local:
        saved = local.save_memory(content="mine", id="lc1")
        assert saved.memory_id == "lc1"
        with pytest.raises(EngramAPIError) as refused:
            local.save_memory(content="theirs", agent_id="agent-b")
        assert refused.value.status == 403
    assert client.get("/v1/memories/lc1", headers=tenant.headers()).json()["agent_id"] == "agent-a"


def test_an_admin_naming_an_agent_or_persona_sees_what_they_see(client, tenant):
    """CONTRACT section 2: the admin key, naming an agent_id and/or persona, gets that view (a filter) on every
    read; naming neither, it sees everything; it may still change anything."""
    saves = [
        {"id": "planner-core", "content": "planner note about invoices", "agent_id": "planner"},
        {"id": "coder-core", "content": "coder note about invoices", "agent_id": "coder"},
        {"id": "shared", "content": "workspace note about invoices", "agent_id": "coder", "category": "workspace"},
        {"id": "analyst", "content": "analyst persona note about invoices", "persona": "analyst"},
    ]
    for body in saves:
        assert client.post("/v1/memories", json=body, headers=tenant.headers()).status_code == 201
    everything = {m["id"] for m in client.get("/v1/memories", headers=tenant.headers()).json()["memories"]}
    assert everything >= {"planner-core", "coder-core", "shared", "analyst"}
    as_planner = {"agent_id": "planner"}
    listed = client.get("/v1/memories", params=as_planner, headers=tenant.headers()).json()["memories"]
    assert {m["id"] for m in listed} == {"planner-core", "shared"}
    found = client.post("/v1/search", json={"question": "invoices", **as_planner}, headers=tenant.headers()).json()
    assert {h["id"] for h in found["memories"]} == {"planner-core", "shared"}
    assert client.get("/v1/memories/coder-core", params=as_planner, headers=tenant.headers()).status_code == 404
    as_analyst = client.get("/v1/memories", params={"persona": "analyst"}, headers=tenant.headers()).json()
    assert "analyst" in {m["id"] for m in as_analyst["memories"]}
    assert "analyst" not in {m["id"] for m in listed}
    hydrated = client.post("/v1/hydrate", json={"budget_bytes": 10_000, **as_planner}, headers=tenant.headers())
    assert {m["id"] for m in hydrated.json()["memories"]} == {"planner-core", "shared"}
    # Changing: an upsert of another agent's id, named as planner, still goes through for the admin.
    upsert = {"id": "coder-core", "content": "revised by the admin", **as_planner}
    assert client.post("/v1/memories", json=upsert, headers=tenant.headers()).status_code == 201
