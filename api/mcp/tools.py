"""The MCP tools: one per agent-facing memory and catalog call, each a thin adapter to an engram client.

A tool gathers the arguments the agent gave and hands them, in a worker thread, to either
:class:`api.client.local.LocalEngramClient` (the REST routes themselves, run in-process) or
:class:`api.client.sync.EngramClient` (a remote engram's REST API); both have the same methods and results.
The result is answered as structured content plus its JSON text. A refused call answers ``isError`` with
the REST error object ``{"error": {"code", "message", "field"?}}``, so an agent reads the same message it
would over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Literal

import anyio
import httpx
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from api.client.base import EngramAPIError, dump
from api.client.local import LocalEngramClient
from api.client.sync import EngramClient
from api.mcp import descriptions as text
from core.memories.schemas import MemoryCategory, MemoryKind, RelationType

MemoryClient = LocalEngramClient | EngramClient
# Resolves the client of the agent behind one tool call (stdio: fixed; HTTP: from the request's key).
ClientFor = Callable[[Context], Awaitable[MemoryClient]]

Id = Annotated[str, Field(description="The memory id, e.g. '42'.")]
AgentId = Annotated[str | None, Field(description="Your agent id; saves carry it.")]
Persona = Annotated[str | None, Field(description="The persona you act under.")]
Tags = Annotated[list[str] | None, Field(description="Labels, e.g. ['customer'].")]
Kind = Annotated[MemoryKind | None, Field(description="What sort of memory (see the tool description).")]
Category = Annotated[MemoryCategory | None, Field(description="Lifetime and sharing (see the tool description).")]
When = Annotated[datetime | None, Field(description="ISO 8601 time.")]
Cap = Annotated[int | None, Field(ge=0, le=100, description="At most this many (default 5, 2, 5).")]
LinkedEntities = Annotated[
    list[str] | dict[str, Any] | None,
    Field(description="Entities it is about ('shop.orders.amount', 'memory:<id>') or an inline query dict."),
]


class AssociationArg(BaseModel):
    target_id: str = Field(description="The related memory's id.")
    relation_type: RelationType = Field(default="related_to", description="How they relate.")
    weight: float = Field(default=0.5, ge=0.0, le=1.0, description="Strength 0..1.")


Associations = Annotated[list[AssociationArg] | None, Field(description="Links to other memories.")]

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


def validation_error_result(exc: ValidationError) -> CallToolResult:
    """A tool argument the schema refuses, as the REST API's 422 naming the field."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    return error_result(EngramAPIError(422, "validation_error", first["msg"], field))


async def _run(client_for: ClientFor, ctx: Context, call: Callable[[MemoryClient], Any]) -> CallToolResult:
    try:
        client = await client_for(ctx)
        # Local calls are synchronous database work, remote ones blocking HTTP: keep both off the event loop.
        return _result(await anyio.to_thread.run_sync(call, client))
    except EngramAPIError as exc:
        return error_result(exc)
    except httpx.HTTPError as exc:
        return error_result(EngramAPIError(503, "unavailable", f"engram is unreachable ({exc}); retry shortly"))


def register_tools(server: FastMCP, client_for: ClientFor) -> None:
    """Add the nine engram tools to ``server``."""
    read_only = ToolAnnotations(readOnlyHint=True, destructiveHint=False, openWorldHint=False)
    writes = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=False)
    # Forgetting removes a memory from every read (purge deletes it); ingest re-reflects a schema and drops
    # models that vanished: both lose data an agent cannot get back through these tools.
    destroys = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False)

    @server.tool(description=text.SAVE_MEMORY, annotations=writes)
    async def save_memory(
        ctx: Context,
        content: Annotated[str | None, Field(description="The memory: concise, complete, <= 50,000 bytes.")] = None,
        learning: Annotated[str | None, Field(description="Alias of content.")] = None,
        linked_entities: LinkedEntities = None,
        id: Annotated[str | None, Field(description="A stable id to upsert; omit for the next integer id.")] = None,
        kind: Kind = None,
        category: Category = None,
        importance: Annotated[float | None, Field(ge=0.0, le=1.0, description="0..1; default by kind.")] = None,
        tags: Tags = None,
        occurred_at: Annotated[datetime | None, Field(description="When it happened (ISO 8601).")] = None,
        source: Annotated[str | None, Field(description="Where it came from, e.g. 'user stated'.")] = None,
        run_id: Annotated[str | None, Field(description="The run it belongs to.")] = None,
        associations: Associations = None,
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
        kind: Kind = None,
        category: Category = None,
        tags: Tags = None,
        importance: Annotated[float | None, Field(ge=0.0, le=1.0, description="0..1.")] = None,
        linked_entities: LinkedEntities = None,
        associations: Associations = None,
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        fields = _given({k: v for k, v in locals().items() if k not in _NOT_FIELDS | {"id", "agent_id", "persona"}})
        return await _run(client_for, ctx, lambda c: c.patch_memory(id, agent_id=agent_id, persona=persona, **fields))

    @server.tool(description=text.FORGET_MEMORY, annotations=destroys)
    async def forget_memory(
        ctx: Context,
        id: Id,
        reason: Annotated[str | None, Field(description="Why, for the audit trail.")] = None,
        purge: Annotated[bool, Field(description="Delete it for good instead (owner or admin).")] = False,
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        return await _run(
            client_for,
            ctx,
            lambda c: c.forget_memory(id, reason=reason, purge=purge, agent_id=agent_id, persona=persona),
        )

    @server.tool(description=text.LIST_MEMORIES, annotations=read_only)
    async def list_memories(
        ctx: Context,
        kind: Kind = None,
        category: Category = None,
        tags: Annotated[list[str] | None, Field(description="Only memories carrying all of these.")] = None,
        run_id: Annotated[str | None, Field(description="Only this run's memories.")] = None,
        status: Annotated[
            Literal["active", "stale", "forgotten"] | None, Field(description="Default active.")
        ] = None,
        since: Annotated[datetime | None, Field(description="Recorded at or after this.")] = None,
        entity: Annotated[str | None, Field(description="Linked to this entity.")] = None,
        sort: Annotated[
            Literal["recent", "importance", "most_accessed"] | None, Field(description="Default recent.")
        ] = None,
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
        mode: Annotated[
            Literal["hybrid", "recent", "important", "typed"] | None, Field(description="Default hybrid.")
        ] = None,
        kind: Kind = None,
        category: Category = None,
        tags: Annotated[list[str] | None, Field(description="Memories carrying any of these.")] = None,
        max_memories: Cap = None,
        max_example_queries: Cap = None,
        max_entities: Cap = None,
        occurred_after: When = None,
        occurred_before: When = None,
        include_stale: Annotated[bool | None, Field(description="Also stale memories.")] = None,
        min_score: Annotated[float | None, Field(ge=0.0, le=1.0, description="Drop hits scoring less.")] = None,
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        fields = _given({k: v for k, v in locals().items() if k not in _NOT_FIELDS})
        return await _run(client_for, ctx, lambda c: c.search(**fields))

    @server.tool(description=text.HYDRATE, annotations=read_only)
    async def hydrate(
        ctx: Context,
        budget_bytes: Annotated[int, Field(ge=0, description="Bytes of memory text you can take in.")],
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        return await _run(
            client_for, ctx, lambda c: c.hydrate(budget_bytes=budget_bytes, agent_id=agent_id, persona=persona)
        )

    @server.tool(description=text.INSPECT_MODEL, annotations=read_only)
    async def inspect_model(
        ctx: Context,
        datasource: Annotated[str, Field(description="The datasource, e.g. 'shop'.")],
        model: Annotated[str, Field(description="The model (table), e.g. 'orders'.")],
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        return await _run(
            client_for, ctx, lambda c: c.inspect_model(datasource, model, agent_id=agent_id, persona=persona)
        )

    @server.tool(description=text.INGEST_DATASOURCE, annotations=destroys)
    async def ingest_datasource(
        ctx: Context, datasource: Annotated[str, Field(description="The datasource, e.g. 'shop'.")]
    ) -> CallToolResult:
        return await _run(client_for, ctx, lambda c: c.ingest_datasource(datasource))
