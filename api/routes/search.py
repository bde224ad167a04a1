"""Search route: a thin adapter from HTTP to core.search."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request, Response

from api.auth import require_caller
from api.openapi import IDENTITY, operation
from api.routes.memories import acting_identity
from api.threads import Route
from core.db import tenant_session
from core.memories.schemas import parse_model
from core.search import service
from core.search.schemas import SearchRequest, SearchResponse
from core.tenancy.context import Caller
from core.tenancy.usage import buffer as usage_buffer

router = APIRouter(prefix="/v1", tags=["search"], route_class=Route)


@router.post(
    "/search",
    **operation(
        summary="Search memories, example queries and entities",
        body=SearchRequest,
        example={"question": "what unit is the order amount in?", "entities": ["shop.orders"], "max_memories": 5},
        response=SearchResponse,
        response_example={
            "memories": [
                {
                    "id": "42",
                    "score": 0.93,
                    "text": "orders.amount is in cents",
                    "matched_entities": ["shop.orders.amount"],
                    "kind": "fact",
                    "category": "core",
                    "importance": 0.5,
                    "created_at": "2026-01-05T10:00:00+00:00",
                }
            ],
            "example_queries": [],
            "entities": [{"id": "shop.orders.amount", "kind": "column", "score": 0.81, "text": "Column: ..."}],
            "resolved_input_entities": ["shop.orders"],
            "warnings": [],
            "channels": {"entity_bm25": True, "fulltext": True, "dense": True, "graph": False},
            "degraded": False,
        },
        errors=(400, 403, 415),
        query=IDENTITY,
    ),
)
def search(
    request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> Response:
    """Give a `question`, `entities` (or an inline `query`), or both. Channels (entity overlap, full-text,
    dense, graph) are fused per bucket; `degraded` is true when the dense channel could not run. Nothing
    given: the most recent memories, with a warning."""
    search_request: SearchRequest = parse_model(SearchRequest, body)
    caller = acting_identity(caller, body, request)
    with tenant_session(caller.tenant_id) as session:
        response = service.search(session, caller=caller, request=search_request)
    usage_buffer.add(caller.tenant_id, searches=1)
    # Serialised by the model itself (pydantic-core): FastAPI's encoder walked every hit in Python first.
    return Response(content=response.model_dump_json(), media_type="application/json")
