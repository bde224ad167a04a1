"""The FastAPI application: routers, the error shape, and request guards."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

import core.schema  # noqa: F401 - every table known to the ORM
from api.auth import forget_cached_keys
from api.dashboard import routes as dashboard
from api.dashboard import tenants as dashboard_tenants
from api.errors import error_response, install_error_handlers
from api.mcp.http import mount_mcp
from api.observe import RequestContext
from api.openapi import install_openapi, operation_id
from api.overload import LoadShedder
from api.routes import (
    audit,
    catalog,
    health,
    jobs,
    keys,
    memories,
    metrics,
    ops,
    runs,
    search,
    tenants,
    transfer,
    webhooks,
)
from api.serve import routed
from api.tenant_events import TenantEventListener
from core import __version__
from core.config import get_settings
from core.db import limit_waits
from core.parsing import plain_int
from core.tenancy import usage
from core.tenancy.usage import buffer

log = logging.getLogger("engram.api")

# Body limits, by route, checked before anything is parsed (a declared Content-Length at once, a chunked
# body as it streams). A single save is one content of at most 50,000 bytes (up to six times that as
# JSON escapes) plus its fields; a batch of 1,000 such notes of typical size (a few KB) fits in 16 MB,
# while the theoretical 1,000 x 50,000 bytes is refused (split it: several batches are as fast).
# Markdown import takes whole exports; catalog bodies can list thousands of columns.
MAX_SINGLE_BODY_BYTES = 2 * 1024 * 1024
MAX_BATCH_BODY_BYTES = 16 * 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
_BODY_LIMITS = (
    ("/v1/memories:import", MAX_BODY_BYTES),
    ("/v1/memories:batch", MAX_BATCH_BODY_BYTES),
    ("/v1/models/", MAX_BATCH_BODY_BYTES),
    ("/v1/datasources", MAX_BATCH_BODY_BYTES),
    ("/mcp", MAX_BATCH_BODY_BYTES),
)
_BODY_METHODS = ("POST", "PUT", "PATCH")


DESCRIPTION = """Memory for AI agents: save what a run learns, find it again by entity, words and meaning.

Every /v1 call takes an API key as `Authorization: Bearer egk_...` (the Authorize button); `agent_id` and
`persona` (in the body or the query) say which agent and persona a call acts for. Every error is
`{"error": {"code", "message", "field"?}}`, with `field` the offending field's path on 422."""


def create_app(*, install_queue: bool = False) -> FastAPI:
    # Swagger UI and ReDoc from the fastapi-offline package's own files: /docs and /redoc work offline.
    app = FastAPIOffline(
        title="engram",
        version=__version__,
        docs_url="/docs",
        redoc_url="/redoc",
        static_url="/docs/assets",
        generate_unique_id_function=operation_id,
        # FastAPI's own OpenTelemetry bridge: tracing follows the global provider (core.tracing installs one
        # when tracing is on); engram exports no OpenTelemetry metrics or logs (Prometheus and core.logging
        # do), and each bridge left on cost every request a look-up of its global provider.
        telemetry={"metrics": False, "logs": False},
    )
    install_openapi(app, description=DESCRIPTION)
    install_error_handlers(app)

    app.add_middleware(BodyGuard)
    settings = get_settings()
    # Outside BodyGuard: a shed request costs no body read and no thread.
    app.add_middleware(
        LoadShedder,
        max_inflight=settings.api_inflight,
        max_queued=settings.api_max_queued,
        queue_wait=settings.api_queue_wait_seconds,
    )
    limit_waits(
        lock_timeout_seconds=settings.db_lock_timeout_seconds,
        idle_in_transaction_seconds=settings.db_idle_in_transaction_seconds,
        statement_timeout_seconds=settings.db_statement_timeout_seconds,
    )
    # Added last, so it runs first: even shed requests and BodyGuard's refusals carry the request id and
    # are counted.
    app.add_middleware(RequestContext)
    # Outermost: behind trusted proxies, every layer (the bad-key budget, the logs) sees the forwarded client.
    if settings.trusted_proxies.strip():
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.trusted_proxies)

    # The app's router tries its routes in this order and stops at the first full match: search and memories,
    # most of the traffic, first (walking the others first cost a search ~50 us of CPU), and FastAPI's own (the
    # OpenAPI document, the docs pages), added when the app was made, last. No two share a path, so the order
    # changes nothing else.
    framework = list(app.router.routes)
    app.router.routes.clear()
    for module in (
        search, memories, health, keys, transfer, jobs, catalog, ops, runs, tenants, audit, webhooks, dashboard,
        dashboard_tenants, metrics,
    ):  # fmt: skip
        add_routes(app, module.router)
    mount_mcp(app)
    app.router.routes.extend(framework)
    _run_tenant_services(app)
    # Writes only commit job rows; the outbox relay in each worker publishes them (core.jobs.relay), so a
    # request never waits on the broker. `install_queue` also publishes from this process, for setups
    # without a worker relay (the in-process client, MCP over stdio).
    if install_queue:
        # Deferred: api.broker loads Celery, which only an app that publishes its own jobs needs.
        from api.broker import install_job_queue

        install_job_queue()
    return app


def _run_tenant_services(app: FastAPI) -> None:
    """While the app runs: apply operators' changes to tenants at once (api.tenant_events), and write the
    usage this process buffered when it stops. With ENGRAM_API_WORKERS > 1, another process of the host may ask
    this one to drop a tenant's cached callers or to write its usage now (api.serve.routed)."""
    previous = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        routed.on_asked(routed.FORGET, lambda tenant_id: forget_cached_keys(tenant_id=tenant_id))
        routed.on_asked(routed.FLUSH_USAGE, lambda _tenant_id: buffer.flush())
        usage.before_reading_today(lambda: routed.ask_the_others(routed.FLUSH_USAGE))
        listener = TenantEventListener()
        listener.start()
        try:
            async with previous(application) as state:
                yield state
        finally:
            listener.stop()
            buffer.flush()

    app.router.lifespan_context = lifespan


class BodyGuard:
    """413 for oversized bodies and 415 for non-JSON bodies, before any parsing.

    A declared ``Content-Length`` over the limit is refused before the app runs; a body without one
    (``Transfer-Encoding: chunked``) is counted as it streams in, and once it passes the limit the app's
    read fails and the client gets the same 413 instead of whatever the app would have answered.

    A plain ASGI middleware: Starlette's BaseHTTPMiddleware would run every request in an extra task with
    memory streams, which costs about a millisecond per call.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        # The three headers it reads (names come lower-cased; the last of a repeated one counts), not all of them.
        length = kind = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value.decode("latin-1")
            elif name == b"content-type":
                kind = value.decode("latin-1")
            elif name == b"transfer-encoding":
                chunked = True
        declared = _declared_length(length)
        limit = body_limit(scope["path"])
        rejection = None
        if declared is not None and declared > limit:
            rejection = _too_large(limit, scope["path"])
        else:
            media = (kind or "").split(";")[0].strip().lower()
            is_json = media == "application/json" or media.endswith("+json")
            has_body = (length is not None and length != "0") or chunked
            if has_body and not is_json and not _accepts_other_media(scope["path"]):
                rejection = error_response(415, "send JSON with 'Content-Type: application/json'")
        if rejection is not None:
            await rejection(scope, receive, send)
            return
        if declared is not None:  # the server delivers no more than the declared length
            await self.app(scope, receive, send)
            return
        await self._counted(scope, receive, send, limit)

    async def _counted(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        received = 0
        over = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise BodyTooLarge(f"request body over {limit} bytes")
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over and not started:
                return  # the app's answer to a failed read (a 400, a 500): the client gets the 413 below
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not over or started:
                raise
        if over and not started:
            await _too_large(limit, scope["path"])(scope, receive, send)


class BodyTooLarge(Exception):
    """Raised inside ``receive`` once a streamed body passes its route's limit."""


def body_limit(path: str) -> int:
    """The largest body accepted on ``path``."""
    for prefix, limit in _BODY_LIMITS:
        if path.startswith(prefix):
            return limit
    return MAX_SINGLE_BODY_BYTES


def _too_large(limit: int, path: str) -> JSONResponse:
    hint = "; split it into smaller batches" if path.startswith("/v1/memories:batch") else ""
    return error_response(413, f"request body over {limit} bytes{hint}")


def _declared_length(value: str | None) -> int | None:
    """The Content-Length as a number; None when absent or malformed (the server refuses those itself)."""
    if value is None:
        return None
    return plain_int(value.strip(), max_digits=20)


def _accepts_other_media(path: str) -> bool:
    """Routes that take non-JSON bodies (markdown import, dashboard sign-in form, MCP)."""
    return path.startswith(("/v1/memories:import", "/dashboard", "/mcp"))


def add_routes(app: FastAPI, router: APIRouter) -> None:
    """``router``'s routes as the app's own, in their order.

    ``include_router`` keeps a router as one entry that FastAPI walks with bookkeeping per candidate route, and
    walks twice when it holds the match; the app's own routes are matched by their path's pattern alone. The
    module routers only declare (prefix, tags and the route class, already applied to each route)."""
    app.router.routes.extend(router.routes)
