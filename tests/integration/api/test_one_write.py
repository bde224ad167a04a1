"""A response's head goes out with its body in one write (api.serve.onewrite), on a real uvicorn server and socket;
every other response is written as uvicorn writes it, byte for byte."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from api.serve.embedded import free_port
from api.serve.onewrite import OneWriteHttpToolsProtocol


class _Counted:
    """A connection's real transport, counting the calls that each make one send (write, writelines)."""

    def __init__(self, transport: asyncio.Transport, calls: list[int]) -> None:
        self._transport, self._calls = transport, calls

    def write(self, data: bytes) -> None:
        if data:
            self._calls.append(len(data))
        self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        chunks = list(chunks)
        self._calls.append(sum(map(len, chunks)))
        self._transport.writelines(chunks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


_writes: dict[int, list[int]] = {}  # client port -> sizes of the sends on that connection


class _Recording(OneWriteHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        port = transport.get_extra_info("peername")[1]
        _writes[port] = sends = []  # (a new connection: a port used before starts afresh)
        super().connection_made(_Counted(transport, sends))  # type: ignore[arg-type]


async def _fixed(request: Request) -> Response:
    return PlainTextResponse("the depot closes at six")


async def _empty(request: Request) -> Response:
    return Response(status_code=204)


async def _stream(request: Request) -> Response:
    async def chunks():  # type: ignore[no-untyped-def]
        yield b"first,"
        yield b"second"

    return StreamingResponse(chunks(), media_type="text/plain")


async def _echo(request: Request) -> Response:
    return PlainTextResponse((await request.body()).decode())


class _FailsMidway:
    """An ASGI app (Starlette routes an instance to it as is) that fails after starting its response."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
        raise RuntimeError("the app fails after starting its response")


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    app = Starlette(
        routes=[
            Route("/fixed", _fixed, methods=["GET", "HEAD"]),
            Route("/empty", _empty),
            Route("/stream", _stream),
            Route("/echo", _echo, methods=["POST"]),
            Route("/fails", _FailsMidway()),
        ]
    )
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=_Recording, lifespan="off", log_level="critical")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not running.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert running.started
    yield port
    running.should_exit = True
    thread.join(timeout=10)


def _exchange(port: int, request: bytes, *, expect: bytes | None = None) -> tuple[bytes, list[int]]:
    """Everything the server sent on a new connection for ``request`` until it went quiet or closed, and the
    sizes of its sends."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        if expect is not None:  # a request whose body waits for 100 Continue
            head, body = request.split(b"\r\n\r\n", 1)
            connection.sendall(head + b"\r\n\r\n")
            assert connection.recv(1024) == expect
            connection.sendall(body)
        else:
            connection.sendall(request)
        connection.settimeout(0.5)
        received = b""
        while True:
            try:
                chunk = connection.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
        return received, _writes.get(connection.getsockname()[1], [])


def test_a_response_of_known_length_is_one_send(server: int) -> None:
    received, sends = _exchange(server, b"GET /fixed HTTP/1.1\r\nhost: x\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 23\r\n" in received
    assert received.endswith(b"\r\n\r\nthe depot closes at six")
    assert sends == [len(received)]


def test_a_head_request_an_empty_and_a_streamed_response_are_written_as_uvicorn_writes_them(server: int) -> None:
    received, sends = _exchange(server, b"HEAD /fixed HTTP/1.1\r\nhost: x\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"\r\n\r\n")
    assert b"content-length: 23\r\n" in received and sends == [len(received)]

    received, sends = _exchange(server, b"GET /empty HTTP/1.1\r\nhost: x\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 204 No Content\r\n") and sends == [len(received)]

    received, sends = _exchange(server, b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
    assert b"transfer-encoding: chunked\r\n" in received
    assert received.endswith(b"\r\n\r\n6\r\nfirst,\r\n6\r\nsecond\r\n0\r\n\r\n")
    assert len(sends) >= 2 and sum(sends) == len(received)  # the head, then the chunks as they come


def test_a_100_continue_goes_first_and_the_answer_in_one_send(server: int) -> None:
    request = b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\nhello"
    received, sends = _exchange(server, request, expect=b"HTTP/1.1 100 Continue\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"\r\n\r\nhello")
    assert sends == [25, len(received)]


def test_a_head_held_for_a_body_that_never_comes_goes_out_before_the_close(server: int) -> None:
    received, sends = _exchange(server, b"GET /fails HTTP/1.1\r\nhost: x\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 100\r\n" in received
    assert received.endswith(b"\r\n\r\n")  # the head alone, then the connection closed
    assert sends == [len(received)]


def test_keep_alive_requests_each_get_one_send(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server)) as connection:
        port = connection.getsockname()[1]
        for _ in range(3):
            connection.sendall(b"GET /fixed HTTP/1.1\r\nhost: x\r\n\r\n")
            received = b""
            while not received.endswith(b"six"):
                received += connection.recv(65536)
        assert len(_writes[port]) == 3
