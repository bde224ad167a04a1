"""Typed errors: one class per status engram answers, each carrying the REST error body's fields.

engram answers every error as ``{"error": {"code", "message", "field"?}}``; the SDK raises the subclass of
:class:`EngramError` for its status, so callers can ``except NotFoundError`` instead of comparing numbers.
"""

from __future__ import annotations

from typing import Any


class EngramError(Exception):
    """An error answer of engram (or no answer at all: :class:`EngramConnectionError`)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str = "error",
        field: str | None = None,
        request_id: str | None = None,
        details: dict[str, Any] | None = None,
    ):
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field
        self.request_id = request_id
        self.details = details or {}

    @property
    def error(self) -> dict[str, Any]:
        """The REST error object ``{"code", "message", "field"?, ...}`` this error was read from."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return {**body, **{k: v for k, v in self.details.items() if k not in body}}


class BadRequestError(EngramError):
    """400: the request is wrong in a way no single field explains (e.g. an unknown datasource)."""


class AuthenticationError(EngramError):
    """401: no API key, or one engram does not know."""


class PermissionDeniedError(EngramError):
    """403: the key may not do this (a member changing another's memory, a read-only key writing)."""


class NotFoundError(EngramError):
    """404: absent, or not visible to this key, agent or persona."""


class ConflictError(EngramError):
    """409."""


class PayloadTooLargeError(EngramError):
    """413: content over 50,000 bytes, or a body over the size limit."""


class InvalidRequestError(EngramError):
    """422: a field is invalid or unknown; ``field`` names it."""


class RateLimitError(EngramError):
    """429 after the retries ran out; ``retry_after`` is the server's advice in seconds."""

    retry_after: float | None = None


class ServiceUnavailableError(EngramError):
    """503 after the retries ran out: a dependency of engram (database, Redis) is down."""

    retry_after: float | None = None


class ServerError(EngramError):
    """Any other 5xx."""


class EngramConnectionError(EngramError):
    """engram could not be reached (refused connection, DNS, timeout)."""


_BY_STATUS: dict[int, type[EngramError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def error_for(status: int, body: Any, *, request_id: str | None, retry_after: float | None) -> EngramError:
    """The typed error for an answer's status and (contract-shaped, or not) body."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message, code, field = str(error.get("message", "")), str(error.get("code", "error")), error.get("field")
        details = {k: v for k, v in error.items() if k not in ("code", "message", "field")}
    else:
        message, code, field, details = str(body)[:500] or f"HTTP {status}", "bad_response", None, {}
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else EngramError)
    exc = cls(message, status=status, code=code, field=field, request_id=request_id, details=details)
    if isinstance(exc, RateLimitError | ServiceUnavailableError):
        exc.retry_after = retry_after
    return exc
