"""Routing: engram's routes (api.threads.Route) answer the router's "do you match?" exactly as FastAPI's own
matching does, whatever the path, method and root path, only sooner for paths they cannot match."""

from __future__ import annotations

import re

from fastapi.routing import APIRoute
from starlette.routing import Match

from api.threads import Route

METHODS = ("GET", "POST", "PATCH", "DELETE", "HEAD", "PUT")


def request_paths(routes: list[Route]) -> list[str]:
    """Every route's path with its parameters filled in, near misses of each, and paths no route has."""
    paths = {"/", "/v1", "/v1/", "/v2/memories", "/healthz/", "/v1/memories:batchx", "/V1/memories"}
    for route in routes:
        filled = re.sub(r"{[^}/]+}", "42", route.path)
        odd = re.sub(r"{[^}/]+}", "a:b%2F", route.path)
        paths |= {filled, filled + "/", filled + "/extra", filled[:-1], odd, route.path}
    return sorted(paths)


def scope_for(path: str, method: str, root_path: str = "") -> dict[str, object]:
    return {"type": "http", "method": method, "path": root_path + path, "root_path": root_path, "headers": []}


def test_every_route_matches_as_fastapi_does(app):
    routes = [route for route in app.router.routes if isinstance(route, Route)]
    assert len(routes) > 50  # every engram route is one
    decided = {Match.NONE: 0, Match.PARTIAL: 0, Match.FULL: 0}
    for root_path in ("", "/behind/a/proxy"):
        for path in request_paths(routes):
            for method in METHODS:
                scope = scope_for(path, method, root_path)
                for route in routes:
                    ours = route.matches(dict(scope))
                    theirs = APIRoute.matches(route, dict(scope))
                    assert ours == theirs, (route.path, method, root_path + path)
                    decided[ours[0]] += 1
    # The comparison covered full and partial matches (a known path, another method), not only misses.
    assert decided[Match.FULL] > 200 and decided[Match.PARTIAL] > 500, decided


def test_a_path_parameter_is_read_and_a_wrong_method_is_a_partial_match(app):
    route = next(r for r in app.router.routes if isinstance(r, Route) and r.path == "/v1/memories/{memory_id}")
    match, child = route.matches(scope_for("/v1/memories/17", "GET"))
    assert match == Match.FULL and child["path_params"] == {"memory_id": "17"}
    assert route.matches(scope_for("/v1/memories/17", "PUT"))[0] == Match.PARTIAL
    assert route.matches(scope_for("/v1/memory/17", "GET")) == (Match.NONE, {})
    assert route.matches({"type": "websocket", "path": "/v1/memories/17", "headers": []}) == (Match.NONE, {})
