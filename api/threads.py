"""Where the blocking work of a request runs: this process's request threads, reached by one cheap hop.

Database work blocks, so it never runs on the event loop: every sync route, and the sync steps of async code
(a key not in the cache, an import, a quota event), run on a thread of :func:`request_threads`, entered with
:func:`in_thread`. Routes are declared as plain ``def`` as before: the routers' :class:`Route` hands a sync
endpoint to a request thread itself.

The hop is asyncio's own (the loop's ``run_in_executor``, the caller's context variables carried over, as
``asyncio.to_thread`` does), not anyio's, which FastAPI and Starlette use for sync routes: anyio's cost ~40 us
of CPU per call against ~26 us, a good part of it in some twenty ``asyncio.get_running_loop()`` calls per hop
(cancel scopes, the capacity limiter, sniffio), each a ``getpid()`` system call on Python 3.11.

A caller cancelled while its work runs (a server stopping past its grace period) stops waiting; the thread
finishes the work, as a thread cannot be interrupted.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from fastapi.routing import APIRoute
from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import PARAM_REGEX, Match
from starlette.types import Scope

from api.handlers import plain_app, plain_handler
from api.openapi import operation_id
from core.config import get_settings

P = ParamSpec("P")
T = TypeVar("T")

# Room beyond the admitted requests (api.overload) for what runs besides them: key lookups of requests being
# admitted, the server's own calls.
_SPARE_THREADS = 8
_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def request_threads() -> ThreadPoolExecutor:
    """The process's request threads: one for each request the load shedder admits at once, and spares
    (threads start as they are first needed)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=get_settings().api_inflight + _SPARE_THREADS, thread_name_prefix="engram-request"
            )
        return _executor


async def in_thread(work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``work(*args, **kwargs)`` on a request thread, in a copy of the caller's context (request id, trace)."""
    call = functools.partial(contextvars.copy_context().run, work, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(request_threads(), call)


def on_request_thread(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """A sync endpoint as a coroutine that runs it with :func:`in_thread` (a coroutine is returned as it is).

    FastAPI reads the parameters, their types and the docstring through ``__wrapped__``, so the route is
    described and its arguments resolved exactly as for ``endpoint`` itself."""
    if inspect.iscoroutinefunction(endpoint):
        return endpoint

    @functools.wraps(endpoint)
    async def run(**values: Any) -> Any:
        return await in_thread(endpoint, **values)

    return run


class Route(APIRoute):
    """An API route whose sync endpoint runs on a request thread (every engram router uses it), named in the
    OpenAPI description by :func:`api.openapi.operation_id` whichever router it is declared on.

    The app's router asks each route in turn whether it matches a request; a route whose path cannot (it does
    not begin with the route's text before its first parameter, which the route's anchored pattern requires)
    says no at once, without the pattern, the parameters and the scope bookkeeping of a full match."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        kwargs["generate_unique_id_function"] = operation_id
        super().__init__(path, on_request_thread(endpoint), **kwargs)
        if self._plain is not None:
            self.app = plain_app(self._plain)
        parameter = PARAM_REGEX.search(self.path)
        self._literal_head = self.path if parameter is None else self.path[: parameter.start()]

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """A plain route's handler (api.handlers), else FastAPI's."""
        self._plain = plain_handler(self)
        return super().get_route_handler() if self._plain is None else self._plain  # type: ignore[return-value]

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and not get_route_path(scope).startswith(self._literal_head):
            return Match.NONE, {}
        return super().matches(scope)
