"""One JSON error shape for every route (CONTRACT section 8): no stack trace, no 500 for bad input."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api.quota_events import from_scope
from api.threads import in_thread
from core.dbwaits import AnswerTimeout
from core.errors import EngramError, QuotaExceeded

log = logging.getLogger("engram.api")

# Seconds a client is told to wait after a 503 for overload (pool exhausted, a lock busy, shed load).
BUSY_RETRY_AFTER = "2"

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "rate_limited",
    503: "unavailable",
}


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    details: dict[str, Any] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"code": code or _HTTP_CODES.get(status, "error"), "message": message}
    if field is not None:
        body["field"] = field
    if details:
        body.update({k: v for k, v in details.items() if k not in body})
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def busy_response(message: str) -> JSONResponse:
    """503 + Retry-After for overload: the request was not run (or was rolled back), retrying is safe."""
    return error_response(503, message, headers={"Retry-After": BUSY_RETRY_AFTER})


def database_busy_message(error: BaseException | None) -> str | None:
    """What a 503 says when PostgreSQL is up but ended the request's transaction (rolled back whole, so a
    retry is safe), or None when the error is not one of those."""
    if isinstance(error, AnswerTimeout):
        return f"{error}; retry shortly"
    if isinstance(error, psycopg.errors.LockNotAvailable):
        # lock_timeout (core.db.limit_waits) ended a wait for a row another request holds.
        return "the data is busy with other writes; retry shortly"
    if isinstance(error, psycopg.errors.DeadlockDetected):
        return "the write kept deadlocking with concurrent writes and was rolled back; retry shortly"
    if isinstance(error, psycopg.errors.SerializationFailure):
        return "the write kept conflicting with concurrent writes and was rolled back; retry shortly"
    if isinstance(error, psycopg.errors.QueryCanceled):
        # statement_timeout (core.db.limit_waits): the database is up, the statement did not finish in time.
        return "the database did not finish the request within its time budget; retry shortly"
    return None


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path, sorted: each is tried against the router
    (routers nest, so asking the routes is simpler than walking them)."""
    routes = request.app.router.routes
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in routes):
            allowed.append(method)
    return sorted(allowed)


def _field_path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts)


def _database_error(
    request: Request, error: BaseException | None, *, operational: bool = False, lost: bool = False
) -> JSONResponse:
    """The answer to a database error: 503 when the database is busy or unreachable (nothing was kept, a retry
    is safe), 422 for a value it cannot store (the caller's input), else 500."""
    if operational:
        busy = database_busy_message(error)
        if busy is not None:
            log.warning("%s %s: %s", request.method, request.url.path, str(error).splitlines()[0])
            return busy_response(busy)
        log.warning("database unavailable: %s", error)
        return error_response(503, "the database is unavailable; retry shortly", headers={"Retry-After": "5"})
    if lost:
        return error_response(503, "the database connection was lost; retry shortly", headers={"Retry-After": "5"})
    if isinstance(error, psycopg.DataError):
        # Class 22 (a value the database cannot store: NUL bytes, out-of-range numbers, bad encodings)
        # is the caller's input, not our fault; nothing was written (the unit of work rolled back).
        detail = str(error).strip().splitlines()[0] if str(error).strip() else "invalid value"
        return error_response(422, f"a value in the request cannot be stored: {detail}")
    log.error("database error on %s %s", request.method, request.url.path, exc_info=error)
    return error_response(500, "internal error", code="internal")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(EngramError)
    async def _engram(request: Request, exc: EngramError) -> JSONResponse:
        if isinstance(exc, QuotaExceeded):
            await in_thread(from_scope, request.scope, exc)
        headers = {"Retry-After": "5" if exc.status == 503 else "1"} if exc.status in (429, 503) else None
        headers = {**(headers or {}), **getattr(exc, "headers", {})} or None
        return error_response(
            exc.status, exc.message, code=exc.code, field=exc.field, headers=headers, details=exc.details
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON")
        field = _field_path(tuple(first.get("loc", ())))
        message = f"{field or 'body'}: {first.get('msg', 'invalid value')}"
        return error_response(422, message, field=field or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            # Starlette names only the methods of the first route that matched the path; a path served by
            # several routes (GET and DELETE of one resource) allows all of theirs.
            allowed = _allowed_methods(request)
            if allowed:
                headers = {**(headers or {}), "Allow": ", ".join(allowed)}
                if message == "Method Not Allowed":
                    message = f"{request.method} is not allowed on {request.url.path}; allowed: {', '.join(allowed)}"
        return error_response(exc.status_code, message, headers=headers)

    @app.exception_handler(PoolTimeout)
    async def _pool_exhausted(request: Request, exc: PoolTimeout) -> JSONResponse:
        # Every pooled connection stayed busy for the pool timeout: overload, not a fault of the request.
        log.warning("database pool exhausted on %s %s", request.method, request.url.path)
        return busy_response("the server is busy; retry shortly")

    @app.exception_handler(OperationalError)
    async def _db_down(request: Request, exc: OperationalError) -> JSONResponse:
        return _database_error(request, exc.orig, operational=True)

    @app.exception_handler(DBAPIError)
    async def _db_error(request: Request, exc: DBAPIError) -> JSONResponse:
        return _database_error(request, exc.orig, lost=exc.connection_invalidated)

    # The statements sent on the driver's connection underneath SQLAlchemy (a search's SQL, core.sql;
    # a transaction's begin, core.dbwaits) raise psycopg's own errors, which SQLAlchemy never wrapped.
    @app.exception_handler(psycopg.Error)
    async def _driver_error(request: Request, exc: psycopg.Error) -> JSONResponse:
        return _database_error(request, exc, operational=isinstance(exc, psycopg.OperationalError))

    @app.exception_handler(UnicodeEncodeError)
    async def _unencodable(request: Request, exc: UnicodeEncodeError) -> JSONResponse:
        # JSON admits unpaired surrogates ("\\ud800"); UTF-8, and so the database, does not.
        return error_response(422, "text in the request holds an unpaired surrogate, which cannot be stored")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error", code="internal")
