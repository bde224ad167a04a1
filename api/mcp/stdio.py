"""`engram mcp`: the MCP server over stdio for one agent, authenticated by ENGRAM_API_KEY.

Two ways to reach the memories: directly on the storage of the configured home or database (the agent
runs beside `engram serve`), or with ``--url`` through a remote engram's REST API (a laptop agent using a
hosted engram). The tools and their answers are the same.
"""

# create_app is imported on use: `engram mcp` (a CLI command, see api.cli) builds the app only when it
# answers from this process.
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
from engram_client import AsyncEngramClient, EngramClient, EngramConnectionError, EngramError
from mcp.server.fastmcp import Context

from api.cli.database import database_session_for_cli
from api.mcp import build_server
from api.sdk import app_client, check_key, install_job_queue
from core.runtime import ServiceNotRunning


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
    """Serve MCP on stdin/stdout against the storage directly, until the client closes the stream: the
    tools call engram's app built in this process (its routes, on the stdio server's event loop)."""
    from api.app import create_app  # builds every route: only for this command, not for importing the CLI

    api_key = _api_key(None)
    with contextlib.ExitStack() as stack:
        with _stdout_to_stderr():
            try:
                stack.enter_context(database_session_for_cli())
                check_key(api_key)
                install_job_queue()
                app = create_app()
            except EngramError as exc:
                raise McpStartupError(f"ENGRAM_API_KEY was refused: {exc.message}") from None
            except ServiceNotRunning as exc:
                raise McpStartupError(str(exc)) from None
        _serve(lambda: app_client(app, api_key=api_key, agent_id=agent_id, persona=persona))


def run_remote_stdio(*, url: str, api_key: str | None, agent_id: str | None, persona: str | None) -> None:
    """Serve MCP on stdin/stdout by calling the REST API of the engram at ``url``.

    The key is checked once before serving (a cheap authenticated read), so a wrong key or an unreachable
    URL stops the command with a clear message instead of failing every later tool call.
    """
    key = _api_key(api_key)
    with EngramClient(url, api_key=key, max_retries=0) as probe:
        try:
            probe.list_memories(limit=1)
        except EngramConnectionError as exc:
            raise McpStartupError(exc.message) from None
        except EngramError as exc:
            if exc.status in (401, 403):
                raise McpStartupError(f"ENGRAM_API_KEY was refused by {url}: {exc.message}") from None
            raise McpStartupError(f"{url} answered {exc.status} {exc.code}: {exc.message}") from None
    _serve(lambda: AsyncEngramClient(url, api_key=key, agent_id=agent_id, persona=persona))


def _serve(make_client: Callable[[], AsyncEngramClient]) -> None:
    """Serve the tools with one client for the life of the stdio session (made on the server's loop)."""

    async def main() -> None:
        async with make_client() as client:

            @contextlib.asynccontextmanager
            async def client_for(ctx: Context) -> AsyncIterator[AsyncEngramClient]:
                yield client

            await build_server(client_for).run_stdio_async()

    anyio.run(main)
