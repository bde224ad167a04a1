"""The FastAPI application: routers, the error shape, and request guards."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

import core.schema  # noqa: F401 - every table known to the ORM
from api.errors import error_response, install_error_handlers

log = logging.getLogger("engram.api")

# A full batch (1,000 items of up to 50,000 bytes) fits; anything larger is refused before parsing.
MAX_BODY_BYTES = 64 * 1024 * 1024
_BODY_METHODS = ("POST", "PUT", "PATCH")


def create_app(*, install_queue: bool = False) -> FastAPI:
    app = FastAPI(title="engram", version="0.1.0", docs_url="/docs", redoc_url=None)
    install_error_handlers(app)

    app.add_middleware(BodyGuard)

    from api.routes import catalog, dashboard, health, jobs, keys, memories, metrics, ops, runs, search, transfer

    for module in (health, keys, transfer, memories, jobs, catalog, search, ops, runs, dashboard, metrics):
        app.include_router(module.router)
    from api.mcp.http import mount_mcp

    mount_mcp(app)
    # Writes only commit job rows; the outbox relay in each worker publishes them (core.jobs.relay), so a
    # request never waits on the broker. `install_queue` also publishes from this process, for setups
    # without a worker relay (the in-process client, MCP over stdio).
    if install_queue:
        from api.broker import install_job_queue

        install_job_queue()
    return app


class BodyGuard:
    """413 for oversized bodies and 415 for non-JSON bodies, before any parsing.

    A plain ASGI middleware: Starlette's BaseHTTPMiddleware would run every request in an extra task with
    memory streams, which costs about a millisecond per call.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in _BODY_METHODS:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            length = headers.get("content-length")
            rejection = None
            if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
                rejection = error_response(413, f"request body over {MAX_BODY_BYTES} bytes")
            else:
                media = headers.get("content-type", "").split(";")[0].strip().lower()
                is_json = media == "application/json" or media.endswith("+json")
                has_body = (length is not None and length != "0") or "transfer-encoding" in headers
                if has_body and not is_json and not _accepts_other_media(scope["path"]):
                    rejection = error_response(415, "send JSON with 'Content-Type: application/json'")
            if rejection is not None:
                await rejection(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _accepts_other_media(path: str) -> bool:
    """Routes that take non-JSON bodies (markdown import, dashboard sign-in form, MCP)."""
    return path.startswith(("/v1/memories:import", "/dashboard", "/mcp"))
