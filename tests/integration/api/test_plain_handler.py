"""api.handlers: the plain routes answer every request as FastAPI's own handler of the same route does.

The comparison app is the same app with each engram route's handler rebuilt by FastAPI (``APIRoute``'s own
``get_route_handler``): both run on the session's stack, the requests go to each in turn, and the answers
(status, JSON) must be the same, for good requests and for every kind of bad one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import Body, Depends, Form, Header, Query, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute, request_response
from fastapi.testclient import TestClient

from api.auth import require_caller
from api.handlers import plain_handler
from api.threads import Route
from core.tenancy.context import Caller


@pytest.fixture(scope="module")
def fastapi_client(stack) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    from api.app import create_app

    app = create_app()
    # Copies: the route objects are shared with every app made (the module routers declare them once).
    for i, route in enumerate(app.router.routes):
        if isinstance(route, Route):
            twin = copy.copy(route)
            twin.app = request_response(APIRoute.get_route_handler(twin))
            app.router.routes[i] = twin
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def _route(client: TestClient, method: str, path: str) -> Route:
    found = [
        r for r in client.app.router.routes if isinstance(r, Route) and r.path == path and method in r.methods  # type: ignore[attr-defined]
    ]
    assert len(found) == 1, path
    return found[0]


def test_the_busy_routes_are_plain_and_others_keep_fastapis_handler(client):
    for method, path in (
        ("POST", "/v1/search"),
        ("POST", "/v1/memories"),
        ("POST", "/v1/memories:batch"),
        ("GET", "/v1/memories/{memory_id}"),
        ("GET", "/v1/memories"),
        ("PATCH", "/v1/memories/{memory_id}"),
        ("DELETE", "/v1/memories/{memory_id}"),
    ):
        assert plain_handler(_route(client, method, path)) is not None, path
    # A route that returns a dict is serialised by FastAPI (its response model), so it stays FastAPI's.
    assert plain_handler(_route(client, "GET", "/v1/keys")) is None


def _answer(response: Any) -> tuple[int, Any]:
    try:
        body = response.json()
    except json.JSONDecodeError:
        body = response.text
    if isinstance(body, dict):
        body.pop("request_id", None)
    return response.status_code, body


def test_bad_requests_get_the_answers_fastapis_handler_gives(client, fastapi_client, tenant, member_key):
    admin = tenant.headers()
    member = tenant.headers(member_key())
    saved = client.post("/v1/memories", json={"content": "orders.amount is in cents"}, headers=admin)
    assert saved.status_code == 201
    memory_id = saved.json()["memory_id"]
    as_json = {"Content-Type": "application/json"}
    plus_json = {**admin, "Content-Type": "application/x+json"}
    cased = {**admin, "Content-Type": "Application/JSON; charset=utf-8"}
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/memories", {"content": b'{"content": "x"', "headers": {**admin, **as_json}}),
        ("POST", "/v1/memories", {"content": b'{"content": "x"', "headers": as_json}),  # the body is read first
        ("POST", "/v1/memories", {"content": b"\xff\xfe{", "headers": {**admin, **as_json}}),
        ("POST", "/v1/memories", {"content": b"[1, 2]", "headers": {**admin, **as_json}}),
        ("POST", "/v1/memories", {"content": b"", "headers": {**admin, **as_json}}),
        ("POST", "/v1/memories", {"headers": admin}),
        ("POST", "/v1/memories", {"json": {"content": "x", "kind": 7}, "headers": admin}),
        ("POST", "/v1/memories", {"json": {"content": "x", "surprise": 1}, "headers": admin}),
        ("POST", "/v1/memories", {"json": {"content": "x"}}),
        ("POST", "/v1/memories", {"json": {"content": "x"}, "headers": {"Authorization": "Bearer egk_nope"}}),
        ("POST", "/v1/memories:batch", {"json": {"items": "no"}, "headers": admin}),
        ("POST", "/v1/search", {"content": b'{"question": 3}', "headers": plus_json}),
        ("POST", "/v1/search", {"content": b'{"question": ["x"]}', "headers": cased}),
        ("POST", "/v1/search", {"json": {"question": "x", "max_memories": -1}, "headers": admin}),
        ("POST", "/v1/search", {"json": {"question": "cents", "agent_id": 5}, "headers": admin}),
        ("GET", f"/v1/memories/{memory_id}?include_forgotten=maybe", {"headers": admin}),
        ("GET", f"/v1/memories/{memory_id}?include_forgotten=maybe", {}),  # the key is checked first
        ("GET", "/v1/memories/999999999", {"headers": admin}),
        ("GET", "/v1/memories/not-an-id", {"headers": admin}),
        ("GET", "/v1/memories?tags=a&tags=b&limit=abc", {"headers": admin}),
        ("GET", "/v1/memories?sort=sideways", {"headers": admin}),
        ("GET", "/v1/memories?limit=&tags=", {"headers": admin}),
        ("GET", f"/v1/memories/{memory_id}?include_forgotten=", {"headers": admin}),
        ("GET", f"/v1/memories/{memory_id}?include_forgotten=true&include_forgotten=maybe", {"headers": member}),
        ("PATCH", "/v1/memories/not-an-id", {"content": b"{", "headers": {**admin, **as_json}}),
        ("PATCH", f"/v1/memories/{memory_id}", {"json": {"kind": "nonsense"}, "headers": admin}),
        ("DELETE", "/v1/memories/999999999", {"headers": admin}),
        ("POST", "/v1/datasources", {"json": {"name": "x"}, "headers": member}),  # an admin route, a member key
        ("POST", "/v1/tenants", {"json": {"name": "x"}, "headers": admin}),  # an operator route, a tenant key
        ("POST", "/v1/tenants", {"content": b"{", "headers": as_json}),
        ("POST", "/v1/jobs:retry", {"json": {"state": 5}, "headers": admin}),
    ]  # fmt: skip
    for method, path, kwargs in requests:
        plain, fastapi = (_answer(c.request(method, path, **kwargs)) for c in (client, fastapi_client))
        assert plain == fastapi, (method, path, kwargs)
        assert 400 <= plain[0] < 500, (method, path, plain)


def test_good_requests_get_the_answers_fastapis_handler_gives(client, fastapi_client, tenant):
    headers = tenant.headers()
    for c in (client, fastapi_client):
        assert c.post("/v1/memories", json={"content": "invoices are issued monthly", "tags": ["billing"]},
                      headers=headers).status_code == 201  # fmt: skip
    ids = [m["id"] for m in client.get("/v1/memories?tags=billing", headers=headers).json()["memories"]]
    assert len(ids) == 2
    reads = [
        ("GET", "/v1/memories?tags=billing&limit=5", {}),
        ("GET", "/v1/memories?tags=billing,other&sort=importance", {}),
        ("POST", "/v1/search", {"json": {"question": "when are invoices issued?", "max_memories": 3}}),
        ("POST", "/v1/hydrate", {"json": {"budget_bytes": 4000}}),
        ("GET", f"/v1/memories/{ids[0]}/history", {}),
        ("GET", f"/v1/memories/{ids[0]}/history?include_forgotten=true&agent_id=", {}),
    ]
    for method, path, kwargs in reads:
        plain, fastapi = (_answer(c.request(method, path, headers=headers, **kwargs)) for c in (client, fastapi_client))
        assert plain[0] == 200, (path, plain)
        assert plain == fastapi, path



# Endpoints of the shapes api.handlers tells apart (declared here: FastAPI reads their annotations by name).
def _plain_endpoint(
    item: str, request: Request, body: Any = Body(default=None), flag: bool = Query(default=False),
    caller: Caller = Depends(require_caller),
) -> Response:  # fmt: skip
    return Response()


def _form_endpoint(name: str = Form()) -> Response:
    return Response()


def _header_endpoint(x_thing: str = Header()) -> Response:
    return Response()


def _dict_endpoint() -> dict[str, Any]:
    return {}


def test_a_route_is_plain_only_when_the_plain_handler_reads_all_it_takes():
    assert plain_handler(Route("/x/{item}", _plain_endpoint, methods=["POST"])) is not None
    assert plain_handler(Route("/x/{item}", _plain_endpoint, methods=["POST"], max_body_size=10)) is None
    assert plain_handler(Route("/x", _form_endpoint, methods=["POST"])) is None
    assert plain_handler(Route("/x", _header_endpoint, methods=["GET"])) is None
    assert plain_handler(Route("/x", _dict_endpoint, methods=["GET"])) is None
