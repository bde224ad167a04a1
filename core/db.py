"""Engine, the one session factory, and the single place where the tenant filter is applied.

Every table that holds tenant data inherits :class:`TenantScoped`. A session opened with
:func:`tenant_session` carries its tenant id in ``session.info``; the ``do_orm_execute`` hook below adds
``tenant_id = :tenant`` to every ORM SELECT, UPDATE and DELETE touching such a table, so a query written
later cannot forget it. A session with neither a tenant nor an explicit ``all_tenants`` flag refuses to
read tenant data at all (fail closed).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, create_engine, event
from sqlalchemy.engine import Engine
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

from core.config import get_settings


class Base(DeclarativeBase):
    pass


class TenantScoped:
    """Mixin for every table holding one tenant's data."""

    @declared_attr
    def tenant_id(cls) -> Mapped[int]:  # noqa: N805 - declared_attr is a class-level hook
        return mapped_column(BigInteger, ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)


class TenantFilterMissing(RuntimeError):
    """A query touched tenant data from a session that names no tenant."""


_engine: Engine | None = None
_factory: sessionmaker[Session] | None = None
_lock = threading.Lock()
# PostgreSQL settings every new connection of this process gets (see limit_waits).
_session_settings: dict[str, str] = {}


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and run them on psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def get_engine() -> Engine:
    global _engine, _factory
    with _lock:
        if _engine is None:
            url = get_settings().database_url
            if not url:
                from core.runtime import resolve_database_url

                url = resolve_database_url()
            settings = get_settings()
            _engine = create_engine(
                normalize_url(url),
                # A request holds at most one connection, and the API runs at most api_max_inflight requests
                # at once, so the pool covers them; a wait for a connection is bounded and ends in a 503.
                pool_size=settings.db_pool_size,
                max_overflow=4,
                pool_timeout=settings.db_pool_timeout_seconds,
                # No pre-ping: it costs a round trip per request. A connection broken by a database
                # restart fails one request with 503 and is discarded with the pool.
                pool_pre_ping=False,
                pool_recycle=1800,
            )
            event.listen(_engine, "connect", _plan_each_statement)
            _factory = sessionmaker(bind=_engine, expire_on_commit=False)
        return _engine


def _plan_each_statement(dbapi_connection: Any, _record: Any) -> None:
    """Plan every statement for its own parameters, never from a cached generic plan.

    psycopg prepares a statement once it has run five times on a connection, and PostgreSQL may then
    reuse one generic plan for every later tenant id. A plan made while a tenant's tables were small
    stays in use after they grow, until the next ANALYZE: `/v1/ops/coverage` measured 2.3 s at 5,000
    memories on such a plan (a nested loop over sequential scans) against 10 ms planned afresh. Tenants
    of very different sizes share every statement here, so a custom plan is the safe default; it costs
    ~0.1 ms of planning per statement (~0.3 ms per search).
    """
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_custom_plan")
        for name, value in _session_settings.items():
            cursor.execute(f"SET {name} = '{value}'")
    dbapi_connection.commit()


def limit_waits(*, lock_timeout_seconds: float, idle_in_transaction_seconds: float) -> None:
    """Bound what a connection of this process may wait on in PostgreSQL (the API calls this).

    A row lock held by a slow writer ends the waiting statement after ``lock_timeout_seconds`` (a 503 for
    the request), and a transaction left idle longer than ``idle_in_transaction_seconds`` (a client that
    went away mid-request) is ended by the server instead of pinning locks and a connection. Workers and
    migrations keep PostgreSQL's defaults: their waits are part of their job. Applies to connections
    opened after the call, so it is made before the first one.
    """
    _session_settings["lock_timeout"] = f"{int(lock_timeout_seconds * 1000)}ms"
    _session_settings["idle_in_transaction_session_timeout"] = f"{int(idle_in_transaction_seconds * 1000)}ms"


def dispose_engine() -> None:
    global _engine, _factory
    with _lock:
        if _engine is not None:
            _engine.dispose()
        _engine = None
        _factory = None


def _session_factory() -> sessionmaker[Session]:
    get_engine()
    assert _factory is not None
    return _factory


@contextmanager
def tenant_session(tenant_id: int) -> Iterator[Session]:
    """A unit of work scoped to one tenant; commits on success, rolls back on error."""
    session = _session_factory()()
    session.info["tenant_id"] = tenant_id
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@contextmanager
def system_session() -> Iterator[Session]:
    """A unit of work that deliberately spans tenants (workers, operators, migrations of data)."""
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
    """Narrow a system session to one tenant (a worker running one tenant's job)."""
    session.info.pop("all_tenants", None)
    session.info["tenant_id"] = tenant_id
    return session
