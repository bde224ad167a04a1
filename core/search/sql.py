"""The hot queries of a search, compiled once to driver SQL and run without the ORM layer.

A search makes a few queries whose cost in SQLAlchemy (building the statement, the ORM tenant hook,
bind processing of a few hundred ids, result processing of text arrays) was several times their
execution time in PostgreSQL. Each such query is built with SQLAlchemy as before, compiled once per
distinct key (the query's name and every value that shapes it: tenant, caller, filters) into SQL for
the driver, and then run with ``exec_driver_sql`` in the search's own transaction, its varying inputs
(id arrays, entity arrays) passed as parameters.

Tenancy: the ORM hook that adds ``tenant_id = :tenant`` to ORM queries (core.db) does not see driver
SQL, so every statement compiled here must carry the tenant condition itself, on every tenant table
it reads; builders take the tenant id for that reason.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from sqlalchemy import ARRAY, Executable, Text, bindparam
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

CACHE_ENTRIES = 1024
_dialect = postgresql.psycopg.dialect()  # type: ignore[attr-defined]
_cache: OrderedDict[Hashable, tuple[str, dict[str, Any], frozenset[str]]] = OrderedDict()
_lock = threading.Lock()
# A parameter the SQL casts to text[] (every ``text_array``).
_PLACEHOLDER = re.compile(r"%\((\w+)\)s(::TEXT\[\])?")


def text_array(name: str) -> BindParameter[Any]:
    """A ``text[]`` parameter filled at execution (``run(..., name=[...])``)."""
    return bindparam(name, value=[], type_=ARRAY(Text))


def compiled(key: Hashable, build: Callable[[], Executable]) -> tuple[str, dict[str, Any]]:
    """(driver SQL, the parameters fixed at build time) of the statement ``build()`` makes for ``key``."""
    sql, fixed, _ = _compiled(key, build)
    return sql, fixed


def _compiled(key: Hashable, build: Callable[[], Executable]) -> tuple[str, dict[str, Any], frozenset[str]]:
    """As :func:`compiled`, with the names of the parameters the SQL casts to text[]."""
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    statement: Any = build()
    # render_postcompile writes IN lists out, so the SQL holds only plain named parameters.
    result = statement.compile(dialect=_dialect, compile_kwargs={"render_postcompile": True})
    sql = str(result)
    found = _PLACEHOLDER.findall(sql)
    uncast = {name for name, cast in found if not cast}
    entry = (sql, dict(result.params), frozenset(name for name, cast in found if cast and name not in uncast))
    with _lock:
        _cache[key] = entry
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return entry


def _params(fixed: dict[str, Any], values: dict[str, Any], arrays: frozenset[str]) -> dict[str, Any]:
    """The statement's parameters; a list of strings the SQL casts to text[] goes as the array's literal text.

    psycopg adapts a list element by element in Python (finding a dumper for the list, then quoting each
    string); the literal costs one pass in C, and PostgreSQL parses it as the cast says."""
    params = {**fixed, **values}
    for name in arrays:
        value = params.get(name)
        if type(value) is list:
            with contextlib.suppress(TypeError):  # an item that is not a string: psycopg adapts the list
                params[name] = array_literal(value)
    return params


def array_literal(items: list[str]) -> str:
    """PostgreSQL's text form of a text[] holding ``items`` (each quoted; quotes and backslashes escaped).
    Raises TypeError when an item is not a string."""
    if not items:
        return "{}"
    if '"' in (whole := "".join(items)) or "\\" in whole:
        items = [item.replace("\\", "\\\\").replace('"', '\\"') for item in items]
    return '{"' + '","'.join(items) + '"}'


def run(session: Session, key: Hashable, build: Callable[[], Executable], **values: Any) -> Sequence[Any]:
    """Rows of the statement compiled for ``key``, with ``values`` for its execution-time parameters."""
    sql, fixed, arrays = _compiled(key, build)
    # Straight to the driver's cursor, in the session's transaction: SQLAlchemy's execution context and
    # result wrapping cost more than a small indexed query (no engine event applies to driver SQL).
    connection: Any = session.connection().connection.driver_connection
    with connection.cursor() as cursor:
        cursor.execute(sql, _params(fixed, values, arrays))
        return cursor.fetchall() if cursor.description is not None else []


Query = tuple[Hashable, Callable[[], Executable], dict[str, Any]]


def run_many(
    session: Session, queries: Sequence[Query], *, meanwhile: Callable[[], None] | None = None
) -> list[Sequence[Any]]:
    """The rows of several independent statements, sent together: one round trip (psycopg pipeline).

    ``meanwhile`` runs once they are sent, before their rows are read; it must not use the session.
    """
    if len(queries) == 1 and meanwhile is None:
        key, build, values = queries[0]
        return [run(session, key, build, **values)]
    connection: Any = session.connection().connection.driver_connection
    cursors = []
    with connection.pipeline():
        for key, build, values in queries:
            text, fixed, arrays = _compiled(key, build)
            cursor = connection.cursor()
            cursor.execute(text, _params(fixed, values, arrays))
            cursors.append(cursor)
        if meanwhile is not None:
            # Each statement went out as it was executed; the rows are read when the pipeline ends.
            meanwhile()
    return [cursor.fetchall() for cursor in cursors]


def clear_cache() -> None:
    with _lock:
        _cache.clear()
