"""engram as an MCP server (official ``mcp`` SDK): over stdio (`engram mcp`) and streamable HTTP (``/mcp``).

Both transports serve the same tools (:mod:`api.mcp.tools`) over the same storage; they differ only in
how a tool call finds its caller. Over stdio the process serves the one key in ``ENGRAM_API_KEY``; over
HTTP each request carries ``Authorization: Bearer <api_key>`` like any /v1 call.
"""

from __future__ import annotations

from mcp.server.fastmcp import FastMCP

from api.mcp.tools import ClientFor, register_tools

INSTRUCTIONS = (
    "engram is your long-term memory. At the start of a run call hydrate; before planning a query or "
    "answering from memory call search; when you learn something a later run needs, call save_memory; "
    "correct with update_memory, remove with forget_memory."
)


def build_server(client_for: ClientFor) -> FastMCP:
    server: FastMCP = FastMCP(name="engram", instructions=INSTRUCTIONS, log_level="WARNING")
    register_tools(server, client_for)
    return server
