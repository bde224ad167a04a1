"""A response in one write: uvicorn's httptools protocol with a response's head sent together with its body.

uvicorn writes a response's status line and headers when the app sends ``http.response.start``, and its body
when the app sends it: two writes, so two ``send`` system calls, two segments on a TCP_NODELAY socket and two
wakeups of the client, for a body that follows the head at once. Under the load mix (py-spy ``--gil``,
2026-11-28) the head's write was the largest single self-time of the API's event loop: the thread holding
the GIL is descheduled in the system call as the woken peer takes the core. Here a head whose body of known
length follows (a ``Content-Length`` above zero, not a ``HEAD`` request) is held until the body's first write
and goes out with it in one ``writelines`` (one ``writev``). A chunked or empty response, a ``100 Continue``,
and anything written after the head are written as uvicorn writes them; a held head still goes out if the
connection is closed first (an app that fails after starting its response).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle


class _HeadHeld:
    """The connection's transport as one request cycle sees it (every attribute but ``write`` and ``close`` is
    the transport's own)."""

    __slots__ = ("_transport", "_cycle", "_head_seen", "_held")

    def __init__(self, transport: asyncio.Transport, cycle: RequestResponseCycle) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head_seen = False
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))
            return
        cycle = self._cycle
        if not self._head_seen and cycle.response_started:
            self._head_seen = True  # (a 100 Continue goes before the response starts)
            if cycle.chunked_encoding is False and cycle.expected_content_length > 0:
                if cycle.scope["method"] != "HEAD":
                    self._held = data
                    return
        self._transport.write(data)

    def close(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (``uvicorn.Config(http=...)``), each request cycle writing through
    :class:`_HeadHeld`."""

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        # (A new cycle's task has been created, not run: nothing was written through it yet. An upgrade made
        # none.)
        if cycle is not None and cycle is not before:
            cycle.transport = _HeadHeld(self.transport, cycle)  # type: ignore[assignment]
