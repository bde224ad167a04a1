"""CONTRACT section 8: one JSON error shape on every route, the right status, never a 500 for bad input."""

from __future__ import annotations

import pytest

from tests.helpers.api import assert_error


def test_missing_and_wrong_keys_are_401(client):
    assert_error(client.get("/v1/memories"), 401, "unauthorized")
    assert_error(client.get("/v1/memories", headers={"Authorization": "Bearer egk_nope"}), 401)
    assert_error(client.get("/v1/memories", headers={"Authorization": "Basic abc"}), 401)


def test_unknown_route_and_method(client, tenant):
    assert_error(client.get("/v1/nothing-here", headers=tenant.headers()), 404, "not_found")
    assert_error(client.get("/nothing"), 404)
    assert_error(client.put("/v1/memories", json={}, headers=tenant.headers()), 405, "method_not_allowed")


def test_malformed_json_is_400(client, tenant):
    response = client.post(
        "/v1/memories", content=b'{"content": "x"', headers={**tenant.headers(), "Content-Type": "application/json"}
    )
    assert_error(response, 400, "bad_request")


def test_non_json_body_is_415(client, tenant):
    response = client.post(
        "/v1/memories", content=b"content=x", headers={**tenant.headers(), "Content-Type": "text/plain"}
    )
    assert_error(response, 415, "unsupported_media_type")


def test_content_over_50000_bytes_is_413(client, tenant):
    """The limit counts UTF-8 bytes: 16,667 three-byte characters are over it, 50,000 ASCII bytes are not."""
    assert_error(
        client.post("/v1/memories", json={"content": "€" * 16_667}, headers=tenant.headers()), 413, "payload_too_large"
    )
    assert client.post("/v1/memories", json={"content": "a" * 50_000}, headers=tenant.headers()).status_code == 201
    batch = client.post(
        "/v1/memories:batch", json={"items": [{"content": "a" * 50_001}, {"content": "ok"}]}, headers=tenant.headers()
    )
    assert batch.status_code == 200
    results = batch.json()["results"]
    assert results[0]["error"]["code"] == "payload_too_large" and "memory_id" in results[1]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "content"),
        ({"content": ""}, "content"),
        ({"content": "x", "kind": "opinion"}, "kind"),
        ({"content": "x", "category": "forever"}, "category"),
        ({"content": "x", "importance": 1.5}, "importance"),
        ({"content": "x", "tags": "not-a-list"}, "tags"),
        ({"content": "x", "occurred_at": "yesterday-ish"}, "occurred_at"),
        ({"content": 42}, "content"),
    ],
)
def test_validation_errors_name_the_field(client, tenant, body, field):
    error = assert_error(client.post("/v1/memories", json=body, headers=tenant.headers()), 422, "validation_error")
    assert error["field"] == field


def test_body_that_is_not_an_object(client, tenant):
    assert_error(client.post("/v1/memories", json=["x"], headers=tenant.headers()), 422)
    assert_error(client.post("/v1/memories:batch", json={"items": "x"}, headers=tenant.headers()), 422)
    assert_error(client.post("/v1/hydrate", json={"budget_bytes": -1}, headers=tenant.headers()), 422)


def test_operator_key_is_not_a_tenant_key(client):
    from tests.helpers.api import OPERATOR_KEY

    assert_error(client.get("/v1/memories", headers={"Authorization": f"Bearer {OPERATOR_KEY}"}), 403)


def test_health_needs_no_key(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "redis": "ok"}
    # Load balancers and uptime checks often probe with HEAD.
    assert client.head("/healthz").status_code == 200 and client.head("/readyz").status_code == 200


def test_rate_limit_answers_429_with_retry_after(client, tenant):
    """A key over its request budget gets 429 and Retry-After; other keys are unaffected."""
    from core.config import get_settings

    settings = get_settings()
    saved = settings.rate_limit_per_second, settings.rate_limit_burst
    settings.rate_limit_per_second, settings.rate_limit_burst = 1.0, 3.0
    try:
        statuses = [client.get("/v1/memories", headers=tenant.headers()).status_code for _ in range(6)]
        assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
        limited = client.get("/v1/memories", headers=tenant.headers())
        assert_error(limited, 429, "rate_limited")
        # The budget is 3 requests per 3 s: the wait is at most the window.
        assert 1 <= int(limited.headers["Retry-After"]) <= 3
        assert limited.headers["RateLimit-Limit"] == "3" and limited.headers["RateLimit-Remaining"] == "0"
    finally:
        settings.rate_limit_per_second, settings.rate_limit_burst = saved


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"content": "a\\u0000b"}', "content"),
        (b'{"content": "ok", "tags": ["x\\u0000"]}', "tags.0"),
        (b'{"content": "x\\ud800y"}', "content"),
        (b'{"content": "ok", "query": {"sql\\u0000": 1}}', "query.sql\x00"),
    ],
)
def test_text_postgres_cannot_store_is_422_and_nothing_is_written(client, tenant, raw, field):
    headers = {**tenant.headers(), "Content-Type": "application/json"}
    error = assert_error(client.post("/v1/memories", content=raw, headers=headers), 422, "validation_error")
    assert error["field"] == field
    batch = b'{"items": [{"content": "kept"}, ' + raw + b"]}"
    results = client.post("/v1/memories:batch", content=batch, headers=headers).json()["results"]
    assert "memory_id" in results[0] and results[1]["error"]["field"] == f"items.1.{field}"
    listed = client.get("/v1/memories", headers=tenant.headers()).json()["memories"]
    assert [m["content"] for m in listed] == ["kept"]


def test_nul_in_a_path_or_query_parameter_is_4xx(client, tenant):
    assert_error(client.get("/v1/memories/a%00b", headers=tenant.headers()), 404)
    assert_error(client.delete("/v1/memories/a%00b", headers=tenant.headers()), 404)
    assert_error(client.patch("/v1/memories/a%00b", json={"tags": []}, headers=tenant.headers()), 404)
    assert client.get("/v1/memories?tags=a%00b", headers=tenant.headers()).status_code == 422
