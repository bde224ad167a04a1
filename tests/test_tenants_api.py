"""Operating tenants over REST with the operator key (CONTRACT section 9): provision, list, read, suspend,
resume and quota edits, and who may call them."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import OPERATOR_KEY

OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}


def _name(prefix: str = "op") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def provision(client, name: str | None = None, **body):  # type: ignore[no-untyped-def]
    response = client.post("/v1/tenants", json={"name": name or _name(), **body}, headers=OPERATOR)
    assert response.status_code == 201, response.text
    return response.json()


def test_provisioning_answers_the_first_admin_key_once_and_the_tenant_works(client):
    made = provision(client, quotas={"max_memories": 10})
    assert set(made) == {"tenant", "api_key", "state", "quotas", "created_at"}
    assert made["state"] == "active" and made["api_key"].startswith("egk_")
    assert made["quotas"] == {
        "max_memories": 10, "max_datasources": None, "requests_per_minute": None, "embedding_texts_per_day": None,
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {made['api_key']}"}
    assert client.post("/v1/memories", json={"content": "first"}, headers=headers).status_code == 201
    shown = client.get(f"/v1/tenants/{made['tenant']}", headers=OPERATOR).json()
    assert "api_key" not in shown
    assert shown["usage"]["memories"] == 1 and shown["usage"]["saves"] == 1


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"name": ""}, 422, "name"),
        ({"name": "has space"}, 422, "name"),
        ({"name": "x" * 201}, 422, "name"),
        ({"name": 5}, 422, "name"),
        ({"name": "ok-name", "colour": "red"}, 422, "colour"),
        ({"name": "ok-name", "quotas": {"max_widgets": 1}}, 422, "quotas.max_widgets"),
        ({"name": "ok-name", "quotas": {"max_memories": -1}}, 422, "quotas.max_memories"),
        ({"name": "ok-name", "quotas": {"requests_per_minute": 0}}, 422, "quotas.requests_per_minute"),
        ({"name": "ok-name", "quotas": {"max_memories": "10"}}, 422, "quotas.max_memories"),
        ({"name": "ok-name", "quotas": {"max_memories": True}}, 422, "quotas.max_memories"),
        ({"name": "ok-name", "quotas": []}, 422, "quotas"),
    ],
)
def test_a_bad_provisioning_body_is_refused_naming_the_field(client, body, status, field):
    response = client.post("/v1/tenants", json=body, headers=OPERATOR)
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"] == field


def test_a_taken_name_is_409(client):
    made = provision(client)
    again = client.post("/v1/tenants", json={"name": made["tenant"]}, headers=OPERATOR)
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/tenants"), ("GET", "/v1/tenants"), ("GET", "/v1/tenants/x"), ("PATCH", "/v1/tenants/x"),
     ("DELETE", "/v1/tenants/x")],
)  # fmt: skip
def test_only_the_operator_key_operates_tenants(client, tenant, method, path):
    """No key: 401. A tenant's key, even an admin's: 403."""
    body = {"name": _name()} if method == "POST" else ({"state": "active"} if method == "PATCH" else None)
    assert client.request(method, path, json=body).status_code == 401
    refused = client.request(method, path, json=body, headers=tenant.headers())
    assert refused.status_code == 403, refused.text


def test_list_pages_by_name_and_filters_by_state_and_prefix(client):
    prefix = f"page-{uuid.uuid4().hex[:6]}"
    names = sorted(provision(client, f"{prefix}-{i}")["tenant"] for i in range(5))
    client.patch(f"/v1/tenants/{names[1]}", json={"state": "suspended"}, headers=OPERATOR)
    seen: list[str] = []
    cursor = None
    while True:
        params = {"q": prefix, "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/tenants", params=params, headers=OPERATOR).json()
        assert len(page["tenants"]) <= 2
        seen += [t["tenant"] for t in page["tenants"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == names
    suspended = client.get("/v1/tenants", params={"q": prefix, "state": "suspended"}, headers=OPERATOR).json()
    assert [t["tenant"] for t in suspended["tenants"]] == [names[1]]
    assert set(suspended["tenants"][0]) == {"tenant", "state", "quotas", "usage", "created_at"}


@pytest.mark.parametrize(
    ("params", "field"),
    [({"limit": 0}, "limit"), ({"limit": 201}, "limit"), ({"limit": "x"}, "limit"), ({"state": "gone"}, "state"),
     ({"cursor": "not-a-cursor"}, "cursor")],
)  # fmt: skip
def test_a_bad_list_query_is_422(client, params, field):
    response = client.get("/v1/tenants", params=params, headers=OPERATOR)
    assert response.status_code == 422 and response.json()["error"]["field"] == field


def test_unknown_tenants_are_404(client):
    for method, body in (("GET", None), ("PATCH", {"state": "suspended"}), ("DELETE", None)):
        response = client.request(method, f"/v1/tenants/{_name('nobody')}", json=body, headers=OPERATOR)
        assert response.status_code == 404, (method, response.text)


def test_patch_changes_quotas_named_and_keeps_the_others(client):
    made = provision(client, quotas={"max_memories": 5, "max_datasources": 2})
    path = f"/v1/tenants/{made['tenant']}"
    changed = client.patch(path, json={"quotas": {"max_memories": None, "requests_per_minute": 100}}, headers=OPERATOR)
    assert changed.status_code == 200
    assert changed.json()["quotas"] == {
        "max_memories": None, "max_datasources": 2, "requests_per_minute": 100, "embedding_texts_per_day": None,
    }  # fmt: skip
    for body, field in (({"state": "deleted"}, "state"), ({"quotas": {"nope": 1}}, "quotas.nope"), ({"x": 1}, "x")):
        refused = client.patch(path, json=body, headers=OPERATOR)
        assert refused.status_code == 422 and refused.json()["error"]["field"] == field


def test_a_suspended_tenant_is_refused_everywhere_and_keeps_its_data(client):
    made = provision(client)
    headers = {"Authorization": f"Bearer {made['api_key']}"}
    saved = client.post("/v1/memories", json={"content": "kept while suspended"}, headers=headers).json()
    path = f"/v1/tenants/{made['tenant']}"
    assert client.patch(path, json={"state": "suspended"}, headers=OPERATOR).json()["state"] == "suspended"
    calls = [
        ("GET", f"/v1/memories/{saved['memory_id']}", None),
        ("GET", "/v1/memories", None),
        ("POST", "/v1/memories", {"content": "refused"}),
        ("POST", "/v1/search", {"question": "kept"}),
        ("GET", "/v1/keys", None),
        ("GET", "/v1/jobs", None),
        ("GET", "/v1/usage", None),
        ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    ]
    for method, call_path, body in calls:
        extra = {"Accept": "application/json, text/event-stream"} if call_path == "/mcp" else {}
        refused = client.request(method, call_path, json=body, headers={**headers, **extra})
        assert refused.status_code == 403, (call_path, refused.text)
        assert refused.json()["error"]["code"] == "tenant_suspended"
    assert client.patch(path, json={"state": "active"}, headers=OPERATOR).json()["state"] == "active"
    back = client.get(f"/v1/memories/{saved['memory_id']}", headers=headers)
    assert back.status_code == 200 and back.json()["content"] == "kept while suspended"
    listed = client.get("/v1/tenants", params={"q": made["tenant"]}, headers=OPERATOR).json()["tenants"]
    assert listed[0]["usage"]["memories"] == 1
