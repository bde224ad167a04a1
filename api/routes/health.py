"""Liveness and readiness (no key needed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from core.db import get_engine

router = APIRouter()


@router.api_route("/healthz", methods=["GET", "HEAD"])
def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@router.api_route("/readyz", methods=["GET", "HEAD"])
def readyz() -> JSONResponse:
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
