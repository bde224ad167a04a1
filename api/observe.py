"""Request context for every HTTP call: the request id, the access log line and the HTTP metrics.

One plain ASGI middleware (like BodyGuard: no extra task per request). It

- takes the caller's ``X-Request-ID`` (printable ASCII, at most 200 characters) or makes one, keeps it in
  ``core.logging``'s context for every log line of the request and the jobs it enqueues, and returns it on
  every response, including errors, unknown routes and unhandled exceptions (answered here as a JSON 500,
  since Starlette's last-resort handler sits outside user middleware and would drop the header);
- records request count and duration per route template (``/v1/memories/{memory_id}``, never the raw path,
  so a scrape stays small whatever ids callers use);
- writes one access log line per request when ``ENGRAM_ACCESS_LOG`` is on;
- adds the key's ``RateLimit-*`` header fields to every answer of a request the key's budget admitted
  (api.auth leaves the verdict on the scope): a route's own ``Response``, a 4xx raised after admission, a
  streamed body, an unhandled error, alike.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response
from api.ratelimit import header_fields
from core.config import get_settings
from core.logging import request_id_scope
from core.metrics import HTTP_REQUEST_SECONDS, HTTP_REQUESTS

log = logging.getLogger("engram.api")
access_log = logging.getLogger("engram.access")

HEADER = b"x-request-id"
_MAX_ID_LENGTH = 200
UNMATCHED_ROUTE = "<unmatched>"
# Metric labels take the method only from this set: a client's invented method must not add series.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def accepted_request_id(value: bytes | None) -> str:
    """The caller's id when it is printable ASCII of sane length (it goes into logs), else a new one."""
    if value and len(value) <= _MAX_ID_LENGTH and all(0x21 <= byte <= 0x7E for byte in value):
        return value.decode("ascii")
    return os.urandom(16).hex()  # as uuid4().hex reads, without building a UUID per request


def route_template(scope: Scope) -> str:
    """The matched route's path template (set on the scope by Starlette's router), or a fixed label."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED_ROUTE


# The metric children of each (method, route template, status) seen, looked up once per process: bounded by
# the routes and statuses there are, as the series themselves are.
_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def _count(method: str, route: str, status: int, seconds: float) -> None:
    key = (method, route, status)
    children = _children.get(key)
    if children is None:
        children = _children[key] = (
            HTTP_REQUESTS.labels(method, route, str(status)),
            HTTP_REQUEST_SECONDS.labels(method, route),
        )
    children[0].inc()
    children[1].observe(seconds)


class RequestContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._access_log = get_settings().access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent_id = next((v for k, v in scope["headers"] if k == HEADER), None)
        request_id = accepted_request_id(sent_id)
        id_header = (HEADER, request_id.encode("ascii"))
        scope.setdefault("state", {})["request_id"] = request_id  # for work done on the request's behalf (MCP)
        status = 0  # stays 0 when the client left before any answer
        started = False
        began = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != HEADER]
                message = {**message, "headers": [*headers, *header_fields(scope), id_header]}
            await send(message)

        with request_id_scope(request_id):
            try:
                await self.app(scope, receive, send_with_id)
            except Exception:
                status = 500
                log.exception("unhandled error on %s %s", scope["method"], scope["path"])
                if not started:
                    await error_response(500, "internal error", code="internal")(scope, receive, send_with_id)
            finally:
                seconds = time.perf_counter() - began
                route = route_template(scope)
                method = scope["method"] if scope["method"] in _METHODS else "OTHER"
                _count(method, route, status, seconds)
                if self._access_log:
                    access_log.info(
                        "%s %s %d %.1fms",
                        scope["method"],
                        scope["path"],
                        status,
                        seconds * 1000,
                        extra={"route": route, "status": status, "duration_ms": round(seconds * 1000, 2)},
                    )
