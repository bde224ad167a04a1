"""engram as an MCP server (official ``mcp`` SDK): over stdio (`engram mcp`) and streamable HTTP (``/mcp``).

Every transport serves the same tools (:mod:`api.mcp.tools`); they differ only in how a tool call finds
its client. Over stdio the process serves the one key in ``ENGRAM_API_KEY``, either against the storage
directly or, with ``--url``, through a remote engram's REST API; over HTTP each request carries
``Authorization: Bearer <api_key>`` like any /v1 call.
"""

from __future__ import annotations

from typing import Any

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import CallToolResult, ContentBlock, Tool
from pydantic import ValidationError

from api.mcp.schema import compact_schema
from api.mcp.tools import ClientFor, register_tools, validation_error_result, with_memory_id
from core import __version__

INSTRUCTIONS = (
    "engram is your long-term memory. At the start of a run call hydrate; before planning a query or "
    "answering from memory call search; when you learn something a later run needs, call save_memory; "
    "correct with update_memory, remove with forget_memory."
)


class EngramMCP(FastMCP):
    """FastMCP with lean tool schemas, whose argument errors answer in the REST error shape instead of
    pydantic's text."""

    async def list_tools(self) -> list[Tool]:
        tools = await super().list_tools()
        return [tool.model_copy(update={"inputSchema": compact_schema(tool.inputSchema)}) for tool in tools]

    async def call_tool(  # type: ignore[override]
        self, name: str, arguments: dict[str, Any]
    ) -> CallToolResult | list[ContentBlock] | dict[str, Any]:
        try:
            return await super().call_tool(name, with_memory_id(name, arguments))  # type: ignore[return-value]
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                return validation_error_result(exc.__cause__)
            raise


def build_server(client_for: ClientFor) -> FastMCP:
    server = EngramMCP(name="engram", instructions=INSTRUCTIONS, log_level="WARNING")
    # serverInfo names engram's own version, not the MCP SDK's.
    server._mcp_server.version = __version__
    register_tools(server, client_for)
    return server
