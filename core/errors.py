"""Domain errors. Each carries the HTTP status the API maps it to, a stable code and a message."""

from __future__ import annotations

from typing import Any


class EngramError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, field: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details or {}


class BadRequest(EngramError):
    status, code = 400, "bad_request"


class Unauthorized(EngramError):
    status, code = 401, "unauthorized"


class Forbidden(EngramError):
    status, code = 403, "forbidden"


class NotFound(EngramError):
    status, code = 404, "not_found"


class Conflict(EngramError):
    status, code = 409, "conflict"


class PayloadTooLarge(EngramError):
    status, code = 413, "payload_too_large"


class Invalid(EngramError):
    status, code = 422, "validation_error"


class RateLimited(EngramError):
    status, code = 429, "rate_limited"


class Unavailable(EngramError):
    status, code = 503, "unavailable"


class TenantSuspended(Forbidden):
    code = "tenant_suspended"


class QuotaExceeded(Forbidden):
    """A write past one of the tenant's quotas (CONTRACT section 9): nothing of it is written."""

    code = "quota_exceeded"

    def __init__(
        self,
        message: str,
        *,
        quota: str | None = None,
        limit: int | None = None,
        field: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        details = {**(details or {}), **({"quota": quota, "limit": limit} if quota is not None else {})}
        super().__init__(message, field=field, details=details)
        self.quota = details.get("quota")
        self.limit = details.get("limit")
