"""The FastAPI application: routers, the error shape, and request guards."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from starlette.responses import Response

import core.schema  # noqa: F401 - every table known to the ORM
from api.errors import error_response, install_error_handlers

log = logging.getLogger("engram.api")

# A full batch (1,000 items of up to 50,000 bytes) fits; anything larger is refused before parsing.
MAX_BODY_BYTES = 64 * 1024 * 1024
_BODY_METHODS = ("POST", "PUT", "PATCH")


def create_app(*, install_queue: bool = True) -> FastAPI:
    app = FastAPI(title="engram", version="0.1.0", docs_url="/docs", redoc_url=None)
    install_error_handlers(app)

    @app.middleware("http")
    async def guard_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.method in _BODY_METHODS:
            length = request.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
                return error_response(413, f"request body over {MAX_BODY_BYTES} bytes")
            content_type = request.headers.get("content-type", "")
            has_body = (length is not None and length != "0") or "transfer-encoding" in request.headers
            media = content_type.split(";")[0].strip().lower()
            is_json = media == "application/json" or media.endswith("+json")
            if has_body and not is_json and not _accepts_other_media(request.url.path):
                return error_response(415, "send JSON with 'Content-Type: application/json'")
        return await call_next(request)

    from api.routes import catalog, dashboard, health, jobs, keys, memories, metrics, ops, runs, search, transfer

    for module in (health, keys, transfer, memories, jobs, catalog, search, ops, runs, dashboard, metrics):
        app.include_router(module.router)
    from api.mcp.http import mount_mcp

    mount_mcp(app)
    if install_queue:
        from api.broker import install_job_queue

        install_job_queue()
    return app


def _accepts_other_media(path: str) -> bool:
    """Routes that take non-JSON bodies (markdown import, dashboard sign-in form, MCP)."""
    return path.startswith(("/v1/memories:import", "/dashboard", "/mcp"))
