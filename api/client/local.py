"""Local mode: :class:`api.client.EngramClient` with its requests served by engram's own ASGI app in this
process instead of over the network.

Every call goes through the very routes a server runs (same validation, authentication, core calls,
answers and error JSON), so local mode cannot drift from REST: there is no second implementation. The
app runs on one event loop in a daemon thread per process; a request is handed to it and the caller
waits for the answer, so the client is synchronous and usable from any thread (the MCP tools call it
from worker threads). The database is the configured one (``ENGRAM_DATABASE_URL``, else the running
`engram serve` of ``ENGRAM_HOME``); committed jobs go to Celery when a broker is reachable, else they
wait for the reconciler, as any write does while Redis is down.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx

from api.client.base import as_api_errors
from api.client.sync import EngramClient

T = TypeVar("T")
LOCAL_URL = "http://engram.local"


class _AppLoop:
    """engram's app and the event loop it runs on, once per process (rebuilt in a forked child)."""

    _lock = threading.Lock()
    _current: _AppLoop | None = None

    def __init__(self) -> None:
        from api.app import create_app

        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        # raise_app_exceptions=False: an unexpected error is the app's 500 JSON, as a real server answers.
        self.asgi = httpx.ASGITransport(app=create_app(), raise_app_exceptions=False)
        # A daemon thread, so a script that never closes its client still exits.
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

    def __init__(self, *, request_id: str | None = None) -> None:
        self._request_id = request_id

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        # A call made while serving another request (an MCP tool call over /mcp) carries that request's id,
        # so its log lines and audit entries name the request the agent made.
        from core.logging import current_request_id

        outer = self._request_id or current_request_id()
        if outer and "x-request-id" not in request.headers:
            request.headers["X-Request-ID"] = outer
        app_loop = _AppLoop.get()
        return app_loop.run(self._answer(app_loop.asgi, request))

    @staticmethod
    async def _answer(asgi: httpx.ASGITransport, request: httpx.Request) -> httpx.Response:
        response = await asgi.handle_async_request(request)
        content = await response.aread()
        return httpx.Response(response.status_code, headers=response.headers, content=content)


class LocalEngramClient(EngramClient):
    """In-process client for one API key; ``agent_id`` / ``persona`` as in :class:`api.client.EngramClient`."""

    @as_api_errors
    def __init__(
        self,
        *,
        api_key: str,
        agent_id: str | None = None,
        persona: str | None = None,
        install_queue: bool = True,
        request_id: str | None = None,
    ):
        from api.auth import caller_for_key

        caller_for_key(api_key)  # a wrong key fails here (401), not at the first call
        super().__init__(
            base_url=LOCAL_URL,
            api_key=api_key,
            agent_id=agent_id,
            persona=persona,
            transport=InProcessTransport(request_id=request_id),
        )
        if install_queue:
            _install_queue()

    def __enter__(self) -> LocalEngramClient:
        return self


def _install_queue() -> None:
    """Hand committed jobs to Celery; without a reachable broker setting they wait for the reconciler."""
    from core.runtime import ServiceNotRunning

    try:
        from api.broker import install_job_queue

        install_job_queue()
    except ServiceNotRunning:
        pass
