"""Memory routes: thin adapters from HTTP to core.memories."""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import JSONResponse

from api.auth import require_caller
from api.embedding_hooks import after_save, embed_now
from core.db import tenant_session
from core.embeddings.providers import EmbeddingProviderError
from core.errors import EngramError, Invalid
from core.memories import listing, service
from core.memories.schemas import (
    MAX_BATCH_ITEMS,
    HydrateIn,
    ListFilters,
    PatchMemoryIn,
    SaveBatchIn,
    SaveMemoryIn,
    parse_model,
    unknown_fields,
)
from core.tenancy.context import Caller

router = APIRouter(prefix="/v1")


def acting_identity(caller: Caller, body: dict[str, Any] | None, request: Request) -> Caller:
    """The agent and persona a call acts for: body fields, else query parameters."""
    source: dict[str, Any] = dict(request.query_params)
    if isinstance(body, dict):
        source.update({k: body[k] for k in ("agent_id", "persona") if k in body})
    agent_id, persona = source.get("agent_id"), source.get("persona")
    for name, value in (("agent_id", agent_id), ("persona", persona)):
        if value is not None and not isinstance(value, str):
            raise Invalid(f"{name} must be a string", field=name)
    return caller.acting_as(agent_id=agent_id or None, persona=persona or None)


def _error_item(exc: EngramError) -> dict[str, Any]:
    error: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.field:
        error["field"] = exc.field
    return {"error": error}


@router.post("/memories", status_code=201)
def save_memory(
    request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> JSONResponse:
    item: SaveMemoryIn = parse_model(SaveMemoryIn, body)
    caller = acting_identity(caller, body, request)
    with tenant_session(caller.tenant_id) as session:
        result = service.save_memory(session, caller=caller, item=item)
    if item.sync_embed:
        result = after_save(caller=caller, result=result)
    return JSONResponse(result.model_dump(), status_code=201)


@router.post("/memories:batch")
def save_batch(
    request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise Invalid('body must be {"items": [save bodies]}', field="items")
    unknown_fields(SaveBatchIn, body)
    raw_items = body["items"]
    if len(raw_items) > MAX_BATCH_ITEMS:
        raise Invalid(f"a batch holds at most {MAX_BATCH_ITEMS} items, got {len(raw_items)}", field="items")
    caller = acting_identity(caller, body, request)
    items: list[SaveMemoryIn | EngramError] = []
    for i, raw in enumerate(raw_items):
        try:
            items.append(parse_model(SaveMemoryIn, raw, prefix=f"items.{i}."))
        except EngramError as exc:
            items.append(exc)
    with tenant_session(caller.tenant_id) as session:
        results = service.save_memories(session, caller=caller, items=items)
    out = [
        r.model_dump(exclude={"similar_existing"}) if not isinstance(r, EngramError) else _error_item(r)
        for r in results
    ]
    return {"results": out}


@router.get("/memories")
def list_memories(
    request: Request,
    caller: Caller = Depends(require_caller),
    tags: list[str] = Query(default=[]),
) -> dict[str, Any]:
    params: dict[str, Any] = {k: v for k, v in request.query_params.items() if k not in ("tags", "agent_id", "persona")}
    params["tags"] = tags
    filters: ListFilters = parse_model(ListFilters, params)
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        rows, next_cursor = listing.list_memories(session, caller=caller, filters=filters)
        memories = service.memories_to_dicts(session, rows)
    return {"memories": memories, "next_cursor": next_cursor}


@router.get("/memories/{memory_id}")
def get_memory(
    memory_id: str,
    request: Request,
    include_forgotten: bool = False,
    caller: Caller = Depends(require_caller),
) -> dict[str, Any]:
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        memory = service.get_memory(session, caller=caller, memory_id=memory_id, include_forgotten=include_forgotten)
        return service.memories_to_dicts(session, [memory])[0]


@router.get("/memories/{memory_id}/history")
def memory_history(
    memory_id: str,
    request: Request,
    include_forgotten: bool = False,
    caller: Caller = Depends(require_caller),
) -> dict[str, Any]:
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        versions = service.memory_history(
            session, caller=caller, memory_id=memory_id, include_forgotten=include_forgotten
        )
    return {"versions": versions}


@router.patch("/memories/{memory_id}")
def patch_memory(
    memory_id: str, request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> dict[str, Any]:
    patch: PatchMemoryIn = parse_model(PatchMemoryIn, body)
    caller = acting_identity(caller, body, request)
    with tenant_session(caller.tenant_id) as session:
        memory = service.patch_memory(session, caller=caller, memory_id=memory_id, patch=patch)
        out = service.memories_to_dicts(session, [memory])[0]
    if patch.sync_embed and patch.content is not None:
        # As on save; a provider failure leaves it to the embed job the edit queued.
        with contextlib.suppress(EmbeddingProviderError):
            embed_now(caller=caller, memory_id=memory.id)
    return out


@router.delete("/memories/{memory_id}")
def forget_memory(
    memory_id: str,
    request: Request,
    reason: str | None = None,
    purge: bool = False,
    caller: Caller = Depends(require_caller),
) -> dict[str, Any]:
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        return service.forget_memory(session, caller=caller, memory_id=memory_id, reason=reason, purge=purge)


@router.post("/hydrate")
def hydrate(
    request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise Invalid("body must be a JSON object with budget_bytes", field="budget_bytes")
    unknown_fields(HydrateIn, body)
    budget = body.get("budget_bytes")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise Invalid("budget_bytes must be a non-negative integer", field="budget_bytes")
    caller = acting_identity(caller, body, request)
    with tenant_session(caller.tenant_id) as session:
        rows, used = listing.hydrate(session, caller=caller, budget_bytes=budget)
        return {"memories": service.memories_to_dicts(session, rows), "bytes": used}
