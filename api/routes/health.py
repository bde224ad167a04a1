"""Liveness and readiness (no key needed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from api.openapi import operation
from api.schemas import Health, Readiness
from core.db import get_engine

router = APIRouter(tags=["health"])


@router.head("/healthz", include_in_schema=False)
@router.get("/healthz", **operation(summary="Liveness", response=Health, keyed=False))
def healthz() -> dict[str, Any]:
    """200 while the process serves requests."""
    return {"status": "ok"}


@router.head("/readyz", include_in_schema=False)
@router.get("/readyz", **operation(summary="Readiness", response=Readiness, keyed=False, errors=(503,)))
def readyz() -> JSONResponse:
    """200 when the database and Redis answer; 503 (with `Retry-After` and the contract's `error`) when not."""
    checks: dict[str, str] = {}
    try:
        with get_engine().connect() as connection:
            connection.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unavailable: {type(exc).__name__}"
    try:
        from api.broker import ping_broker

        ping_broker()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"unavailable: {type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    status = 200 if ready else 503
    headers = None if ready else {"Retry-After": "5"}
    body: dict[str, Any] = {"status": "ready" if ready else "unavailable", "checks": checks}
    if not ready:
        body["error"] = {"code": "unavailable", "message": "a dependency is unreachable"}
    return JSONResponse(body, status_code=status, headers=headers)
