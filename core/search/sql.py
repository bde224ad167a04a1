"""The hot queries of a search, compiled once to driver SQL and run without the ORM layer.

A search makes a few queries whose cost in SQLAlchemy (building the statement, the ORM tenant hook,
bind processing of a few hundred ids, result processing of text arrays) was several times their
execution time in PostgreSQL. Each such query is built with SQLAlchemy as before, compiled once per
distinct key (the query's name and every value that shapes it: tenant, caller, filters) into SQL for
the driver, and run in the search's own transaction.

The statements of one call go out as one simple query (``a; b; c``: one message, one round trip, results
read in order), each value written into the SQL text as a literal quoted by libpq (``PQescapeLiteral``)
or by psycopg's adapters. psycopg's pipeline (a cursor, parse, bind, describe and execute per statement,
driven in Python) cost three times the CPU of this for two statements (114 against 37 microseconds). The
server plans a statement for its values either way (core.db forces custom plans; nothing here is
prepared). A key's values that are the same at every call (filters, caller) are quoted once and kept in
its text; the values a call gives (ids, entities) are quoted at each call.

Tenancy: the ORM hook that adds ``tenant_id = :tenant`` to ORM queries (core.db) does not see driver
SQL, so every statement compiled here must carry the tenant condition itself, on every tenant table
it reads; builders take the tenant id for that reason.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg import sql as literal_sql
from psycopg.adapt import Transformer
from sqlalchemy import ARRAY, Executable, Text, bindparam
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from core.dbwaits import send_simple, simple_results

CACHE_ENTRIES = 1024
_dialect = postgresql.psycopg.dialect()  # type: ignore[attr-defined]
# A parameter of the compiled SQL (psycopg's pyformat), or an escaped percent sign.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
Split = tuple[tuple[str, ...], tuple[str, ...]]  # SQL pieces, and the parameter between each two


class _Statement:
    """A key's compiled SQL split at its parameters, and the parameter values fixed when it was built."""

    __slots__ = ("pieces", "names", "fixed", "given")

    def __init__(self, sql: str, fixed: dict[str, Any]) -> None:
        pieces, names, last, piece = [], [], 0, []
        for match in _PLACEHOLDER.finditer(sql):
            piece.append(sql[last : match.start()])
            last = match.end()
            if match.group(1) is None:
                piece.append("%")
            else:
                pieces.append("".join(piece))
                names.append(match.group(1))
                piece = []
        piece.append(sql[last:])
        pieces.append("".join(piece))
        self.pieces, self.names, self.fixed = tuple(pieces), tuple(names), fixed
        # Per set of names a call gives values for: the SQL with every other value written in, split at those.
        self.given: dict[frozenset[str], Split] = {}

    def text(self, values: dict[str, Any], quote: Callable[[Any], str]) -> str:
        """The statement with ``values`` (and the fixed values of the names they do not give) written in."""
        split = self.given.get(frozenset(values))
        if split is None:
            split = self.given[frozenset(values)] = self._split(frozenset(values), quote)
        pieces, names = split
        if not names:
            return pieces[0]
        parts = [pieces[0]]
        for name, piece in zip(names, pieces[1:], strict=True):
            parts.append(quote(values[name]))
            parts.append(piece)
        return "".join(parts)

    def _split(self, given: frozenset[str], quote: Callable[[Any], str]) -> Split:
        pieces, names, current = [], [], self.pieces[0]
        for name, piece in zip(self.names, self.pieces[1:], strict=True):
            if name in given:
                pieces.append(current)
                names.append(name)
                current = piece
            else:
                current += quote(self.fixed[name]) + piece
        pieces.append(current)
        return tuple(pieces), tuple(names)


_cache: OrderedDict[Hashable, _Statement] = OrderedDict()
_lock = threading.Lock()


def text_array(name: str) -> BindParameter[Any]:
    """A ``text[]`` parameter filled at execution (``run(..., name=[...])``)."""
    return bindparam(name, value=[], type_=ARRAY(Text))


def _compiled(key: Hashable, build: Callable[[], Executable]) -> _Statement:
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    statement: Any = build()
    # render_postcompile writes IN lists out, so the SQL holds only plain named parameters.
    result = statement.compile(dialect=_dialect, compile_kwargs={"render_postcompile": True})
    entry = _Statement(str(result), dict(result.params))
    with _lock:
        _cache[key] = entry
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return entry


def array_literal(items: list[str]) -> str:
    """PostgreSQL's text form of a text[] holding ``items`` (each quoted; quotes and backslashes escaped).
    Raises TypeError when an item is not a string."""
    if not items:
        return "{}"
    if '"' in (whole := "".join(items)) or "\\" in whole:
        items = [item.replace("\\", "\\\\").replace('"', '\\"') for item in items]
    return '{"' + '","'.join(items) + '"}'


def quoter(driver: psycopg.Connection[Any]) -> Callable[[Any], str]:
    """A function writing a value as an SQL literal for ``driver``'s connection.

    Strings and lists of strings (as the text of an array) are quoted by libpq; integers are written out;
    floats are cast to float8 (as psycopg sends them); anything else is psycopg's own literal of it."""
    escape, encoding = pq.Escaping(driver.pgconn).escape_literal, driver.info.encoding

    def quoted(value: str) -> str:
        if "\x00" in value:  # libpq would cut the string there; psycopg refuses it as a parameter
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return escape(value.encode(encoding)).decode(encoding)

    def quote(value: Any) -> str:
        kind = type(value)
        if kind is str:
            return quoted(value)
        if kind is int:
            return str(value) if value >= 0 else f" {value}"  # (a space: "x -%s" must not become a comment)
        if kind is list:
            try:
                return quoted(array_literal(value))
            except TypeError:  # an item that is not a string: psycopg's literal of the list
                pass
        elif value is None:
            return "NULL"
        elif kind is float:
            return f"'{value!r}'::float8"
        return literal_sql.Literal(value).as_string(driver)

    return quote


def run(session: Session, key: Hashable, build: Callable[[], Executable], **values: Any) -> Sequence[Any]:
    """Rows of the statement compiled for ``key``, with ``values`` for its execution-time parameters."""
    return run_many(session, [(key, build, values)])[0]


Query = tuple[Hashable, Callable[[], Executable], dict[str, Any]]


def run_many(
    session: Session, queries: Sequence[Query], *, meanwhile: Callable[[], None] | None = None
) -> list[Sequence[Any]]:
    """The rows of each of several statements, sent together as one simple query: one round trip.

    ``meanwhile`` runs once they are sent, before their rows are read; it must not use the session.
    """
    driver: Any = session.connection().connection.driver_connection
    quote = quoter(driver)
    send(driver, ";\n".join(_compiled(key, build).text(values, quote) for key, build, values in queries))
    try:
        if meanwhile is not None:
            meanwhile()
    finally:
        results = receive(driver)
    return results


def send(driver: psycopg.Connection[Any], statements: str) -> None:
    """Send ``statements`` (several, ``;``-separated) as one simple query; read their rows with ``receive``.
    Until then the connection is busy: nothing else may use it."""
    send_simple(driver, statements)


def receive(driver: psycopg.Connection[Any]) -> list[Sequence[Any]]:
    """The rows of each statement ``send`` sent, in order (none for a statement that returns no rows); raises
    the first statement's error, after which PostgreSQL runs none of the rest. Every wait is bounded
    (core.dbwaits)."""
    transformer = Transformer(driver)
    rows: list[Sequence[Any]] = []
    for result in simple_results(driver):
        transformer.set_pgresult(result)
        rows.append(transformer.load_rows(0, result.ntuples, tuple))
    return rows


def clear_cache() -> None:
    with _lock:
        _cache.clear()
