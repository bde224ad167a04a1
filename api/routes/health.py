"""Liveness and readiness (no key needed).

Both answer while the API is saturated: they are async (no worker thread to wait for), bypass load
shedding (api.overload), and readiness checks the database on a connection of its own, outside the
request pool, in a thread of its own, each step with a short timeout.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from api.openapi import operation
from api.schemas import Health, Readiness
from api.threads import Route
from core.db import get_engine

router = APIRouter(tags=["health"], route_class=Route)

PROBE_TIMEOUT_SECONDS = 2
# Probe checks run in their own threads: the default thread limiter may be full of request work.
_probe_threads = anyio.CapacityLimiter(4)
_probe_engine: Engine | None = None
_probe_lock = threading.Lock()


@router.head("/healthz", include_in_schema=False)
@router.get("/healthz", **operation(summary="Liveness", response=Health, keyed=False))
async def healthz() -> dict[str, Any]:
    """200 while the process serves requests."""
    return {"status": "ok"}


def _engine() -> Engine:
    """An engine without a pool for probes: a fresh connection per check, never one a request holds."""
    global _probe_engine
    with _probe_lock:
        if _probe_engine is None:
            url = get_engine().url
            _probe_engine = create_engine(
                url,
                poolclass=NullPool,
                connect_args={
                    "connect_timeout": PROBE_TIMEOUT_SECONDS,
                    "options": f"-c statement_timeout={PROBE_TIMEOUT_SECONDS * 1000}",
                },
            )
        return _probe_engine


def _checks() -> dict[str, str]:
    checks: dict[str, str] = {}
    try:
        with _engine().connect() as connection:
            connection.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unavailable: {type(exc).__name__}"
    try:
        # Deferred: api.broker loads Celery, needed only when readiness checks the broker.
        from api.broker import ping_broker

        ping_broker()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"unavailable: {type(exc).__name__}"
    return checks


@router.head("/readyz", include_in_schema=False)
@router.get("/readyz", **operation(summary="Readiness", response=Readiness, keyed=False, errors=(503,)))
async def readyz() -> JSONResponse:
    """200 when the database and Redis answer; 503 (with `Retry-After` and the contract's `error`) when not."""
    checks = await anyio.to_thread.run_sync(_checks, limiter=_probe_threads)
    ready = all(v == "ok" for v in checks.values())
    status = 200 if ready else 503
    headers = None if ready else {"Retry-After": "5"}
    body: dict[str, Any] = {"status": "ready" if ready else "unavailable", "checks": checks}
    if not ready:
        body["error"] = {"code": "unavailable", "message": "a dependency is unreachable"}
    return JSONResponse(body, status_code=status, headers=headers)
