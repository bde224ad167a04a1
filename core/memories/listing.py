"""Reads over many memories: filtered, cursor-paginated listing and byte-budget hydration."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Executable,
    Integer,
    Text,
    and_,
    any_,
    bindparam,
    exists,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from core import sql
from core.errors import BadRequest, Forbidden, Invalid
from core.memories.models import Memory
from core.memories.schemas import ListFilters
from core.memories.views import VIEW_COLUMNS, MemoryView, links_column, view_to_dict
from core.memories.visibility import visible_clause, visible_shape, visible_values
from core.refs import is_memory_ref
from core.tenancy.context import Caller

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


def list_memories(
    session: Session, *, caller: Caller, filters: ListFilters, commit: bool = False
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of visible memories in the REST shape (associations included), newest/most important/most
    accessed first, and the next cursor.

    One statement through core.sql, planned for its values (how many of the tenant's memories the filters
    keep decides the plan), compiled once per shape of filters and caller: the filters' values, the cursor's
    and the page size are its parameters. ``commit``: commit the session with it (a request whose transaction is
    only this page), in its round trip."""
    if filters.status == "forgotten" and not caller.is_admin:
        raise Forbidden("listing forgotten memories needs an admin key")
    if filters.occurred_after and filters.occurred_before and filters.occurred_after > filters.occurred_before:
        raise Invalid("occurred_after is later than occurred_before", field="occurred_after")
    after = _decode_cursor(filters.cursor, filters.sort) if filters.cursor else None
    given = {
        name: value
        for name, value in (
            ("kind", filters.kind),
            ("category", filters.category),
            ("tags", list(filters.tags)),
            ("run_id", filters.run_id),
            ("since", filters.since),
            ("occurred_after", filters.occurred_after),
            ("occurred_before", filters.occurred_before),
        )
        if value
    }
    values: dict[str, Any] = {
        "tenant": caller.tenant_id,
        "status": filters.status,
        "page": filters.limit + 1,
        **given,
        **visible_values(caller),
    }
    entity = None
    if filters.entity:
        entity = "memory" if is_memory_ref(filters.entity) else "catalog"
        values["entity"] = [filters.entity]
        escaped = filters.entity.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        values["descendants"] = escaped + ".%"
    if after is not None:
        values |= {f"after_{n}": value for n, value in enumerate(after)}
    shape = (visible_shape(caller), filters.sort, tuple(given), entity, after is not None)
    build = functools.partial(_list_statement, caller, filters.sort, tuple(given), entity, after is not None)
    query = sql.Query(("list", shape), build, values)
    rows = sql.run(session, query, commit=commit)
    next_cursor = None
    if len(rows) > filters.limit:
        rows = rows[: filters.limit]
        last = MemoryView._make(rows[-1][:-1])
        next_cursor = _encode_cursor([getattr(last, column.key) for column in (*_SORTS[filters.sort], Memory.id)])
    return [view_to_dict(row[:-1], row[-1]) for row in rows], next_cursor


def _list_statement(caller: Caller, sort: str, given: tuple[str, ...], entity: str | None, paged: bool) -> Executable:
    """list_memories' statement for a shape of filters and caller (parameters: tenant, status, page, the
    filters given, entity and descendants, after_N, the caller's)."""
    tenant = bindparam("tenant", type_=BigInteger)
    conditions: list[ColumnElement[bool]] = [
        Memory.tenant_id == tenant,
        Memory.status == bindparam("status", type_=Text),
        visible_clause(caller, bound=True),
    ]
    times = {"since": Memory.created_at >= _at("since")}
    times["occurred_after"] = Memory.occurred_at >= _at("occurred_after")
    times["occurred_before"] = Memory.occurred_at <= _at("occurred_before")
    for name in given:
        if name == "tags":
            conditions.append(Memory.tags.overlap(sql.text_array("tags")))  # any of them, as documented
        elif name in times:
            conditions.append(times[name])
        else:
            conditions.append(getattr(Memory, name) == bindparam(name, type_=Text))
    if entity is not None:
        linked_to = Memory.entities.contains(sql.text_array("entity"))
        if entity == "memory":
            conditions.append(linked_to)
        else:  # or through a strict dotted descendant
            linked = func.unnest(Memory.entities).column_valued("linked")
            pattern = bindparam("descendants", type_=Text)
            conditions.append(or_(linked_to, exists(select(1).where(linked.like(pattern, escape="\\")))))
    columns = (*_SORTS[sort], Memory.id)
    if paged:
        bounds = [bindparam(f"after_{n}", type_=column.type) for n, column in enumerate(columns)]
        conditions.append(tuple_(*columns) < tuple_(*bounds))
    return (
        select(*VIEW_COLUMNS, links_column(tenant, Memory.id))
        .where(and_(*conditions))
        .order_by(*(column.desc() for column in columns))
        .limit(bindparam("page", value=0, type_=Integer))
    )


def _at(name: str) -> BindParameter[datetime]:
    return bindparam(name, type_=DateTime(timezone=True))


def hydrate(
    session: Session, *, caller: Caller, budget_bytes: int, commit: bool = False
) -> tuple[list[dict[str, Any]], int]:
    """Fill a byte budget: visible active core memories newest first, then the others newest first, in the REST
    shape (associations included), and the bytes used.

    Each memory is taken if its content's UTF-8 bytes still fit, else skipped; deterministic for the same
    corpus and inputs. The choice reads only the id and size of each memory that could still fit (no larger
    than the room left when its page is read: the room only shrinks, so a larger one would be skipped anyway;
    a content is never empty, so a budget no memory fills is read to its end as before, without the rows that
    cannot matter), a page at a time (core.sql, planned for its values); the memories taken are then read in
    one statement (``commit``: with the COMMIT)."""
    taken: list[str] = []
    used = 0
    for core in (True, False):
        after: tuple[Any, str] | None = None
        while True:
            values: dict[str, Any] = {"tenant": caller.tenant_id, "page": HYDRATE_PAGE, "room": budget_bytes - used}
            values |= visible_values(caller)
            if after is not None:
                values |= {"after_at": after[0], "after_id": after[1]}
            key = ("hydrate-sizes", visible_shape(caller), core, after is not None)
            build = functools.partial(_sizes_statement, caller, core, after is not None)
            rows = sql.run(session, sql.Query(key, build, values))
            for memory_id, size, _ in rows:
                if used + size <= budget_bytes:
                    taken.append(memory_id)
                    used += size
                if used >= budget_bytes:
                    return _shown(session, caller=caller, memory_ids=taken, commit=commit), used
            if len(rows) < HYDRATE_PAGE:
                break
            after = (rows[-1][2], rows[-1][0])
    return _shown(session, caller=caller, memory_ids=taken, commit=commit), used


def _shown(session: Session, *, caller: Caller, memory_ids: list[str], commit: bool) -> list[dict[str, Any]]:
    """The memories ``memory_ids`` of the caller's tenant in the REST shape, in that order (``commit``: the
    statement carries the COMMIT)."""
    if not memory_ids:
        return []
    values = {"tenant": caller.tenant_id, "ids": memory_ids}
    rows = sql.run(session, sql.Query("hydrate-taken", _taken_statement, values, generic=True), commit=commit)
    shown = {row[0]: view_to_dict(row[:-1], row[-1]) for row in rows}
    return [shown[memory_id] for memory_id in memory_ids]


# Memories whose sizes hydrate reads at a time (ids and sizes only).
HYDRATE_PAGE = 500


def _sizes_statement(caller: Caller, core: bool, paged: bool) -> Executable:
    """(id, UTF-8 bytes of the content, created_at) of the caller's visible active memories of the core
    category (``core``) or the others whose content is at most ``room`` bytes, newest first, a page at a time
    (parameters: tenant, room, page, after_at and after_id when ``paged``, the caller's)."""
    conditions: list[ColumnElement[bool]] = [
        Memory.tenant_id == bindparam("tenant", type_=BigInteger),
        Memory.status == "active",
        visible_clause(caller, bound=True),
        Memory.category == "core" if core else Memory.category != "core",
    ]
    if paged:
        after = tuple_(bindparam("after_at", type_=DateTime(timezone=True)), bindparam("after_id", type_=Text))
        conditions.append(tuple_(Memory.created_at, Memory.id) < after)
    size = func.octet_length(func.convert_to(Memory.content, "UTF8"))
    conditions.append(size <= bindparam("room", type_=BigInteger))
    return (
        select(Memory.id, size, Memory.created_at)
        .where(*conditions)
        .order_by(Memory.created_at.desc(), Memory.id.desc())
        .limit(bindparam("page", value=0, type_=Integer))
    )


def _taken_statement() -> Executable:
    """The REST columns and associations of the memories ``ids`` of the tenant (parameters: tenant, ids)."""
    tenant = bindparam("tenant", type_=BigInteger)
    return select(*VIEW_COLUMNS, links_column(tenant, Memory.id)).where(
        Memory.tenant_id == tenant, Memory.id == any_(sql.text_array("ids"))
    )
