"""`engram mcp`: the MCP server over stdio for one agent, authenticated by ENGRAM_API_KEY.

Two ways to reach the memories: directly on the storage of the configured home or database (the agent
runs beside `engram serve`), or with ``--url`` through a remote engram's REST API (a laptop agent using a
hosted engram). The tools and their answers are the same.
"""

# Imports inside functions are deferred: `engram mcp` is a CLI command (see api.cli), and it loads the
# in-process app or the HTTP client only for the mode it runs in.
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import anyio
from mcp.server.fastmcp import Context

from api.mcp.tools import MemoryClient


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


def _api_key(api_key: str | None) -> str:
    key = (api_key or os.environ.get("ENGRAM_API_KEY", "")).strip()
    if not key:
        raise McpStartupError("set ENGRAM_API_KEY (or --api-key) to the API key this MCP server acts for")
    return key


def run_stdio(*, agent_id: str | None, persona: str | None) -> None:
    """Serve MCP on stdin/stdout against the storage directly, until the client closes the stream."""
    from api.cli.database import database_session_for_cli
    from api.client.base import EngramAPIError
    from api.client.local import LocalEngramClient
    from core.runtime import ServiceNotRunning

    api_key = _api_key(None)
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


def run_remote_stdio(*, url: str, api_key: str | None, agent_id: str | None, persona: str | None) -> None:
    """Serve MCP on stdin/stdout by calling the REST API of the engram at ``url``.

    The key is checked once before serving (a cheap authenticated read), so a wrong key or an unreachable
    URL stops the command with a clear message instead of failing every later tool call.
    """
    import httpx

    from api.client.base import EngramAPIError
    from api.client.sync import EngramClient

    client = EngramClient(base_url=url, api_key=_api_key(api_key), agent_id=agent_id, persona=persona)
    try:
        client.list_memories(limit=1)
    except EngramAPIError as exc:
        client.close()
        if exc.status in (401, 403):
            raise McpStartupError(f"ENGRAM_API_KEY was refused by {url}: {exc.message}") from None
        raise McpStartupError(f"{url} answered {exc.status} {exc.code}: {exc.message}") from None
    except httpx.HTTPError as exc:
        client.close()
        raise McpStartupError(f"cannot reach engram at {url}: {exc}") from None
    with client:
        _serve(client)


def _serve(client: MemoryClient) -> None:
    from api.mcp import build_server

    async def client_for(ctx: Context) -> MemoryClient:
        return client

    anyio.run(build_server(client_for).run_stdio_async)
