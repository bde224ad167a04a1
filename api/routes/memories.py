"""Memory routes: thin adapters from HTTP to core.memories."""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from api.auth import require_caller
from api.embedding_hooks import after_save, embed_now
from api.openapi import IDENTITY, MemoryIdPath, operation, query_from
from api.quota_events import quota_exceeded
from api.responses import json_answer
from api.schemas import BatchResult, ForgetResult, HydrateResult, Memory, MemoryHistory, MemoryPage
from api.threads import Route
from core.db import tenant_session, tenant_write
from core.embeddings.providers import EmbeddingProviderError
from core.errors import EngramError, Invalid
from core.memories import edits, listing, service
from core.memories.schemas import (
    MAX_BATCH_ITEMS,
    HydrateIn,
    ListFilters,
    PatchMemoryIn,
    SaveBatchIn,
    SaveMemoryIn,
    SaveResult,
    parse_model,
    unknown_fields,
)
from core.tenancy.context import Caller
from core.tenancy.usage import buffer as usage_buffer

router = APIRouter(prefix="/v1", tags=["memories"], route_class=Route)

_SAVE_EXAMPLE = {
    "content": "orders.amount is in cents",
    "linked_entities": ["shop.orders.amount"],
    "kind": "fact",
    "tags": ["units"],
    "agent_id": "planner",
}


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


@router.post(
    "/memories",
    status_code=201,
    **operation(
        summary="Save a memory",
        query=IDENTITY,
        body=SaveMemoryIn,
        example=_SAVE_EXAMPLE,
        response=SaveResult,
        response_example={"memory_id": "42", "entities": ["shop.orders.amount"], "warnings": []},
        status=201,
        errors=(400, 403, 413, 415),
    ),
)
def save_memory(
    request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> Response:
    """Save (or, with an existing `id`, upsert) one memory. `content` may also be sent as `learning`;
    `linked_entities` is a list of entity ids (resolved strictly) or an inline query dict (resolved
    leniently and stored as the memory's example query). Durable and found by entity and full-text search
    when this returns; embedding happens in the background unless `sync_embed` is true."""
    item: SaveMemoryIn = parse_model(SaveMemoryIn, body)
    caller = acting_identity(caller, body, request)

    def save(session: Session) -> SaveResult:
        return service.save_memory(session, caller=caller, item=item, action="memory.save", finish=True)

    result = tenant_write(caller.tenant_id, save)
    usage_buffer.add(caller.tenant_id, saves=1)
    if item.sync_embed:
        result = after_save(caller=caller, result=result)
    return json_answer(result.model_dump(), status_code=201)


@router.post(
    "/memories:batch",
    **operation(
        summary="Save up to 1,000 memories",
        query=IDENTITY,
        body=SaveBatchIn,
        example={"items": [_SAVE_EXAMPLE, {"content": "the fiscal year starts in April", "kind": "fact"}]},
        response=BatchResult,
        errors=(403, 413, 415),
    ),
)
def save_batch(
    request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> Response:
    """Save many memories in one transaction. Results come in input order; an invalid item is an
    `{"error": {...}}` in its slot (its `field` prefixed `items.N.`) while the valid ones are saved."""
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

    def save_all(session: Session) -> list[SaveResult | EngramError]:
        return service.save_memories(session, caller=caller, items=items, action="memory.save", finish=True)

    results = tenant_write(caller.tenant_id, save_all)
    usage_buffer.add(caller.tenant_id, saves=sum(1 for r in results if not isinstance(r, EngramError)))
    quota_exceeded(caller.tenant_id, [r for r in results if isinstance(r, EngramError)])
    out = [
        {"memory_id": r.memory_id, "entities": r.entities, "warnings": r.warnings}  # no similar_existing in a batch
        if not isinstance(r, EngramError)
        else _error_item(r)
        for r in results
    ]
    return json_answer({"results": out})


_LIST_QUERY = {name: doc for name, doc in query_from(ListFilters).items() if name != "tags"} | IDENTITY


@router.get(
    "/memories", **operation(summary="List memories", response=MemoryPage, errors=(400, 403), query=_LIST_QUERY)
)
def list_memories(
    request: Request,
    caller: Caller = Depends(require_caller),
    tags: list[str] = Query(default=[], description="only memories carrying one of these tags (repeat, or a,b)"),
) -> Response:
    """Memories visible to the caller, filtered by `kind`, `category`, `tags`, `run_id`, `status`, `since`,
    `entity` (the entity and its dotted descendants), sorted by `sort`, `limit` per page; pass the
    returned `next_cursor` as `cursor` for the next page (null on the last)."""
    params: dict[str, Any] = {k: v for k, v in request.query_params.items() if k not in ("tags", "agent_id", "persona")}
    params["tags"] = tags
    filters: ListFilters = parse_model(ListFilters, params)
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        memories, next_cursor = listing.list_memories(session, caller=caller, filters=filters, commit=True)
    return json_answer({"memories": memories, "next_cursor": next_cursor})


@router.get(
    "/memories/{memory_id}",
    **operation(summary="Recall a memory by id", response=Memory, errors=(404,), query=IDENTITY),
)
def get_memory(
    memory_id: MemoryIdPath,
    request: Request,
    include_forgotten: bool = Query(default=False, description="also a forgotten memory (admin keys)"),
    caller: Caller = Depends(require_caller),
) -> Response:
    """Exact recall by id (counts an access). `include_forgotten=true` (admins) also shows a forgotten one."""
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        recalled = service.recall_memory(
            session, caller=caller, memory_id=memory_id, include_forgotten=include_forgotten, commit=True
        )
    return json_answer(recalled)


@router.get(
    "/memories/{memory_id}/history",
    **operation(summary="A memory's versions", response=MemoryHistory, errors=(403, 404), query=IDENTITY),
)
def memory_history(
    memory_id: MemoryIdPath,
    request: Request,
    include_forgotten: bool = Query(default=False, description="also a forgotten memory (admin keys)"),
    caller: Caller = Depends(require_caller),
) -> Response:
    """Every revision, newest first (the current one first); visible as for GET, no access counted."""
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        versions = service.memory_history(
            session, caller=caller, memory_id=memory_id, include_forgotten=include_forgotten
        )
    return json_answer({"versions": versions})


@router.patch(
    "/memories/{memory_id}",
    **operation(
        summary="Revise a memory",
        query=IDENTITY,
        body=PatchMemoryIn,
        example={"content": "orders.amount is in cents (USD)", "tags": ["units", "currency"]},
        response=Memory,
        errors=(403, 404, 413, 415),
    ),
)
def patch_memory(
    memory_id: MemoryIdPath, request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> Response:
    """Change the given fields only; `created_at` stays and the previous version is kept."""
    patch: PatchMemoryIn = parse_model(PatchMemoryIn, body)
    caller = acting_identity(caller, body, request)

    out = tenant_write(
        caller.tenant_id, lambda session: edits.patch_memory(session, caller=caller, memory_id=memory_id, patch=patch)
    )
    if patch.sync_embed and patch.content is not None:
        # As on save; a provider failure leaves it to the embed job the edit queued.
        with contextlib.suppress(EmbeddingProviderError):
            embed_now(caller=caller, memory_id=memory_id)
    return json_answer(out)


@router.delete(
    "/memories/{memory_id}",
    **operation(summary="Forget a memory", response=ForgetResult, errors=(403, 404), query=IDENTITY),
)
def forget_memory(
    memory_id: MemoryIdPath,
    request: Request,
    reason: str | None = Query(default=None, description="why, for the audit trail"),
    purge: bool = Query(default=False, description="delete for good: row, embeddings and links (owner or admin)"),
    caller: Caller = Depends(require_caller),
) -> Response:
    """Soft delete with a `reason` for the audit trail; references to it are stripped from other memories.
    `purge=true` (owner or admin) deletes the row, its embeddings and links for good."""
    caller = acting_identity(caller, None, request)

    def forget(session: Session) -> dict[str, str]:
        return edits.forget_memory(session, caller=caller, memory_id=memory_id, reason=reason, purge=purge)

    return json_answer(tenant_write(caller.tenant_id, forget))


@router.post(
    "/hydrate",
    **operation(
        summary="Load memories for a run's start",
        query=IDENTITY,
        body=HydrateIn,
        example={"agent_id": "planner", "budget_bytes": 4000},
        response=HydrateResult,
        errors=(415,),
    ),
)
def hydrate(
    request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> Response:
    """Visible active `core` memories newest first, then the others, each taken while its content still
    fits `budget_bytes` of UTF-8. Same inputs, same answer."""
    if not isinstance(body, dict):
        raise Invalid("body must be a JSON object with budget_bytes", field="budget_bytes")
    unknown_fields(HydrateIn, body)
    budget = body.get("budget_bytes")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise Invalid("budget_bytes must be a non-negative integer", field="budget_bytes")
    caller = acting_identity(caller, body, request)
    with tenant_session(caller.tenant_id) as session:
        memories, used = listing.hydrate(session, caller=caller, budget_bytes=budget, commit=True)
    return json_answer({"memories": memories, "bytes": used})
