"""`engram mcp`: the MCP server over stdio for one agent, authenticated by ENGRAM_API_KEY."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import anyio
from mcp.server.fastmcp import Context

from api.client.local import LocalEngramClient


class McpStartupError(RuntimeError):
    """The server cannot start (no key, a wrong key, no database); the message says what to do."""


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr while storage starts: stdout carries the protocol, and a child
    process started now (embedded PostgreSQL) would otherwise inherit it."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run_stdio(*, agent_id: str | None, persona: str | None) -> None:
    """Serve MCP on stdin/stdout until the client closes the stream."""
    from api.client.base import EngramAPIError
    from core.runtime import ServiceNotRunning, database_session_for_cli

    api_key = os.environ.get("ENGRAM_API_KEY", "").strip()
    if not api_key:
        raise McpStartupError("set ENGRAM_API_KEY to the API key this MCP server acts for")
    with contextlib.ExitStack() as stack:
        with _stdout_to_stderr():
            try:
                stack.enter_context(database_session_for_cli())
                client = LocalEngramClient(api_key=api_key, agent_id=agent_id, persona=persona)
            except EngramAPIError as exc:
                raise McpStartupError(f"ENGRAM_API_KEY was refused: {exc.message}") from None
            except ServiceNotRunning as exc:
                raise McpStartupError(str(exc)) from None
        _serve(client)


def _serve(client: LocalEngramClient) -> None:
    from api.mcp import build_server

    async def client_for(ctx: Context) -> LocalEngramClient:
        return client

    anyio.run(build_server(client_for).run_stdio_async)
