"""Runs: DELETE /v1/runs/{run_id} ends a run, and its `conversation` memories die with it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from sqlalchemy.orm import Session

from api.auth import require_caller
from api.openapi import RunIdPath, operation
from api.routes.memories import acting_identity
from api.schemas import RunEnded
from api.threads import Route
from core.audit.service import record
from core.db import tenant_write
from core.errors import Invalid
from core.lifecycle.expiry import end_run
from core.tenancy.context import Caller

router = APIRouter(prefix="/v1", tags=["runs"], route_class=Route)


def _flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise Invalid(f"{name} must be true or false", field=name)
    return raw in ("true", "1")


@router.delete(
    "/runs/{run_id}",
    **operation(
        summary="End a run",
        response=RunEnded,
        errors=(403,),
        query={
            "all": ({"type": "boolean", "default": False}, "every category of the run, not only `conversation`"),
            "purge": ({"type": "boolean", "default": False}, "hard delete instead of forgetting"),
        },
    ),
)
def delete_run(run_id: RunIdPath, request: Request, caller: Caller = Depends(require_caller)) -> dict[str, Any]:
    """Forget the caller-visible `conversation` memories of the run (`?all=true`: every category of it;
    `?purge=true`: hard delete). 200 `{"run_id", "status", "count", "skipped"}`, also when nothing matched,
    since ending a run twice is not an error."""
    caller = acting_identity(caller, None, request)
    all_categories, purge = _flag(request, "all"), _flag(request, "purge")

    def end(session: Session) -> dict[str, Any]:
        ended = end_run(session, caller=caller, run_id=run_id, all_categories=all_categories, purge=purge)
        record(session, caller_or_actor=caller, action="run.purge" if purge else "run.end", target=f"run:{run_id}")
        return ended.as_dict()

    return tenant_write(caller.tenant_id, end)
