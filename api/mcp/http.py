"""The streamable-HTTP MCP endpoint mounted on the API at ``/mcp``.

Stateless and with JSON answers: every POST is authenticated and served on its own, so the endpoint
works behind several API worker processes (an MCP session kept in one process's memory would not) and
needs no sticky routing. The SDK's DNS-rebinding guard stays off: it protects unauthenticated local
servers, while every call here needs the Bearer key, which a rebinding page cannot supply.

A tool call is one REST request to the app serving ``/mcp`` (engram's Python SDK on an ASGI transport bound
to that app, on the same event loop): the route's own validation, authorization, rate limit and metering
apply once, and no second app or thread is involved.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from engram_client import AsyncEngramClient
from fastapi import FastAPI
from mcp.server.fastmcp import Context
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import bearer_token, caller_from_request
from api.errors import error_response
from api.mcp import build_server
from api.sdk import app_client
from api.threads import in_thread
from core.errors import EngramError

MCP_PATH = "/mcp"
# Optional defaults for the agent identity, so an MCP client configured once need not repeat it per tool.
AGENT_HEADER, PERSONA_HEADER = "x-engram-agent-id", "x-engram-persona"


class McpEndpoint:
    """ASGI app: authenticate like /v1 (401/403/429 in the REST error shape), then hand over to the SDK."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._server = build_server(self._client_for)
        self._manager: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def _client_for(self, ctx: Context) -> AsyncIterator[AsyncEngramClient]:
        """The tool call's client: the app serving this request, with the key the MCP request was sent with."""
        request: Any = ctx.request_context.request
        async with app_client(
            self._app,
            api_key=bearer_token(request) or "",
            agent_id=request.headers.get(AGENT_HEADER) or None,
            persona=request.headers.get(PERSONA_HEADER) or None,
            # The tool's REST calls carry the MCP request's id (api.observe keeps it in the scope's state).
            request_id=getattr(request.state, "request_id", None),
        ) as client:
            yield client

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the SDK's request manager for the life of the application (one per startup)."""
        manager = StreamableHTTPSessionManager(
            app=self._server._mcp_server,  # the low-level server FastMCP wraps; no public accessor in 1.x
            json_response=True,
            stateless=True,
            security_settings=None,
        )
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            # Not metered: its tools' REST calls are, each as one request.
            await in_thread(caller_from_request, request, meter=False)
        except EngramError as exc:
            headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else dict(getattr(exc, "headers", {}))
            await error_response(exc.status, exc.message, code=exc.code, headers=headers)(scope, receive, send)
            return
        if self._manager is None:
            await error_response(503, "the MCP endpoint is starting or stopping; retry shortly")(scope, receive, send)
            return
        await self._manager.handle_request(scope, receive, send)


def mount_mcp(app: FastAPI) -> None:
    """Serve MCP at /mcp on `app`, and run its manager inside the app's lifespan."""
    endpoint = McpEndpoint(app)
    for path in (MCP_PATH, MCP_PATH + "/"):
        app.router.routes.append(Route(path, endpoint=endpoint))
    previous = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        async with endpoint.running(), previous(application) as state:
            yield state

    app.router.lifespan_context = lifespan
