"""Shut the API down without resetting a single connection.

uvicorn's own shutdown closes every idle keep-alive connection at once, and closes the listening socket with
connections the kernel had already completed still in its backlog. A client that sent its next request on
such a connection a few milliseconds before (the request was in flight, or unread in the server's buffer)
gets ``Connection reset by peer``: neither an answer nor a clean refusal. Here, on SIGTERM:

1. the listening sockets stop taking connections, but the ones the kernel already completed are accepted and
   served rather than reset;
2. for ``drain_seconds`` every connection stays open: a request already received, or arriving on a
   keep-alive connection, is answered as usual, with ``Connection: close``, after which the connection
   closes cleanly (the client knows not to reuse it);
3. only then are connections still idle closed (a client idle that long has let its pool expire them:
   httpx keeps an idle connection 5 s), running requests are awaited, and the app's lifespan ends.

The keep-alive timeout in steady state is long for the same reason: the side that closes an idle connection
must be the client, or the client's next request can cross the server's close.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.server import STARTUP_FAILURE


class CloseWhenDraining:
    """Once the server drains, every response says ``Connection: close`` (uvicorn then closes after it)."""

    def __init__(self, app: ASGIApp, *, server: DrainingServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.server.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, drain_seconds: float) -> None:
        super().__init__(config)
        self.drain_seconds = drain_seconds
        self.draining = False

    async def _serve(self, sockets: list[socket.socket] | None = None) -> None:
        if not self.config.loaded:
            self.config.load()
        self.config.loaded_app = CloseWhenDraining(self.config.loaded_app, server=self)
        await super()._serve(sockets)

    def _new_protocol(self) -> asyncio.Protocol:
        return self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )

    async def _accept_backlog(self) -> None:
        """Stop listening, serving the connections the kernel completed but no one accepted yet.

        Closing a listening socket resets those; a duplicate of it keeps the socket open while they are
        taken, so only a connection completing in the microseconds after the last ``accept`` is lost."""
        listeners = []
        for server in self.servers:
            for listening in server.sockets:
                listeners.append(socket.socket(fileno=os.dup(listening.fileno())))
            server.close()
        loop = asyncio.get_running_loop()
        for listener in listeners:
            listener.setblocking(False)
            try:
                while True:
                    try:
                        connection, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    connection.setblocking(False)
                    await loop.connect_accepted_socket(self._new_protocol, connection)
            finally:
                listener.close()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.draining = True
        for sock in sockets or []:
            sock.close()
        with contextlib.suppress(OSError):
            await self._accept_backlog()
        deadline = time.monotonic() + self.drain_seconds
        while self.server_state.connections and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        # What is left: idle connections (closed now) and requests still running (closed after them).
        await super().shutdown(sockets=None)


def run_api(app: str, *, drain_seconds: float, **options: Any) -> None:
    """``uvicorn.run`` for one process, with the draining shutdown above."""
    config = uvicorn.Config(app, **options)
    server = DrainingServer(config, drain_seconds=drain_seconds)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:  # as uvicorn.run: the port could not be bound, or the app failed to start
        sys.exit(STARTUP_FAILURE)
