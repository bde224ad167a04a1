"""Search route: a thin adapter from HTTP to core.search."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request

from api.auth import require_caller
from api.routes.memories import acting_identity
from core.db import tenant_session
from core.memories.schemas import parse_model
from core.search import service
from core.search.schemas import SearchRequest
from core.tenancy.context import Caller

router = APIRouter(prefix="/v1")


@router.post("/search")
def search(
    request: Request, body: Any = Body(default=None), caller: Caller = Depends(require_caller)
) -> dict[str, Any]:
    search_request: SearchRequest = parse_model(SearchRequest, body)
    caller = acting_identity(caller, body, request)
    with tenant_session(caller.tenant_id) as session:
        response = service.search(session, caller=caller, request=search_request)
    return response.model_dump()
