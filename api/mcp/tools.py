"""The MCP tools: one per agent-facing memory and catalog call, each a thin adapter to the local client.

A tool gathers the arguments the agent gave, hands them to an :class:`api.client.EngramClient` (local mode:
the REST routes of this process, see :mod:`api.client.local`) in a worker thread, and answers
the result as structured content plus its JSON text. A refused call answers ``isError`` with the REST
error object ``{"error": {"code", "message", "field"}}``, so an agent reads the same message it would
over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Literal

import anyio
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from api.client.base import EngramAPIError, dump
from api.client.sync import EngramClient
from api.mcp import descriptions as text
from core.memories.schemas import MemoryCategory, MemoryKind, RelationType

# Resolves the client of the agent behind one tool call (stdio: fixed; HTTP: from the request's key).
ClientFor = Callable[[Context], Awaitable[EngramClient]]

Id = Annotated[str, Field(description="The memory id, e.g. '42' or 'kb.policy.42'.")]
AgentId = Annotated[str | None, Field(description="Your agent id; memories you save carry it (optional).")]
Persona = Annotated[str | None, Field(description="The persona you act under (optional).")]
Tags = Annotated[list[str] | None, Field(description="Free-form labels for filtering, e.g. ['customer'].")]
LinkedEntities = Annotated[
    list[str] | dict[str, Any] | None,
    Field(
        description="Catalog entities the memory is about ('shop.orders.amount', 'memory:<id>'), or an inline "
        "query dict (source_model, dimensions, measures, filters) that is stored with the memory."
    ),
]


class AssociationArg(BaseModel):
    target_id: str = Field(description="The id of the memory this one relates to.")
    relation_type: RelationType = "related_to"
    weight: float = Field(default=0.5, ge=0.0, le=1.0)


# Names in a tool's locals() that are not arguments to forward (free variables show up there too).
_NOT_FIELDS = frozenset({"ctx", "client_for"})


def _given(values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, list):
            value = [v.model_dump() if isinstance(v, BaseModel) else v for v in value]
        out[key] = value
    return out


def _result(value: Any) -> CallToolResult:
    data = dump(value)
    structured = data if isinstance(data, dict) else {"result": data}
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False, indent=1))],
        structuredContent=structured,
    )


def error_result(exc: EngramAPIError) -> CallToolResult:
    body = {"error": {**exc.error, "status": exc.status}}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body, ensure_ascii=False))], isError=True)


async def _run(client_for: ClientFor, ctx: Context, call: Callable[[EngramClient], Any]) -> CallToolResult:
    try:
        client = await client_for(ctx)
        # Core services are synchronous database work: keep them off the event loop.
        return _result(await anyio.to_thread.run_sync(call, client))
    except EngramAPIError as exc:
        return error_result(exc)


def register_tools(server: FastMCP, client_for: ClientFor) -> None:
    """Add the nine engram tools to ``server``."""
    read_only = ToolAnnotations(readOnlyHint=True, destructiveHint=False, openWorldHint=False)
    writes = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=False)

    @server.tool(description=text.SAVE_MEMORY, annotations=writes)
    async def save_memory(
        ctx: Context,
        content: Annotated[str, Field(description="The memory itself: concise, complete, at most 50,000 bytes.")],
        linked_entities: LinkedEntities = None,
        id: Annotated[str | None, Field(description="A stable id to upsert; omit for the next integer id.")] = None,
        kind: MemoryKind | None = None,
        category: MemoryCategory | None = None,
        importance: Annotated[float | None, Field(ge=0.0, le=1.0, description="0..1; default by kind.")] = None,
        tags: Tags = None,
        occurred_at: Annotated[datetime | None, Field(description="When it happened (ISO 8601).")] = None,
        source: Annotated[str | None, Field(description="Where it came from, e.g. 'user stated'.")] = None,
        run_id: Annotated[str | None, Field(description="The run it belongs to (conversation memories).")] = None,
        associations: Annotated[list[AssociationArg] | None, Field(description="Links to other memories.")] = None,
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        fields = _given({k: v for k, v in locals().items() if k not in _NOT_FIELDS})
        return await _run(client_for, ctx, lambda c: c.save_memory(**fields))

    @server.tool(description=text.GET_MEMORY, annotations=read_only)
    async def get_memory(ctx: Context, id: Id, agent_id: AgentId = None, persona: Persona = None) -> CallToolResult:
        return await _run(client_for, ctx, lambda c: c.get_memory(id, agent_id=agent_id, persona=persona))

    @server.tool(description=text.UPDATE_MEMORY, annotations=writes)
    async def update_memory(
        ctx: Context,
        id: Id,
        content: Annotated[str | None, Field(description="The new text.")] = None,
        kind: MemoryKind | None = None,
        category: MemoryCategory | None = None,
        tags: Tags = None,
        importance: Annotated[float | None, Field(ge=0.0, le=1.0)] = None,
        linked_entities: LinkedEntities = None,
        associations: Annotated[list[AssociationArg] | None, Field(description="Replaces the links.")] = None,
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        fields = _given({k: v for k, v in locals().items() if k not in _NOT_FIELDS | {"id", "agent_id", "persona"}})
        return await _run(client_for, ctx, lambda c: c.patch_memory(id, agent_id=agent_id, persona=persona, **fields))

    @server.tool(description=text.FORGET_MEMORY, annotations=writes)
    async def forget_memory(
        ctx: Context,
        id: Id,
        reason: Annotated[str | None, Field(description="Why, for the audit trail.")] = None,
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        return await _run(
            client_for, ctx, lambda c: c.forget_memory(id, reason=reason, agent_id=agent_id, persona=persona)
        )

    @server.tool(description=text.LIST_MEMORIES, annotations=read_only)
    async def list_memories(
        ctx: Context,
        kind: MemoryKind | None = None,
        category: MemoryCategory | None = None,
        tags: Annotated[list[str] | None, Field(description="Only memories carrying all of these tags.")] = None,
        run_id: str | None = None,
        status: Literal["active", "stale", "forgotten"] | None = None,
        since: Annotated[datetime | None, Field(description="Only memories recorded at or after this.")] = None,
        entity: Annotated[str | None, Field(description="Only memories linked to this entity.")] = None,
        sort: Literal["recent", "importance", "most_accessed"] | None = None,
        limit: Annotated[int | None, Field(ge=1, le=200, description="Page size (default 50).")] = None,
        cursor: Annotated[str | None, Field(description="next_cursor of the previous page.")] = None,
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        fields = _given({k: v for k, v in locals().items() if k not in _NOT_FIELDS | {"agent_id", "persona"}})
        return await _run(client_for, ctx, lambda c: c.list_memories(agent_id=agent_id, persona=persona, **fields))

    @server.tool(description=text.SEARCH, annotations=read_only)
    async def search(
        ctx: Context,
        question: Annotated[str | None, Field(description="Natural-language question or keywords.")] = None,
        entities: Annotated[list[str] | None, Field(description="Entities you are working with.")] = None,
        query: Annotated[dict[str, Any] | None, Field(description="Your draft query (source_model, ...).")] = None,
        datasource: Annotated[str | None, Field(description="Only this datasource's entities.")] = None,
        mode: Literal["hybrid", "recent", "important", "typed"] | None = None,
        kind: MemoryKind | None = None,
        category: MemoryCategory | None = None,
        max_memories: Annotated[int | None, Field(ge=0, le=100)] = None,
        max_example_queries: Annotated[int | None, Field(ge=0, le=100)] = None,
        max_entities: Annotated[int | None, Field(ge=0, le=100)] = None,
        occurred_after: datetime | None = None,
        occurred_before: datetime | None = None,
        include_stale: bool | None = None,
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        fields = _given({k: v for k, v in locals().items() if k not in _NOT_FIELDS})
        return await _run(client_for, ctx, lambda c: c.search(**fields))

    @server.tool(description=text.HYDRATE, annotations=read_only)
    async def hydrate(
        ctx: Context,
        budget_bytes: Annotated[int, Field(ge=0, description="How many bytes of memory text you can take in.")],
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        return await _run(
            client_for, ctx, lambda c: c.hydrate(budget_bytes=budget_bytes, agent_id=agent_id, persona=persona)
        )

    @server.tool(description=text.INSPECT_MODEL, annotations=read_only)
    async def inspect_model(
        ctx: Context,
        datasource: Annotated[str, Field(description="The datasource name, e.g. 'shop'.")],
        model: Annotated[str, Field(description="The model (table) name, e.g. 'orders'.")],
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        return await _run(
            client_for, ctx, lambda c: c.inspect_model(datasource, model, agent_id=agent_id, persona=persona)
        )

    @server.tool(description=text.INGEST_DATASOURCE, annotations=writes)
    async def ingest_datasource(
        ctx: Context, datasource: Annotated[str, Field(description="The datasource name, e.g. 'shop'.")]
    ) -> CallToolResult:
        return await _run(client_for, ctx, lambda c: c.ingest_datasource(datasource))
