"""The MCP tools: one per agent-facing memory and catalog call, each a thin adapter to engram's Python SDK.

A tool gathers the arguments the agent gave and awaits the matching call of an
:class:`engram_client.AsyncEngramClient`: bound to the app serving ``/mcp`` (over HTTP), to an app in this
process (``engram mcp``) or to a remote engram (``engram mcp --url``); the calls and results are the same.
The result is answered as structured content plus its JSON text. A refused call answers ``isError`` with
the REST error object ``{"error": {"code", "message", "field"?}}``, so an agent reads the same message it
would over HTTP.

A memory's id is ``memory_id`` in every tool, as in the answers (``save_memory`` answers ``memory_id``).
``id``, the name these tools took first, is still accepted (:data:`ID_ALIASES`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Annotated, Any, Literal

from engram_client import AsyncEngramClient, EngramConnectionError, EngramError, InvalidRequestError
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from api.mcp import descriptions as text
from api.sdk import as_json, unreachable
from core.memories.schemas import MemoryCategory, MemoryKind, RelationType

# The client of the agent behind one tool call, for the duration of the call (stdio: one for the process;
# HTTP: one on the serving app with the request's key).
ClientFor = Callable[[Context], AbstractAsyncContextManager[AsyncEngramClient]]
# Tools that name a memory by its id, and the argument name they accepted before taking `memory_id`.
ID_ALIASES = {"save_memory": "id", "get_memory": "id", "update_memory": "id", "forget_memory": "id"}

MemoryId = Annotated[str, Field(description="The memory's id, e.g. '42' (`id` is accepted too).")]
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
_ID_AND_WHO = frozenset({"memory_id", "agent_id", "persona"})


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
    data = as_json(value)
    structured = data if isinstance(data, dict) else {"result": data}
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False, indent=1))],
        structuredContent=structured,
    )


def error_result(exc: EngramError) -> CallToolResult:
    body = {"error": {**exc.error, "status": exc.status}}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body, ensure_ascii=False))], isError=True)


def validation_error_result(exc: ValidationError) -> CallToolResult:
    """A tool argument the schema refuses, as the REST API's 422 naming the field."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    return error_result(InvalidRequestError(first["msg"], status=422, code="validation_error", field=field))


def with_memory_id(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments with the old id argument name read as `memory_id`."""
    alias = ID_ALIASES.get(tool)
    if alias is None or alias not in arguments or "memory_id" in arguments:
        return arguments
    renamed = dict(arguments)
    renamed["memory_id"] = renamed.pop(alias)
    return renamed


async def _run(
    client_for: ClientFor, ctx: Context, call: Callable[[AsyncEngramClient], Awaitable[Any]]
) -> CallToolResult:
    try:
        async with client_for(ctx) as client:
            return _result(await call(client))
    except EngramConnectionError as exc:
        return error_result(unreachable(exc))
    except EngramError as exc:
        return error_result(exc)


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
        memory_id: Annotated[
            str | None, Field(description="A stable id to upsert; omit for the next integer id (`id` works too).")
        ] = None,
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
        fields = _given({k: v for k, v in locals().items() if k not in _NOT_FIELDS | {"memory_id", "learning"}})
        fields["content"] = content if content is not None else learning
        return await _run(client_for, ctx, lambda c: c.save_memory(id=memory_id, **fields))

    @server.tool(description=text.GET_MEMORY, annotations=read_only)
    async def get_memory(
        ctx: Context, memory_id: MemoryId, agent_id: AgentId = None, persona: Persona = None
    ) -> CallToolResult:
        return await _run(client_for, ctx, lambda c: c.get_memory(memory_id, agent_id=agent_id, persona=persona))

    @server.tool(description=text.UPDATE_MEMORY, annotations=writes)
    async def update_memory(
        ctx: Context,
        memory_id: MemoryId,
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
        fields = _given({k: v for k, v in locals().items() if k not in _NOT_FIELDS | _ID_AND_WHO})
        return await _run(
            client_for, ctx, lambda c: c.update_memory(memory_id, agent_id=agent_id, persona=persona, **fields)
        )

    @server.tool(description=text.FORGET_MEMORY, annotations=destroys)
    async def forget_memory(
        ctx: Context,
        memory_id: MemoryId,
        reason: Annotated[str | None, Field(description="Why, for the audit trail.")] = None,
        purge: Annotated[bool, Field(description="Delete it for good instead (owner or admin).")] = False,
        agent_id: AgentId = None,
        persona: Persona = None,
    ) -> CallToolResult:
        return await _run(
            client_for,
            ctx,
            lambda c: c.forget_memory(memory_id, reason=reason, purge=purge, agent_id=agent_id, persona=persona),
        )

    @server.tool(description=text.LIST_MEMORIES, annotations=read_only)
    async def list_memories(
        ctx: Context,
        kind: Kind = None,
        category: Category = None,
        tags: Annotated[list[str] | None, Field(description="Only memories carrying any of these.")] = None,
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
