"""Load shedding: a bounded number of requests run at once, a bounded queue waits briefly, the rest get 503.

Without a bound every request a client sends takes a worker thread and, soon, waits for a database
connection; past the pool's size they queue inside the server until clients give up, and answers come
back long after anyone wants them. Here a process runs at most ``max_inflight`` requests; up to
``max_queued`` more wait at most ``queue_wait`` seconds for a slot; any other request is answered at once
with 503 and ``Retry-After`` (the request did nothing, so retrying is always safe).

Health probes and metrics bypass the limit: they are cheap, and they must answer while the API is busy.
A plain ASGI middleware (no extra task per request, unlike Starlette's BaseHTTPMiddleware).
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import busy_response

EXEMPT_PATHS = frozenset({"/healthz", "/readyz"})


class LoadShedder:
    def __init__(self, app: ASGIApp, *, max_inflight: int, max_queued: int, queue_wait: float) -> None:
        self.app = app
        self.max_inflight = max(1, max_inflight)
        self.max_queued = max(0, max_queued)
        self.queue_wait = queue_wait
        self._slots: asyncio.Semaphore | None = None
        # Requests admitted or waiting, each counted once from its arrival to its end. (A count of the waiting
        # alone, lowered when a waiter resumes, counted a waiter handed a slot twice until it ran: a request
        # arriving in between found the queue full and got a 503 with fewer requests than the bounds present.)
        self.present = 0
        self.shed = 0

    @property
    def inflight(self) -> int:
        return 0 if self._slots is None else self.max_inflight - self._slots._value

    @property
    def queued(self) -> int:
        return self.present - self.inflight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        if self._slots is None:  # made on the server's event loop, on first use
            # Sync work runs on api.threads' request threads, one for each admitted request and spares.
            self._slots = asyncio.Semaphore(self.max_inflight)
        if self.present >= self.max_inflight + self.max_queued:
            await self._refuse(scope, receive, send)
            return
        self.present += 1
        try:
            if not await self._admit(self._slots):
                await self._refuse(scope, receive, send)
                return
            try:
                await self.app(scope, receive, send)
            finally:
                self._slots.release()
        finally:
            self.present -= 1

    async def _admit(self, slots: asyncio.Semaphore) -> bool:
        if not slots.locked():
            await slots.acquire()  # a free slot: returns without suspending
            return True
        try:
            await asyncio.wait_for(slots.acquire(), timeout=self.queue_wait)
            return True
        except TimeoutError:
            return False

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.shed += 1
        await busy_response("the server is at capacity; retry shortly")(scope, receive, send)
