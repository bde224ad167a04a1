"""Engines, the one session factory, and the places where tenancy is applied.

Tenancy is enforced twice. In the application: every table that holds tenant data inherits
:class:`TenantScoped`; a session opened with :func:`tenant_session` carries its tenant id in ``session.info``
and the ``do_orm_execute`` hook below adds ``tenant_id = :tenant`` to every ORM SELECT, UPDATE and DELETE
touching such a table. In PostgreSQL: the service connects as the app role (:data:`APP_ROLE`, no ownership, no
BYPASSRLS), every tenant table has a forced row-level security policy on the transaction-local setting
``engram.tenant_id`` (system mode: ``engram.system`` under the system role, see core.tenancy.rls), set at the
start of every transaction of a session (by the ``after_begin`` hook, or by :class:`EngramSession` for a
transaction core.sql's statements begin), so a raw statement that forgets the tenant condition still sees one
tenant only, and a pooled connection carries nothing into the next transaction.
A session with neither a tenant nor the explicit system mode of :func:`system_session` sees no tenant
data at all (fail closed).
"""

from __future__ import annotations

import hashlib
import hmac
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from sqlalchemy import BigInteger, ForeignKey, create_engine, event, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    ORMExecuteState,
    Session,
    declared_attr,
    mapped_column,
    sessionmaker,
    with_loader_criteria,
)
from sqlalchemy.pool import NullPool

from core.config import get_settings
from core.dbwaits import ANSWER_MARGIN_SECONDS, BoundedConnection, Opening, defer_opening, run_simple
from core.runtime import resolve_database_url

# The role a transaction of the app role switches to for the named system mode: owns nothing, cannot log
# in, has no BYPASSRLS; the app role is a member that does not inherit it (only `SET ROLE` reaches it).
# Defined here, where sessions switch to it; core.tenancy.rls creates it and grants it.
SYSTEM_ROLE = "engram_system"


class Base(DeclarativeBase):
    pass


class TenantScoped:
    """Mixin for every table holding one tenant's data."""

    @declared_attr
    def tenant_id(cls) -> Mapped[int]:  # noqa: N805 - declared_attr is a class-level hook
        return mapped_column(BigInteger, ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)


class TenantFilterMissing(RuntimeError):
    """A query touched tenant data from a session that names no tenant."""


# The role API and workers connect as; `engram migrate` (as the owner) creates it and its grants.
APP_ROLE = "engram_app"

_engine: Engine | None = None
_owner_engine: Engine | None = None
_factory: sessionmaker[EngramSession] | None = None
_lock = threading.Lock()
# PostgreSQL settings every new connection of this process gets (see limit_waits).
_session_settings: dict[str, str] = {}
# This process's statement budget when it set one (limit_waits), else the app role's default applies.
_statement_timeout_seconds: float | None = None


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and run them on psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def owner_database_url() -> str:
    """The URL migrations run with (the owner of the schema): ENGRAM_DATABASE_URL or `serve`'s."""
    url = get_settings().database_url
    if not url:
        url = resolve_database_url()
    return normalize_url(url)


def app_role_password(owner_url: str) -> str | None:
    """The app role's password when none is configured: derived from the owner's, so every process that
    knows the owner URL agrees on it without storing another secret; None when the owner has none (trust)."""
    password = make_url(owner_url).password
    if not password:
        return None
    return hmac.new(str(password).encode(), b"engram app role", hashlib.sha256).hexdigest()


def app_database_url() -> str:
    """The URL the service connects with: ENGRAM_APP_DATABASE_URL, else the owner URL as the app role."""
    explicit = get_settings().app_database_url
    if explicit:
        return normalize_url(explicit)
    owner = owner_database_url()
    url = make_url(owner)
    if url.username == APP_ROLE:
        return owner
    return url.set(username=APP_ROLE, password=app_role_password(owner)).render_as_string(hide_password=False)


def get_engine() -> Engine:
    """The service's engine, connected as the app role: row-level security applies to everything on it."""
    global _engine, _factory
    with _lock:
        if _engine is None:
            settings = get_settings()
            _engine = create_engine(
                app_database_url(),
                # A request holds at most one connection, and the API runs at most api_inflight requests
                # at once, so the pool covers them; a wait for a connection is bounded and ends in a 503.
                pool_size=settings.db_pool_size,
                max_overflow=4,
                pool_timeout=settings.db_pool_timeout_seconds,
                # No pre-ping: it costs a round trip per request. A connection broken by a database
                # restart fails one request with 503 and is discarded with the pool.
                pool_pre_ping=False,
                pool_recycle=1800,
            )
            event.listen(_engine, "do_connect", _connect_bounded)
            event.listen(_engine, "connect", _plan_each_statement)
            event.listen(_engine, "checkin", _back_to_process_bound)
            _factory = sessionmaker(bind=_engine, class_=EngramSession, expire_on_commit=False)
        return _engine


def get_owner_engine() -> Engine:
    """The schema owner's engine: migrations and DDL only (never tenant data, which its policies hide).

    Unpooled: a connection as the owner (who bypasses nothing, but may change the schema and the policies)
    closes as soon as its work is done, so no process that serves requests or runs jobs keeps one idle
    after migrating or building an index."""
    global _owner_engine
    with _lock:
        if _owner_engine is None:
            _owner_engine = create_engine(owner_database_url(), poolclass=NullPool)
        return _owner_engine


def _connect_bounded(_dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> BoundedConnection:
    """Connect as psycopg would, with every wait for the server bounded (core.dbwaits), the connection
    attempt included (a server that accepts TCP but never answers the startup)."""
    cparams.setdefault("connect_timeout", max(2, int(get_settings().db_connect_timeout_seconds)))
    connection = BoundedConnection.connect(*cargs, **cparams)
    connection.answer_timeout = _answer_timeout()
    return connection


def _answer_timeout() -> float:
    """How long this process waits for any one answer: its statement timeout (else the role's) + a margin."""
    seconds = _statement_timeout_seconds or get_settings().db_role_statement_timeout_seconds
    return seconds + ANSWER_MARGIN_SECONDS


def _back_to_process_bound(dbapi_connection: Any, _record: Any) -> None:
    """A connection returned to the pool forgets a longer budget one transaction took (allow_longer)."""
    if isinstance(dbapi_connection, BoundedConnection):
        dbapi_connection.answer_timeout = _answer_timeout()


def allow_longer(session: Session, *, seconds: float) -> None:
    """Give the rest of this transaction ``seconds`` per statement instead of the process's budget (an
    import of a whole export), on the server and in the client's bound alike."""
    connection = session.connection()
    connection.execute(text("SELECT set_config('statement_timeout', :v, true)"), {"v": f"{int(seconds * 1000)}ms"})
    driver = connection.connection.driver_connection
    if isinstance(driver, BoundedConnection):
        driver.answer_timeout = seconds + ANSWER_MARGIN_SECONDS


def _plan_each_statement(dbapi_connection: Any, _record: Any) -> None:
    """Plan every statement for its own parameters, never from a cached generic plan.

    psycopg prepares a statement once it has run five times on a connection, and PostgreSQL may then
    reuse one generic plan for every later tenant id. A plan made while a tenant's tables were small
    stays in use after they grow, until the next ANALYZE: `/v1/ops/coverage` measured 2.3 s at 5,000
    memories on such a plan (a nested loop over sequential scans) against 10 ms planned afresh. Tenants
    of very different sizes share every statement here, so a custom plan is the safe default; it costs
    ~0.1-0.4 ms of planning per statement. The statements that only read or write rows by their keys, whose
    plan is the same for every tenant (a search's look-ups, a save), run on a generic plan (core.sql).
    """
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_custom_plan")
        for name, value in _session_settings.items():
            cursor.execute(f"SET {name} = '{value}'")
    dbapi_connection.commit()


def limit_waits(
    *, lock_timeout_seconds: float, idle_in_transaction_seconds: float, statement_timeout_seconds: float
) -> None:
    """Bound what a connection of this process may wait on in PostgreSQL (the API calls this).

    A statement that runs longer than ``statement_timeout_seconds`` (the request's budget), or a row lock
    held by a slow writer past ``lock_timeout_seconds``, ends the statement (a 503 for the request); a
    transaction left idle longer than ``idle_in_transaction_seconds`` (a client that went away mid-request)
    is ended by the server instead of pinning locks and a connection; and a server that does not answer at
    all is given up on by the client just after the statement timeout (core.dbwaits). Workers keep the app
    role's longer defaults (`migrate` sets them). Applies to connections opened after the call: the pool
    is started afresh.
    """
    global _statement_timeout_seconds
    _statement_timeout_seconds = statement_timeout_seconds
    _session_settings["statement_timeout"] = f"{int(statement_timeout_seconds * 1000)}ms"
    _session_settings["lock_timeout"] = f"{int(lock_timeout_seconds * 1000)}ms"
    _session_settings["idle_in_transaction_session_timeout"] = f"{int(idle_in_transaction_seconds * 1000)}ms"
    with _lock:
        if _engine is not None:  # connections opened before (a test process) would keep the old bounds
            _engine.dispose()


def dispose_engine() -> None:
    global _engine, _owner_engine, _factory
    with _lock:
        for engine in (_engine, _owner_engine):
            if engine is not None:
                engine.dispose()
        _engine = _owner_engine = None
        _factory = None


def _session_factory() -> sessionmaker[EngramSession]:
    get_engine()
    assert _factory is not None
    return _factory


class EngramSession(Session):
    """engram's session: statements sent through core.sql run on a pooled connection of the session's own,
    without SQLAlchemy's connection and transaction objects, until the session needs the ORM.

    A request whose statements all go through core.sql (a get by id, a save, a search on warm caches) never
    needs SQLAlchemy's `Connection`, its transaction and their events: their bookkeeping was ~10% of a get's
    and a save's instructions (docs/benchmarks.md, Request CPU). Here core.sql asks :meth:`driver_connection`
    for the driver: checked out of the pool once, its transaction begun (and named to PostgreSQL, with the
    session's isolation level) on first use as by ``after_begin``. Committing, rolling back and closing end
    that transaction and give the connection back; ``before_commit``, ``after_commit`` and
    ``after_soft_rollback`` listeners run as they would. The first use of the ORM (a statement, a flush,
    ``connection()``) joins the same connection and transaction: :meth:`get_bind` gives SQLAlchemy a
    `Connection` over it, whose transaction the session begins, commits and rolls back as usual, and
    ``after_begin`` does not name it again.
    """

    _pooled: Any = None  # the pool's connection (core.sql's), while checked out
    _joined: Connection | None = None  # the ORM's Connection over it, once the ORM needed one

    def driver_connection(self) -> Any:
        """The driver connection core.sql sends on, in the session's transaction (begun here when none is)."""
        if self._joined is not None or self._transaction is not None:
            return self.connection().connection.driver_connection
        pooled = self._pooled
        if pooled is None:
            pooled = self._pooled = self._engine().raw_connection()
        driver = pooled.driver_connection
        if driver.pgconn.transaction_status == pq.TransactionStatus.IDLE:
            settings = _transaction_mode(self.info)
            if settings is not None:
                _set_mode(driver, settings, self.info.get(_ISOLATION), pooled.invalidate)
        return driver

    def joins_open_transaction(self, connection: Connection) -> bool:
        """Whether ``connection`` is the ORM's over a transaction core.sql's statements began (and named)."""
        if connection is not self._joined:
            return False
        return bool(self._pooled.driver_connection.pgconn.transaction_status != pq.TransactionStatus.IDLE)

    def get_bind(self, mapper: Any = None, **kw: Any) -> Engine | Connection:
        if self._pooled is None:
            return super().get_bind(mapper, **kw)
        if self._joined is None:
            self._joined = Connection(self._engine(), connection=self._pooled)
        return self._joined

    def _engine(self) -> Engine:
        bind = self.bind
        assert isinstance(bind, Engine), "an engram session is bound to its engine"
        return bind

    def _alone(self) -> bool:
        """Whether core.sql's connection is checked out and the ORM has not joined it."""
        return self._pooled is not None and self._joined is None

    def in_transaction(self) -> bool:
        if self._alone():
            driver = self._pooled.driver_connection
            if driver is not None and driver.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                return True
        return super().in_transaction()

    def _holds_orm_state(self) -> bool:
        """Whether the ORM holds anything in this session: a transaction of its own, or objects (loaded, new or
        deleted; a dirty one is among the loaded)."""
        return self._transaction is not None or bool(self._new or self._deleted or len(self.identity_map))

    def commit(self) -> None:
        if self._alone() and self._holds_orm_state():
            self.connection()  # the ORM joins core.sql's transaction, and commits it with its own
        if not self._alone():
            super().commit()
            self._give_back()
            return
        self.dispatch.before_commit(self)
        driver = self._pooled.driver_connection
        if driver.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            try:
                driver.commit()
            except psycopg.Error as exc:
                raise DBAPIError.instance("COMMIT", None, exc, psycopg.Error) from exc
        self._give_back()
        self.dispatch.after_commit(self)

    def rollback(self) -> None:
        if self._alone() and self._transaction is None:
            self._give_back()  # (the pool's reset rolls it back)
            self.dispatch.after_soft_rollback(self, None)  # type: ignore[arg-type]
            return
        super().rollback()
        self._give_back()

    def close(self) -> None:
        # SQLAlchemy's close resets what the session holds (its identity map, its new and deleted objects, its
        # transaction): ~3% of a get's instructions when it holds nothing, as after core.sql's statements alone.
        if self._holds_orm_state():
            super().close()
        self._give_back()

    def _give_back(self) -> None:
        """Return core.sql's connection to the pool, its transaction (if any left) rolled back there."""
        joined, pooled = self._joined, self._pooled
        self._joined = self._pooled = None
        if joined is not None:
            joined.close()
        elif pooled is not None:
            driver = pooled.driver_connection
            if driver is None or driver.closed:
                # As SQLAlchemy does on a disconnect: this connection is dropped, and every pooled one as old is
                # replaced at its next checkout (a restarted PostgreSQL broke them all: one request fails, not
                # one per idle connection).
                self._engine().pool._invalidate(pooled)
            pooled.close()


def driver_connection(session: Session) -> Any:
    """The psycopg connection of the session's transaction, for statements sent on the driver itself (core.sql,
    the search's look-ups): an engram session's own, without SQLAlchemy's `Connection` (:class:`EngramSession`);
    any other session's through SQLAlchemy."""
    if isinstance(session, EngramSession):
        return session.driver_connection()
    return session.connection().connection.driver_connection


@contextmanager
def tenant_session(tenant_id: int) -> Iterator[Session]:
    """A unit of work scoped to one tenant; commits on success, rolls back on error."""
    session = _session_factory()()
    session.info["tenant_id"] = tenant_id
    try:
        yield session
        # (A unit of work whose last statement carried its COMMIT, core.sql, has no transaction left: an empty
        # one would be begun and committed, with its hooks, for nothing.)
        if session.in_transaction():
            session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


T = TypeVar("T")

# What PostgreSQL ends a transaction with when it lost a race with another one: the transaction was rolled
# back whole, so running it again from the start is safe, and usually succeeds at once.
CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
WRITE_ATTEMPTS = 4


def is_conflict(exc: BaseException) -> bool:
    """A conflict, as SQLAlchemy raises it or as the driver does (statements on its connection: core.sql)."""
    return isinstance(exc, CONFLICTS) or (isinstance(exc, OperationalError) and isinstance(exc.orig, CONFLICTS))


def tenant_write(tenant_id: int, work: Callable[[Session], T], *, attempts: int = WRITE_ATTEMPTS) -> T:
    """Run ``work`` in a tenant transaction, again from the start when PostgreSQL ends it for a deadlock or
    a serialization failure. Writes take one lock order (core.changes.lock_tenant_writes), so a conflict is
    rare (another table's order, a trigger); the client sees it only when every attempt lost."""
    for attempt in range(1, attempts + 1):
        try:
            with tenant_session(tenant_id) as session:
                return work(session)
        except (OperationalError, psycopg.OperationalError) as exc:
            if attempt == attempts or not is_conflict(exc):
                raise
            time.sleep(random.uniform(0, 0.02 * 2**attempt))  # jitter: the two losers do not meet again
    raise AssertionError("unreachable")


@contextmanager
def system_session() -> Iterator[Session]:
    """A unit of work that deliberately spans tenants: the named system mode (operator views, reconcile,
    beat, metrics, authentication by key hash, tenant creation); PostgreSQL lets it see every tenant."""
    session = _session_factory()()
    session.info["all_tenants"] = True
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@contextmanager
def system_connection() -> Iterator[Connection]:
    """A Core connection in system mode, in one transaction (the outbox relay, index maintenance)."""
    with get_engine().begin() as connection:
        _name_transaction(connection, _SYSTEM_MODE)
        yield connection


# Transaction-local (`true`): PostgreSQL drops them at COMMIT or ROLLBACK, so a pooled connection never
# carries one transaction's tenant (or the system role) into the next. Literals, not parameters: the
# simple protocol is one round trip, and a tenant id is an int. System mode is the system role (whose
# policy alone reads `engram.system`) with the setting on: the app role's own policy is the tenant
# equality and nothing else, which is what keeps a tenant's statements cheap (core.tenancy.rls). Each mode is
# a list of set_config calls, run as one SELECT (_set_mode), to which core.sql may add its own settings.
_SYSTEM_MODE = f"set_config('role', '{SYSTEM_ROLE}', true), set_config('engram.system', 'on', true)"


def _tenant_mode(tenant_id: int) -> str:
    return f"set_config('engram.tenant_id', '{int(tenant_id)}', true)"


# Leaving system mode inside a transaction (scope_to_tenant): back to the connecting role, setting off.
_LEAVE_SYSTEM_MODE = "set_config('role', 'none', true), set_config('engram.system', '', true)"


def _transaction_mode(info: dict[str, Any]) -> str | None:
    """The settings that name a session's transactions to PostgreSQL: its tenant, else the system mode, else
    none (a session with neither sees no tenant data)."""
    tenant_id = info.get("tenant_id")
    if tenant_id is not None:
        return _tenant_mode(tenant_id)
    if info.get("all_tenants"):
        return _SYSTEM_MODE
    return None


@event.listens_for(Session, "after_begin")
def _set_transaction_tenant(session: Session, _transaction: Any, connection: Connection) -> None:
    """Name the transaction's tenant (or system mode) to PostgreSQL before any statement of it runs."""
    if isinstance(session, EngramSession) and session.joins_open_transaction(connection):
        return  # (begun by core.sql's statements, which named it: the ORM joins it)
    settings = _transaction_mode(session.info)
    if settings is not None:
        _name_transaction(connection, settings, session.info.get(_ISOLATION))


_ISOLATION = "engram_isolation_level"
SNAPSHOT = "REPEATABLE READ"


def read_one_snapshot(session: Session) -> None:
    """Each transaction the session begins from now on reads one snapshot (``REPEATABLE READ``), named in its
    ``BEGIN``: unlike SQLAlchemy's isolation option on ``session.connection()``, this neither begins the
    transaction at once (its opening goes with its first statement, core.dbwaits.opening_deferred) nor sets
    and resets the level on the driver's connection. A transaction already begun keeps its level."""
    session.info[_ISOLATION] = SNAPSHOT


def _name_transaction(connection: Connection, settings: str, level: str | None = None) -> None:
    """:func:`_set_mode` on a SQLAlchemy connection."""
    _set_mode(connection.connection.driver_connection, settings, level, connection.invalidate)


def _set_mode(driver: Any, settings: str, level: str | None, invalidate: Callable[[BaseException], None]) -> None:
    """Run ``SELECT <settings>`` (set_config calls) at the start of the transaction without a round trip of its
    own.

    psycopg opens a transaction lazily, with a `BEGIN` of its own round trip before the first statement.
    When it is about to, this sends ``BEGIN; <statement>`` as one simple query through libpq instead:
    the server is then in the transaction, so psycopg sends no `BEGIN` (it decides by the server's
    transaction status, as it does for COMMIT and ROLLBACK), and the setting cost no extra round trip.
    When the transaction begins for a statement core.sql is about to send, the two go with it instead, in the
    same round trip (core.dbwaits.opening_deferred).
    Otherwise (already in a transaction, or a connection that is read-only or deferrable, which engram's
    engines never make) the statement goes through psycopg as usual, ``level`` unused. Never prepared either
    way: it has no parameters.
    """
    statement = f"SELECT {settings}"
    plain_begin = driver.read_only is None and driver.deferrable is None
    if driver.autocommit or not plain_begin or driver.pgconn.transaction_status != pq.TransactionStatus.IDLE:
        driver.execute(statement, prepare=False)
        return
    # The session's level (read_one_snapshot), else the one SQLAlchemy names on every pooled connection
    # (READ COMMITTED by default): psycopg would begin with that, and so does this.
    if level is None and driver.isolation_level is not None:
        level = driver.isolation_level.name.replace("_", " ")
    begin = "BEGIN" if level is None else f"BEGIN ISOLATION LEVEL {level}"
    if defer_opening(driver, Opening(begin, settings)):
        return  # core.sql sends them with the statements it is about to send (core.dbwaits.opening_deferred)
    try:
        run_simple(driver, f"{begin}; {statement}")
    except psycopg.Error as exc:
        # Raised from a session hook, which SQLAlchemy does not wrap: wrap it as a statement's error would
        # be (the API answers those with a 503), and drop a connection the bound closed.
        if driver.closed:
            invalidate(exc)
        raise DBAPIError.instance(statement, None, exc, psycopg.Error, connection_invalidated=driver.closed) from exc


def _touches_tenant_data(state: ORMExecuteState) -> bool:
    for mapper in state.all_mappers:
        if issubclass(mapper.class_, TenantScoped):
            return True
    return False


@event.listens_for(Session, "do_orm_execute")
def _apply_tenant_filter(state: ORMExecuteState) -> None:
    if not (state.is_select or state.is_update or state.is_delete):
        return
    if state.is_column_load or state.is_relationship_load:
        return
    info: dict[str, Any] = state.session.info
    tenant_id = info.get("tenant_id")
    if tenant_id is None:
        if info.get("all_tenants") or not _touches_tenant_data(state):
            return
        raise TenantFilterMissing("query on tenant data from a session without a tenant")
    state.statement = state.statement.options(
        with_loader_criteria(
            TenantScoped,
            lambda cls: cls.tenant_id == tenant_id,
            include_aliases=True,
        )
    )


def scope_to_tenant(session: Session, tenant_id: int) -> Session:
    """Narrow a system session to one tenant (a worker running one tenant's job), at once in PostgreSQL
    too when a transaction is open (a later transaction is named by ``after_begin``)."""
    session.info.pop("all_tenants", None)
    session.info["tenant_id"] = tenant_id
    if session.in_transaction():
        _name_transaction(session.connection(), f"{_tenant_mode(tenant_id)}, {_LEAVE_SYSTEM_MODE}")
    return session
