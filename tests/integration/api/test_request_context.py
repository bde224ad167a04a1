"""X-Request-ID on every response (CONTRACT section 2) and HTTP metrics per route template."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from tests.helpers.api import scrape

_GENERATED = re.compile(r"^[0-9a-f]{32}$")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/healthz", 200),
        ("GET", "/no/such/route", 404),
        ("GET", "/v1/memories", 401),
        ("GET", "/metrics", 401),
        ("DELETE", "/healthz", 405),
        ("POST", "/v1/search", 401),
    ],
)
def test_every_route_answers_with_a_request_id(client, method, path, status):
    response = client.request(method, path)
    assert response.status_code == status
    assert _GENERATED.match(response.headers["x-request-id"])


def test_the_callers_id_comes_back_on_success_and_on_errors(client, tenant):
    for method, path, body, status in (
        ("POST", "/v1/memories", {"content": "request id echo"}, 201),
        ("POST", "/v1/memories", {"content": "x", "kind": "nope"}, 422),
        ("GET", "/v1/memories/absent-id", None, 404),
    ):
        response = client.request(
            method, path, json=body, headers={**tenant.headers(), "X-Request-ID": "caller-id-42:abc"}
        )
        assert response.status_code == status, response.text
        assert response.headers.get_list("x-request-id") == ["caller-id-42:abc"]


def test_each_request_gets_its_own_id_and_unusable_ones_are_replaced(client):
    first = client.get("/healthz").headers["x-request-id"]
    second = client.get("/healthz").headers["x-request-id"]
    assert first != second
    for unusable in ("x" * 201, "has space", "tab\tinside"):
        answered = client.get("/healthz", headers={"X-Request-ID": unusable}).headers["x-request-id"]
        assert _GENERATED.match(answered), answered


def test_an_unhandled_exception_is_a_json_500_with_the_request_id(stack):
    from api.app import create_app

    app = create_app()

    @app.get("/boom-for-test")
    def boom() -> None:
        raise RuntimeError("kaput")

    with TestClient(app, raise_server_exceptions=False) as local:
        response = local.get("/boom-for-test", headers={"X-Request-ID": "boom-1"})
    assert response.status_code == 500
    assert response.json() == {"error": {"code": "internal", "message": "internal error"}}
    assert response.headers["x-request-id"] == "boom-1"
    assert "kaput" not in response.text


def test_http_metrics_are_labelled_by_route_template_not_raw_path(client, tenant):
    before = scrape(client)
    for memory_id in ("tmpl-a", "tmpl-b", "tmpl-c"):
        assert client.get(f"/v1/memories/{memory_id}", headers=tenant.headers()).status_code == 404
    client.get("/nowhere/at/all")
    after = scrape(client)
    count = "engram_http_requests_total"
    key = (("method", "GET"), ("route", "/v1/memories/{memory_id}"), ("status", "404"))
    assert after[count][key] == before.get(count, {}).get(key, 0) + 3
    assert not any("tmpl-a" in str(labels) for labels in after[count])
    unmatched = (("method", "GET"), ("route", "<unmatched>"), ("status", "404"))
    assert after[count][unmatched] >= before.get(count, {}).get(unmatched, 0) + 1
    duration = "engram_http_request_duration_seconds_count"
    route = (("method", "GET"), ("route", "/v1/memories/{memory_id}"))
    assert after[duration][route] == before.get(duration, {}).get(route, 0) + 3
