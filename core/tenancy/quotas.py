"""A tenant's quotas (CONTRACT section 9): what they are, how they are validated, and the write-time checks.

A quota is a whole number or ``null`` (unlimited). The count a write is held to is read under the tenant's
row lock, which every save already takes to reserve its ids and change_seq: two concurrent batches of one
tenant are checked one after the other, so a quota is never passed by more than nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from core.config import get_settings
from core.errors import Invalid, QuotaExceeded, Unauthorized

QUOTA_NAMES = ("max_memories", "max_datasources", "requests_per_minute", "embedding_texts_per_day")
_MINIMUM = {"max_memories": 0, "max_datasources": 0, "requests_per_minute": 1, "embedding_texts_per_day": 0}


def full_quotas(stored: Mapping[str, Any] | None) -> dict[str, int | None]:
    """Every quota by name, ``None`` where unlimited (the shape the API shows)."""
    stored = stored or {}
    return {name: _as_limit(stored.get(name)) for name in QUOTA_NAMES}


def _as_limit(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def validate_quotas(body: Any, *, field: str = "quotas") -> dict[str, int | None]:
    """The quotas a request names, checked: known names, whole numbers at least their minimum, or null."""
    if not isinstance(body, dict):
        raise Invalid("quotas must be an object", field=field)
    checked: dict[str, int | None] = {}
    for name, value in body.items():
        if name not in QUOTA_NAMES:
            raise Invalid(f"unknown quota {name!r}; quotas are {', '.join(QUOTA_NAMES)}", field=f"{field}.{name}")
        if value is None:
            checked[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < _MINIMUM[name] or value > 2**62:
            raise Invalid(
                f"{name} must be a whole number of at least {_MINIMUM[name]}, or null for unlimited",
                field=f"{field}.{name}",
            )
        checked[name] = value
    return checked


def default_quotas() -> dict[str, int | None]:
    """The quotas a new tenant gets when its creation names none (settings ENGRAM_DEFAULT_*)."""
    settings = get_settings()
    return {
        "max_memories": settings.default_max_memories,
        "max_datasources": settings.default_max_datasources,
        "requests_per_minute": settings.default_requests_per_minute,
        "embedding_texts_per_day": settings.default_embedding_texts_per_day,
    }


def stored_form(quotas: Mapping[str, int | None]) -> dict[str, int]:
    """What the tenants row keeps: only the limits that are set."""
    return {name: value for name, value in quotas.items() if value is not None}


def exceeded(quota: str, limit: int, *, what: str, field: str | None = None) -> QuotaExceeded:
    return QuotaExceeded(
        f"quota {quota} reached: this tenant may keep at most {limit} {what}", quota=quota, limit=limit, field=field
    )


def lock_quotas(session: Session, *, tenant_id: int) -> tuple[dict[str, Any], int]:
    """The tenant's quotas and its count of memories, with the tenant's row locked until commit.

    Every save locks this row (its ids and change_seq are reserved there), so taking it first keeps one
    lock order for every save path: the tenant, then its memories."""
    row = session.execute(
        text("SELECT quotas, memory_count, state FROM tenants WHERE id = :tenant FOR NO KEY UPDATE"), {"tenant": tenant_id}
    ).one_or_none()
    if row is None or row.state == "deleting":
        # Offboarded a moment ago, by a request that raced this one: its keys are revoked, nothing is written.
        raise Unauthorized("invalid API key")
    return dict(row.quotas or {}), int(row.memory_count)


def memory_quota(session: Session, *, tenant_id: int) -> tuple[int | None, int]:
    """The tenant's max_memories (None: unlimited) and its memories now, its row locked until commit."""
    quotas, count = lock_quotas(session, tenant_id=tenant_id)
    return _as_limit(quotas.get("max_memories")), count


def check_datasource_quota(session: Session, *, tenant_id: int) -> None:
    """403 quota_exceeded when the tenant already keeps its max_datasources (row locked until commit)."""
    quotas, _ = lock_quotas(session, tenant_id=tenant_id)
    limit = _as_limit(quotas.get("max_datasources"))
    if limit is None:
        return
    count = session.execute(
        text("SELECT count(*) FROM catalog_datasources WHERE tenant_id = :tenant"), {"tenant": tenant_id}
    ).scalar_one()
    if count >= limit:
        raise exceeded("max_datasources", limit, what="datasources", field="name")
