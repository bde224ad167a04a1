"""Hot statements compiled once to driver SQL and run without the ORM layer: a search's, and a save's.

A search makes a few queries whose cost in SQLAlchemy (building the statement, the ORM tenant hook,
bind processing of a few hundred ids, result processing of text arrays) was several times their
execution time in PostgreSQL. Each such query is built with SQLAlchemy as before, compiled once per
distinct key (the query's name and every value that shapes it: tenant, caller, filters) into SQL for
the driver, and run in the session's own transaction.

The statements of one call go out as one simple query (``a; b; c``: one message, one round trip, results
read in order), each value written into the SQL text as a literal quoted by libpq (``PQescapeLiteral``)
or by psycopg's adapters. psycopg's pipeline (a cursor, parse, bind, describe and execute per statement,
driven in Python) cost three times the CPU of this for two statements (114 against 37 microseconds). The
server plans such a statement for its values (core.db forces custom plans). A key's values that are the
same at every call (filters, caller) are quoted once and kept in its text; the values a call gives (ids,
entities) are quoted at each call.

A statement whose plan does not depend on its values (it reads or writes rows by their keys: the search's
head, its hits, replies, graph and eligibility look-ups; a save) is a *generic* :class:`Query`: planning it
cost PostgreSQL as much as running it, or more (0.1-0.5 ms a statement, ~0.9 ms of a search's ~1.2 ms of
PostgreSQL planning), so it is prepared once per connection, under a name given by its text with every value
a parameter (the same for every tenant) and the parameters' types, and runs on PostgreSQL's generic plan.
The change feeds (the rows stamped after a sequence number) are generic too, their range bounded on both
sides so that PostgreSQL's plan without values is the index's (core.changes.feed_range). A call holding one
goes out through libpq's pipeline (one round trip still, driven
from here, not by psycopg's Python pipeline): the other statements as unnamed ones, planned for their values,
then the generic ones between two ``SET LOCAL plan_cache_mode`` (the first joined to the transaction's opening
setting when the call opens it and holds no other statement, the second left out when the ``COMMIT`` follows,
which ends the first). A call that begins the session's transaction sends the transaction's opening
(``BEGIN`` and the tenant, core.db) first, in that pipeline or at the head of its simple query, and a call asked
to commit sends the ``COMMIT`` last: a request whose transaction is one call (a get by id) costs one round trip,
a search's opening none of its own. Protocol-level prepared
statements, as psycopg's own are: PgBouncer (1.21+, with ``max_prepared_statements``) keeps them apart per
server connection; SQL-level ``PREPARE`` it would not.

Tenancy: the ORM hook that adds ``tenant_id = :tenant`` to ORM queries (core.db) does not see driver
SQL, so every statement compiled here must carry the tenant condition itself, on every tenant table
it reads; builders take the tenant id for that reason.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import psycopg
from opentelemetry import trace
from psycopg import generators, pq
from psycopg import sql as literal_sql
from psycopg.adapt import PyFormat, Transformer
from sqlalchemy import ARRAY, Executable, Text, bindparam
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from core.db import driver_connection
from core.dbwaits import (
    AnswerTimeout,
    BoundedConnection,
    Opening,
    client_encoding,
    opening_deferred,
    run_simple,
    send_simple,
    simple_results,
)
from core.tracing import tracing_enabled

CACHE_ENTRIES = 1024
_tracer = trace.get_tracer("engram.sql")
_dialect = postgresql.psycopg.dialect()  # type: ignore[attr-defined]
# A parameter of the compiled SQL (psycopg's pyformat), or an escaped percent sign.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
Split = tuple[tuple[str, ...], tuple[str, ...]]  # SQL pieces, and the parameter between each two


class _Statement:
    """A key's compiled SQL split at its parameters, and the parameter values fixed when it was built."""

    __slots__ = ("pieces", "names", "fixed", "given", "_prepared", "_typed")

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
        self._prepared: Prepared | None = None
        self._typed: dict[tuple[int, ...], bytes] = {}

    def prepared(self) -> Prepared:
        """The statement with every value a parameter ($1, $2, ...: one per distinct name, in order of first
        use): the same text for every tenant."""
        if self._prepared is None:
            order: dict[str, int] = {}
            parts = [self.pieces[0]]
            for name, piece in zip(self.names, self.pieces[1:], strict=True):
                parts += (f"${order.setdefault(name, len(order) + 1)}", piece)
            self._prepared = Prepared("".join(parts).encode(), tuple(order))
        return self._prepared

    def name_for(self, types: tuple[int, ...]) -> bytes:
        """The name the statement is prepared under with parameters of these types: a digest of its text and
        them (as psycopg keys its own: a value of another type, a number past bigint say, gets a statement of
        its own)."""
        name = self._typed.get(types)
        if name is None:
            text = self.prepared().sql + repr(types).encode()
            name = self._typed[types] = b"engram_" + hashlib.blake2b(text, digest_size=10).hexdigest().encode()
        return name

    def values(self, values: dict[str, Any]) -> list[Any]:
        """The value of each parameter of :meth:`prepared`: the call's, else the fixed one."""
        fixed = self.fixed
        return [values[name] if name in values else fixed[name] for name in self.prepared().params]

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


class Prepared(NamedTuple):
    sql: bytes
    params: tuple[str, ...]  # the name of each parameter, $1 first


class Query(NamedTuple):
    """A statement of a call: its key (the name and every value that shapes it), how to build it, the values of
    this call's parameters, and whether its plan is the same whatever those values (``generic``, see the
    module's text: only for statements that read rows by their keys)."""

    key: Hashable
    build: Callable[[], Executable]
    values: dict[str, Any]
    generic: bool = False


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


def _without_nul(value: str) -> str:
    """``value``, refused with psycopg's own error when it holds a NUL: libpq would cut a literal there, and
    PostgreSQL's text fields cannot hold one."""
    if "\x00" in value:
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return value


def quoter(driver: psycopg.Connection[Any]) -> Callable[[Any], str]:
    """A function writing a value as an SQL literal for ``driver``'s connection.

    Strings and lists of strings (as the text of an array) are quoted by libpq; integers are written out;
    floats are cast to float8 (as psycopg sends them); anything else is psycopg's own literal of it."""
    escape, encoding = pq.Escaping(driver.pgconn).escape_literal, client_encoding(driver)

    def quoted(value: str) -> str:
        return escape(_without_nul(value).encode(encoding)).decode(encoding)

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


def run(
    session: Session,
    query: Query,
    *,
    commit: bool = False,
    before_commit: Callable[[list[Sequence[Any]]], None] | None = None,
) -> Sequence[Any]:
    """Rows of the statement ``query`` names; ``commit``: then commit the session (see :func:`run_many`)."""
    return run_many(session, [query], commit=commit, before_commit=before_commit)[0]


def run_many(
    session: Session,
    queries: Sequence[Query],
    *,
    meanwhile: Callable[[], None] | None = None,
    commit: bool = False,
    before_commit: Callable[[list[Sequence[Any]]], None] | None = None,
) -> list[Sequence[Any]]:
    """The rows of each of several statements, sent together: one round trip.

    ``meanwhile`` runs once they are sent, before their rows are read; it must not use the session. When the
    call begins the session's transaction, its opening (``BEGIN`` and the tenant) goes in the same round trip.
    ``commit``: the session is committed after the statements, its ``COMMIT`` in the same round trip too when
    the session has nothing of its own to flush (a statement failing before it leaves the transaction to be
    rolled back as usual). ``before_commit`` is given the rows before the call returns, and so before the
    session commits when it does (what the caller notes of the statements' outcome for the session's commit
    hooks, such as the jobs they wrote).
    """
    with opening_deferred() as opening:
        driver: Any = driver_connection(session)
    # (The COMMIT joins only statements of engram's own connections that go out in a pipeline.)
    ends = commit and not (session.new or session.dirty or session.deleted) and isinstance(driver, BoundedConnection)
    if not tracing_enabled():
        results = _exchange(driver, queries, meanwhile, opening, ends)
    else:
        with _client_span(queries):
            results = _exchange(driver, queries, meanwhile, opening, ends)
    if before_commit is not None:
        before_commit(results)
    if commit:
        session.commit()  # (after a COMMIT sent above, psycopg sees no transaction and sends nothing)
    return results


def _exchange(
    driver: Any,
    queries: Sequence[Query],
    meanwhile: Callable[[], None] | None,
    opening: list[Opening],
    commit: bool,
) -> list[Sequence[Any]]:
    if isinstance(driver, BoundedConnection) and (commit or any(query.generic for query in queries)):
        return _pipelined(driver, queries, meanwhile, opening, commit)
    # (Elsewhere than on engram's own connections, which know what they have prepared, all are planned afresh.)
    # The transaction's opening, if left to this call, leads the same simple query.
    quote = quoter(driver)
    try:
        texts = [_compiled(key, build).text(values, quote) for key, build, values, _ in queries]
    except BaseException:
        _open_unsent(driver, opening)
        raise
    opens = _opening_statements(opening)
    send(driver, ";\n".join([*opens, *texts]))
    try:
        if meanwhile is not None:
            meanwhile()
    finally:
        results = receive(driver)
    return results[len(opens) :]


def _opening_statements(opening: list[Opening], *settings: str) -> list[str]:
    """The statements of the transaction's opening left to this call (none, when it opens none), with
    ``settings`` beside its own."""
    return [statement for each in opening for statement in each.statements(*settings)]


def _open_unsent(driver: Any, opening: list[Opening]) -> None:
    """A call that failed before sending (a value refused) still opens the transaction the session began, as
    it would have been opened without the call."""
    if opening:
        run_simple(driver, "; ".join(_opening_statements(opening)))


@contextmanager
def _client_span(queries: Sequence[Query]) -> Iterator[None]:
    """While tracing is on: a client span for the call's round trip, as core.tracing gives each statement
    SQLAlchemy runs (its text with placeholders, never the values; several statements are one batch)."""
    texts = [_compiled(key, build).prepared().sql.decode() for key, build, _, _ in queries]
    operation = (texts[0].split(None, 1)[0].upper() if texts[0].strip() else "SQL") if len(texts) == 1 else "BATCH"
    attributes: dict[str, str | int] = {
        "db.system.name": "postgresql",
        "db.operation.name": operation,
        "db.query.text": ";\n".join(texts)[:2000],
    }
    if len(texts) > 1:
        attributes["db.operation.batch.size"] = len(texts)
    with _tracer.start_as_current_span(operation, kind=trace.SpanKind.CLIENT, attributes=attributes) as span:
        try:
            yield
        except BaseException as exc:
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise


def send(driver: psycopg.Connection[Any], statements: str) -> None:
    """Send ``statements`` (several, ``;``-separated) as one simple query; read their rows with ``receive``.
    Until then the connection is busy: nothing else may use it."""
    send_simple(driver, statements)


def receive(driver: psycopg.Connection[Any]) -> list[Sequence[Any]]:
    """The rows of each statement ``send`` sent, in order (none for a statement that returns no rows); raises
    the first statement's error, after which PostgreSQL runs none of the rest. Every wait is bounded
    (core.dbwaits)."""
    transformer = driver.row_loader if isinstance(driver, BoundedConnection) else Transformer(driver)
    rows: list[Sequence[Any]] = []
    for result in simple_results(driver):
        transformer.set_pgresult(result)
        rows.append(transformer.load_rows(0, result.ntuples, tuple))
    return rows


_GENERIC_PLANS = b"SET LOCAL plan_cache_mode = force_generic_plan"
# The same as one more setting of a transaction's opening (core.dbwaits.Opening).
_GENERIC_SETTING = "set_config('plan_cache_mode', 'force_generic_plan', true)"
_CUSTOM_PLANS = b"SET LOCAL plan_cache_mode = force_custom_plan"  # core.db's setting, for what follows


_INT8, _NUMERIC, _FLOAT8, _BOOL, _TEXT_ARRAY, _UNKNOWN = 20, 1700, 701, 16, 1009, 0
_DUMPED_TYPES = {float: _FLOAT8, bool: _BOOL}

Param = tuple[bytes | None, int]  # a parameter's text form, and the type it is declared with (0: inferred)


def param_form(driver: BoundedConnection) -> Callable[[Any], Param]:
    """A function giving a value as a parameter: its text form (a list of strings as the text of an array;
    anything but strings, integers, lists of strings and None by psycopg's text dumpers) and its declared
    type, as psycopg declares it (bigint, numeric past it, float8, boolean, text[]; a parameter used twice is
    then one type): strings and the rest PostgreSQL infers from the SQL."""
    encoding = driver.encoding
    transformer: Any = None

    def form(value: Any) -> Param:
        nonlocal transformer
        kind = type(value)
        if kind is str:
            return _without_nul(value).encode(encoding), _UNKNOWN
        if kind is int:
            return str(value).encode(), _INT8 if -(2**63) <= value < 2**63 else _NUMERIC
        if value is None:
            return None, _UNKNOWN
        if kind is list:
            try:
                return _without_nul(array_literal(value)).encode(encoding), _TEXT_ARRAY
            except TypeError:  # an item that is not a string: psycopg's text of the list
                pass
        if transformer is None:
            transformer = Transformer(driver)
        dumped = transformer.get_dumper(value, PyFormat.TEXT).dump(value)
        return (None if dumped is None else bytes(dumped)), _DUMPED_TYPES.get(kind, _UNKNOWN)

    return form


def _pipelined(
    driver: BoundedConnection,
    queries: Sequence[Query],
    meanwhile: Callable[[], None] | None,
    opening: list[Opening],
    commit: bool,
) -> list[Sequence[Any]]:
    """:func:`run_many` on engram's connections for calls holding a generic statement, opening a transaction or
    ending one: one libpq pipeline, one sync, one round trip."""
    prepared = driver.prepared_statements
    encoding = driver.encoding
    form = param_form(driver)
    # What each command sent is, in order: the transaction's opening, the other statements (planned for their
    # values), then the generic ones between the two settings (the first joined to the opening, the second left
    # to the COMMIT, where they can be), each preceded by its PREPARE on a connection that lacks it, and the COMMIT.
    custom: list[tuple[int, bytes, list[int], list[bytes | None]]] = []
    generic: list[tuple[int, bytes, bytes, list[int], list[bytes | None]]] = []
    try:
        for i, (key, build, values, is_generic) in enumerate(queries):
            statement = _compiled(key, build)
            forms = [form(value) for value in statement.values(values)]  # (a bad value fails here, unsent)
            params, types = [param for param, _ in forms], [declared for _, declared in forms]
            text = statement.prepared().sql  # (UTF-8: written out again on a connection in another encoding)
            if encoding != "utf-8":
                text = text.decode().encode(encoding)
            if is_generic:
                generic.append((i, statement.name_for(tuple(types)), text, types, params))
            else:
                custom.append((i, text, types, params))
    except BaseException:
        _open_unsent(driver, opening)
        raise
    # Per command sent, what its result is: ("rows", query index, name if generic), ("prepare", name),
    # ("close", name) or ("set", None).
    slots: list[tuple[str, Any, Any]] = []
    stale = driver.stale_statements
    pgconn = driver.pgconn
    aside: BaseException | None = None  # what ``meanwhile`` raised: raised after the statements' bookkeeping
    # With no statement to plan for its values, the transaction's opening settings (its tenant) set the generic
    # plans too: one command less to wait for (a get by id, a save, a quiet tenant's head).
    folded = bool(generic) and not custom and bool(opening)
    opens = _opening_statements(opening, *((_GENERIC_SETTING,) if folded else ()))
    pgconn.enter_pipeline_mode()
    try:
        for opening_statement in opens:
            pgconn.send_query_params(opening_statement.encode(encoding), None)
            slots.append(("set", None, None))
        for i, text, types, params in custom:
            pgconn.send_query_params(text, params, param_types=types)
            slots.append(("rows", i, None))
        if generic and not folded:
            pgconn.send_query_params(_GENERIC_PLANS, None)
            slots.append(("set", None, None))
        preparing: set[bytes] = set()
        for i, name, text, types, params in generic:
            if name not in prepared and name not in preparing:
                if name in stale:
                    pgconn.send_close_prepared(name)
                    slots.append(("close", name, None))
                pgconn.send_prepare(name, text, param_types=types)
                slots.append(("prepare", name, None))
                preparing.add(name)
            pgconn.send_query_prepared(name, params)
            slots.append(("rows", i, name))
        if generic and not commit:  # (a COMMIT ends the SET LOCAL itself: one command less to wait for)
            pgconn.send_query_params(_CUSTOM_PLANS, None)
            slots.append(("set", None, None))
        if commit:
            pgconn.send_query_params(b"COMMIT", None)
            slots.append(("set", None, None))
        pgconn.pipeline_sync()
        driver.wait(generators.send(pgconn))
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException as error:
                aside = error
        results = _pipeline_results(driver, len(slots))
        pgconn.exit_pipeline_mode()
    except AnswerTimeout:
        raise  # (the connection is closed)
    except BaseException:
        if pgconn.status == pq.ConnStatus.OK and pgconn.pipeline_status != pq.PipelineStatus.OFF:
            pgconn.finish()  # left mid-exchange (an interrupt): what the connection holds is unknown
        raise
    rows: list[Sequence[Any]] = [()] * len(queries)
    first_error = None
    transformer = driver.row_loader
    for (kind, value, name), result in zip(slots, results, strict=True):
        ok = result.status not in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.PIPELINE_ABORTED)
        if result.status == pq.ExecStatus.FATAL_ERROR:
            first_error = first_error or result
            if kind == "rows" and name is not None:
                # A prepared statement that failed may fail again the same way (a plan whose result type a
                # migration changed): it is closed and prepared afresh at its next use.
                prepared.discard(name)
                stale.add(name)
        elif kind == "close" and ok:
            stale.discard(value)
        elif kind == "prepare" and ok:
            prepared.add(value)
        elif kind == "rows" and first_error is None:
            transformer.set_pgresult(result)
            rows[value] = transformer.load_rows(0, result.ntuples, tuple)
    if aside is not None:  # (the names it prepared are known, or the next PREPARE of one would fail)
        raise aside
    if first_error is not None:
        raise psycopg.errors.error_from_result(first_error, encoding=driver.encoding)
    return rows


def _pipeline_results(driver: psycopg.Connection[Any], commands: int) -> list[pq.abc.PGresult]:
    """One result per command sent (its error, if any), up to the pipeline's sync; each wait bounded
    (core.dbwaits)."""
    results: list[pq.abc.PGresult] = []
    while True:
        fetched = driver.wait(generators.fetch_many(driver.pgconn))
        if not fetched:
            raise psycopg.OperationalError("the pipeline ended without its sync")
        if fetched[0].status == pq.ExecStatus.PIPELINE_SYNC:
            if len(results) != commands:
                raise psycopg.OperationalError(f"{len(results)} results for {commands} commands")
            return results
        failed = [result for result in fetched if result.status == pq.ExecStatus.FATAL_ERROR]
        results.append(failed[0] if failed else fetched[0])


def clear_cache() -> None:
    with _lock:
        _cache.clear()
