"""Every wait for PostgreSQL is bounded: by the server when it is up, by the client when it is not.

Three bounds, from the outside in:

- the app role's defaults (``ALTER ROLE ... SET``, applied by `migrate` after the role is made): a statement,
  a lock wait and an idle transaction of any process connecting as the app role end after a while, even in
  a process that sets nothing itself (a CLI command, an MCP server);
- each process's own settings on every new connection (core.db.limit_waits): the API's are short, a
  request's budget, so a slow statement or a lock held elsewhere ends in a 503 with ``Retry-After``;
- the client's own bound (:class:`BoundedConnection`): a server that accepts bytes but answers nothing (a
  stopped or frozen PostgreSQL, a dead network path) cannot enforce its timeouts, so every wait for an
  answer on a connection gives up ``ANSWER_MARGIN_SECONDS`` after the statement timeout would have ended it,
  closes the connection (its state is unknown) and raises :class:`AnswerTimeout`. The server's own timeout
  normally fires first, with a clean error on a connection that stays usable.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

import psycopg
from psycopg import generators, pq
from psycopg.abc import PQGen
from psycopg.abc import Transformer as RowLoader
from psycopg.adapt import Transformer
from sqlalchemy import text
from sqlalchemy.engine import Connection

log = logging.getLogger("engram.db")

# How much longer than its statement timeout the client waits for an answer before it takes the server for
# hung: the server's own timeout, which leaves the connection usable, gets to answer first.
ANSWER_MARGIN_SECONDS = 0.5


class AnswerTimeout(psycopg.OperationalError):
    """The database sent no answer within the bound; the connection was closed (its state is unknown)."""


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server ends after ``answer_timeout`` seconds."""

    answer_timeout: float | None = None
    _statements: set[bytes] | None = None
    _stale: set[bytes] | None = None

    @property
    def prepared_statements(self) -> set[bytes]:
        """The names of the statements engram prepared on this connection itself (core.sql); psycopg's own are
        not among them."""
        if self._statements is None:
            self._statements = set()
        return self._statements

    @property
    def stale_statements(self) -> set[bytes]:
        """Names engram prepared whose statement failed since (PostgreSQL's "cached plan must not change result
        type" after a migration, say): closed on the server before they are prepared again."""
        if self._stale is None:
            self._stale = set()
        return self._stale

    _rows: RowLoader | None = None

    @property
    def row_loader(self) -> RowLoader:
        """A transformer kept for the connection's life that loads core.sql's result rows: the loader of each
        column type is looked up once per connection, not at every call (nothing registers loaders on engram's
        connections after they open; a cursor's own registrations stay with the cursor)."""
        if self._rows is None:
            self._rows = Transformer(self)
        return self._rows

    _encoding: str | None = None

    @property
    def encoding(self) -> str:
        """The Python codec of the connection's client encoding, read once for the connection's life (psycopg's
        ``info.encoding`` builds a ConnectionInfo and asks libpq each time: ~5 µs, twice a round trip). It is
        set when the connection opens; nothing in engram sets ``client_encoding`` after that."""
        if self._encoding is None:
            self._encoding = self.info.encoding
        return self._encoding

    def _deallocate(self, name: bytes | None) -> PQGen[None]:
        # psycopg drops every prepared statement of the session (``DEALLOCATE ALL``) at a rollback and after
        # a DROP or ALTER, when it had prepared some itself: engram's go with them.
        if name is None:
            for names in (self._statements, self._stale):
                if names:
                    names.clear()
        return super()._deallocate(name)

    def wait(self, gen: PQGen[Any], interval: float = 0.1, timeout: float | None = None) -> Any:
        bound = timeout if timeout is not None else self.answer_timeout
        if bound is None:
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, bound)
        except psycopg.errors._WaitTimeout:
            if timeout is not None:  # the caller's own timeout (notifies): theirs to handle
                raise
            # Mid-statement, the protocol state is unknown: the connection cannot be used again.
            self.pgconn.finish()
            raise AnswerTimeout(f"the database did not answer within {bound:g} s") from None


class Opening(NamedTuple):
    """A transaction's opening left to the caller: its ``BEGIN`` and its settings (``set_config`` calls: the
    tenant or system mode, core.db), which go as one ``SELECT`` of them, with any the caller adds."""

    begin: str
    settings: str

    def statements(self, *more: str) -> list[str]:
        return [self.begin, "SELECT " + ", ".join((self.settings, *more))]


_opening: ContextVar[list[Opening] | None] = ContextVar("engram_deferred_opening", default=None)


@contextmanager
def opening_deferred() -> Iterator[list[Opening]]:
    """Within it, a transaction that begins on an engram connection (:class:`BoundedConnection`) does not send
    its opening (``BEGIN`` and the transaction's tenant or system mode, core.db) at once: it is left in the list
    it yields, and the caller sends its statements ahead of its own first statements, in one round trip
    (core.sql). The caller must send them before anything else uses the connection."""
    holder: list[Opening] = []
    token = _opening.set(holder)
    try:
        yield holder
    finally:
        _opening.reset(token)


def defer_opening(driver: psycopg.Connection[Any], opening: Opening) -> bool:
    """Leave a transaction's ``opening`` to the caller inside :func:`opening_deferred` (True), else False: the
    caller sends it itself."""
    holder = _opening.get()
    if holder is None or holder or not isinstance(driver, BoundedConnection):
        return False
    holder.append(opening)
    return True


def client_encoding(driver: psycopg.Connection[Any]) -> str:
    """The Python codec of ``driver``'s client encoding (an engram connection's, as it keeps it)."""
    return driver.encoding if isinstance(driver, BoundedConnection) else driver.info.encoding


def send_simple(driver: psycopg.Connection[Any], statements: str) -> None:
    """Send ``statements`` (several, `;`-separated) as one simple query, without waiting for the results
    (:func:`simple_results` reads them). Until then the connection is busy: nothing else may use it."""
    driver.pgconn.send_query(statements.encode(client_encoding(driver)))
    driver.pgconn.flush()  # (the rest, if any, goes out while the results are awaited)


def simple_results(driver: psycopg.Connection[Any]) -> list[pq.abc.PGresult]:
    """The results of what :func:`send_simple` sent, one per statement, waited for through the connection's
    ``wait`` (so :class:`BoundedConnection`'s bound applies); raises the first statement's error, after which
    PostgreSQL ran none of the rest."""
    results = driver.wait(generators.execute(driver.pgconn))
    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(result, encoding=client_encoding(driver))
    return results


def run_simple(driver: psycopg.Connection[Any], statement: str) -> None:
    """Send ``statement`` (several, `;`-separated) as one simple query and wait, bounded, for its results.

    The non-blocking twin of ``PQexec``: a blocking libpq call waits for a hung server for ever."""
    send_simple(driver, statement)
    simple_results(driver)


def _interval(seconds: float) -> str:
    return f"{int(seconds * 1000)}ms"


def bound_role_waits(
    connection: Connection,
    *,
    role_name: str,
    statement_timeout_seconds: float,
    lock_timeout_seconds: float,
    idle_in_transaction_seconds: float,
) -> bool:
    """Make the bounds the app role's defaults; False (and a warning) when the owner may not alter it."""
    role = connection.execute(text("SELECT quote_ident(:r)"), {"r": role_name}).scalar()
    settings = {
        "statement_timeout": _interval(statement_timeout_seconds),
        "lock_timeout": _interval(lock_timeout_seconds),
        "idle_in_transaction_session_timeout": _interval(idle_in_transaction_seconds),
    }
    savepoint = connection.begin_nested()
    try:
        for name, value in settings.items():
            connection.execute(text(f"ALTER ROLE {role} SET {name} = '{value}'"))
    except Exception as exc:  # noqa: BLE001 - a role managed by the operator: tell, do not fail the migration
        savepoint.rollback()
        log.warning("could not set the wait bounds of role %s (%s); set them as its operator", role_name, exc)
        return False
    savepoint.commit()
    return True
