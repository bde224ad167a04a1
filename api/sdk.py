"""engram's own use of its Python SDK (``engram_client``, clients/python): the CLI and the MCP server call
the REST routes through it, over the network or answered by an app in this process.

* :class:`LocalEngramClient` — the SDK's sync client whose requests engram's ASGI app answers in this
  process (no HTTP server): the CLI's local commands and ``engram mcp`` beside `engram serve`. Every call
  goes through the very routes a server runs (same validation, authentication, answers and error JSON),
  so local use cannot drift from REST.
* :func:`app_client` — the SDK's async client bound to an app that is already serving (``/mcp``): a tool
  call is one request to the app that received it, on the event loop serving it.
"""

# Imports inside functions are deferred: the app (create_app, api.auth) loads only when a client answers
# in this process, and api.broker (Celery) only when that app publishes its own jobs; the CLI's HTTP-only
# commands import this module without either.
from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx
from engram_client import AsyncEngramClient, EngramClient, EngramConnectionError, EngramError
from engram_client.errors import error_for
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from starlette.types import ASGIApp

from core import errors as core_errors
from core.tracing import current_request_id

T = TypeVar("T")
# The base URL of in-process requests: never resolved, the transport answers them.
LOCAL_URL = "http://engram.local"


def sdk_error(exc: core_errors.EngramError) -> EngramError:
    """The SDK's typed error for a core error, as the route would have answered it."""
    error = {"code": exc.code, "message": exc.message, "field": exc.field, **exc.details}
    return error_for(exc.status, {"error": error}, request_id=None, retry_after=None)


def unreachable(exc: EngramConnectionError) -> EngramError:
    """No answer at all, as the 503 an agent or a script can act on."""
    return unavailable(f"{exc.message}; retry shortly")


def unavailable(message: str) -> EngramError:
    return error_for(503, {"error": {"code": "unavailable", "message": message}}, request_id=None, retry_after=None)


def as_json(value: BaseModel | list[BaseModel] | str) -> Any:
    """An SDK result as plain JSON data (what the REST answer's body was)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return [item.model_dump(mode="json", by_alias=True) for item in value]
    return value.model_dump(mode="json", by_alias=True)


def with_request_id(request: httpx.Request, request_id: str | None) -> None:
    """A call made while serving another request (an MCP tool call over /mcp) carries that request's id,
    so its log lines and audit entries name the request the agent made."""
    outer = request_id or current_request_id()
    if outer and "x-request-id" not in request.headers:
        request.headers["X-Request-ID"] = outer


class AppTransport(httpx.ASGITransport):
    """httpx's ASGI transport on engram's app, passing on the id of the request being served."""

    def __init__(self, app: ASGIApp, *, request_id: str | None = None) -> None:
        # raise_app_exceptions=False: an unexpected error is the app's 500 JSON, as a real server answers.
        super().__init__(app=app, raise_app_exceptions=False)
        self._request_id = request_id

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        with_request_id(request, self._request_id)
        return await super().handle_async_request(request)


def app_client(
    app: ASGIApp,
    *,
    api_key: str,
    agent_id: str | None = None,
    persona: str | None = None,
    request_id: str | None = None,
) -> AsyncEngramClient:
    """The async SDK client on ``app`` (which must be serving: its lifespan is not run here). No retries:
    a 429 or 503 goes back to the caller at once instead of holding the request that made this call."""
    transport = AppTransport(app, request_id=request_id)
    return AsyncEngramClient(
        LOCAL_URL, api_key=api_key, agent_id=agent_id, persona=persona, max_retries=0, transport=transport
    )


class _AppLoop:
    """engram's app and the event loop it runs on, once per process (rebuilt in a forked child).

    The sync client blocks its thread while the app answers, so the app runs on a loop of its own in a
    daemon thread (a script that never closes its client still exits)."""

    _lock = threading.Lock()
    _current: _AppLoop | None = None

    def __init__(self) -> None:
        from api.app import create_app  # the app imports the routes, which need not load for a remote client

        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.asgi = AppTransport(create_app())
        threading.Thread(target=self.loop.run_forever, name="engram-local-app", daemon=True).start()

    @classmethod
    def get(cls) -> _AppLoop:
        with cls._lock:
            if cls._current is None or cls._current.pid != os.getpid():
                cls._current = _AppLoop()
            return cls._current

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


class InProcessTransport(httpx.BaseTransport):
    """A synchronous httpx transport that answers each request with engram's app in this process."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with_request_id(request, None)  # the calling thread's request, if any
        app_loop = _AppLoop.get()
        return app_loop.run(self._answer(app_loop.asgi, request))

    @staticmethod
    async def _answer(asgi: httpx.ASGITransport, request: httpx.Request) -> httpx.Response:
        response = await asgi.handle_async_request(request)
        content = await response.aread()
        return httpx.Response(response.status_code, headers=response.headers, content=content)


def check_key(api_key: str) -> None:
    """Refuse a wrong key at once (:class:`engram_client.AuthenticationError`), not at the first call."""
    # Authentication loads the database and rate-limit layers: only when a local client is made, so that
    # the CLI's remote commands (which import this module) start without them.
    from api.auth import caller_for_key

    try:
        caller_for_key(api_key)
    except core_errors.EngramError as exc:
        raise sdk_error(exc) from None
    except OperationalError:
        raise unavailable("the database is unavailable; retry shortly") from None


class LocalEngramClient(EngramClient):
    """The SDK client for one API key with its requests answered by the routes in this process, against the
    configured database (or the running `engram serve` of ENGRAM_HOME); same methods and results as over
    HTTP. ``install_queue``: hand committed jobs to Celery when a broker is reachable (else they wait for
    the reconciler, as any write does while Redis is down)."""

    def __init__(
        self, *, api_key: str, agent_id: str | None = None, persona: str | None = None, install_queue: bool = True
    ):
        check_key(api_key)
        transport = InProcessTransport()
        super().__init__(LOCAL_URL, api_key=api_key, agent_id=agent_id, persona=persona, transport=transport)
        if install_queue:
            install_job_queue()


def install_job_queue() -> None:
    """Hand committed jobs to Celery; without a reachable broker setting they wait for the reconciler."""
    from api.broker import install_job_queue as install_celery_queue  # Redis's client: as for caller_for_key
    from core.runtime import ServiceNotRunning

    try:
        install_celery_queue()
    except ServiceNotRunning:
        pass
