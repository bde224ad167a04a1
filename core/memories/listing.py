"""Reads over many memories: filtered, cursor-paginated listing and byte-budget hydration."""

from __future__ import annotations

import base64
import binascii
import json
import math
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, func, or_, select, tuple_
from sqlalchemy.orm import Session

from core.errors import BadRequest, Forbidden, Invalid
from core.memories.models import Memory
from core.memories.schemas import ListFilters
from core.memories.visibility import visible_clause
from core.refs import is_memory_ref
from core.tenancy.context import Caller


def entity_filter(entity: str) -> ColumnElement[bool]:
    """Memories linked to `entity`: exactly, or (catalog refs only) through a strict dotted descendant."""
    if is_memory_ref(entity):
        return Memory.entities.contains([entity])
    pattern = entity.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ".%"
    linked = func.unnest(Memory.entities).column_valued("linked")
    return or_(
        Memory.entities.contains([entity]),
        exists(select(1).where(linked.like(pattern, escape="\\"))),
    )


_SORTS = {
    "recent": (Memory.created_at,),
    "importance": (Memory.importance, Memory.created_at),
    "most_accessed": (Memory.access_count, Memory.created_at),
}


def _encode_cursor(values: list[Any]) -> str:
    plain = [v.isoformat() if isinstance(v, datetime) else v for v in values]
    return base64.urlsafe_b64encode(json.dumps(plain).encode()).decode().rstrip("=")


def _cursor_key(kind: type, value: Any) -> Any:
    """One sort key of a cursor, checked against its column's type (a cursor is client input)."""
    if kind is datetime:
        if not isinstance(value, str):
            raise ValueError("timestamp")
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise ValueError("naive timestamp")
        return parsed
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("number")
    if kind is int and (not isinstance(value, int) or abs(value) >= 2**31):
        raise ValueError("integer")
    return value


def _decode_cursor(cursor: str, sort: str) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(values, list) or len(values) != len(_SORTS[sort]) + 1:
            raise ValueError("wrong shape")
        *keys, last_id = values
        decoded = [_cursor_key(column.type.python_type, k) for column, k in zip(_SORTS[sort], keys, strict=True)]
        if not isinstance(last_id, str):
            raise ValueError("id")
        return [*decoded, last_id]
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError):
        raise BadRequest("cursor is not one this API returned", field="cursor") from None


def list_memories(session: Session, *, caller: Caller, filters: ListFilters) -> tuple[list[Memory], str | None]:
    """A page of visible memories, newest/most important/most accessed first, and the next cursor."""
    if filters.status == "forgotten" and not caller.is_admin:
        raise Forbidden("listing forgotten memories needs an admin key")
    conditions: list[ColumnElement[bool]] = [Memory.status == filters.status, visible_clause(caller)]
    if filters.kind:
        conditions.append(Memory.kind == filters.kind)
    if filters.category:
        conditions.append(Memory.category == filters.category)
    if filters.tags:
        conditions.append(Memory.tags.contains(filters.tags))
    if filters.run_id:
        conditions.append(Memory.run_id == filters.run_id)
    if filters.since:
        conditions.append(Memory.created_at >= filters.since)
    if filters.occurred_after and filters.occurred_before and filters.occurred_after > filters.occurred_before:
        raise Invalid("occurred_after is later than occurred_before", field="occurred_after")
    if filters.occurred_after:
        conditions.append(Memory.occurred_at >= filters.occurred_after)
    if filters.occurred_before:
        conditions.append(Memory.occurred_at <= filters.occurred_before)
    if filters.entity:
        conditions.append(entity_filter(filters.entity))
    columns = (*_SORTS[filters.sort], Memory.id)
    if filters.cursor:
        after = _decode_cursor(filters.cursor, filters.sort)
        conditions.append(tuple_(*columns) < tuple_(*after))
    rows = list(
        session.scalars(
            select(Memory).where(and_(*conditions)).order_by(*(c.desc() for c in columns)).limit(filters.limit + 1)
        ).all()
    )
    next_cursor = None
    if len(rows) > filters.limit:
        rows = rows[: filters.limit]
        last = rows[-1]
        next_cursor = _encode_cursor([getattr(last, c.key) for c in columns])
    return rows, next_cursor


def hydrate(session: Session, *, caller: Caller, budget_bytes: int) -> tuple[list[Memory], int]:
    """Fill a byte budget: visible active core memories newest first, then the others newest first.

    Each memory is taken if its content's UTF-8 bytes still fit, else skipped; deterministic for the
    same corpus and inputs.
    """
    base = select(Memory).where(Memory.status == "active", visible_clause(caller))
    order = (Memory.created_at.desc(), Memory.id.desc())
    taken: list[Memory] = []
    used = 0
    for core_first in (True, False):
        stmt = base.where(Memory.category == "core" if core_first else Memory.category != "core").order_by(*order)
        for memory in session.scalars(stmt.execution_options(yield_per=500)):
            size = len(memory.content.encode("utf-8"))
            if used + size <= budget_bytes:
                taken.append(memory)
                used += size
            if used >= budget_bytes:
                return taken, used
    return taken, used
