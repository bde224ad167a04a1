"""engram's sessions (core.db.EngramSession): work that goes through core.sql alone runs on a pooled connection
without SQLAlchemy's `Connection` and transaction; the ORM, when used, joins that same transaction."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy import text, update
from sqlalchemy.orm import Session

from core import sql
from core.db import get_engine, read_one_snapshot, tenant_session
from core.memories.models import Memory
from tests.helpers.events import listening


def _save(client, tenant, content: str) -> str:  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json={"content": content}, headers=tenant.headers())
    assert response.status_code == 201, response.text
    return str(response.json()["memory_id"])


def _bump(tenant_id: int, memory_id: str) -> sql.Query:
    """A core.sql write: the memory's access count, plus one."""

    def build():  # type: ignore[no-untyped-def]
        return text(
            "UPDATE memories SET access_count = access_count + 1 WHERE tenant_id = :t AND id = :id "
            "RETURNING access_count"
        )

    return sql.Query("test-session-bump", build, {"t": tenant_id, "id": memory_id}, generic=True)


def _access_count(tenant_id: int, memory_id: str) -> int:
    with tenant_session(tenant_id) as session:
        count = session.execute(text("SELECT access_count FROM memories WHERE id = :id"), {"id": memory_id}).scalar()
    return int(count)


_TRANSACTION = sql.Query(
    "test-session-transaction",
    lambda: text(
        "SELECT txid_current(), current_setting('engram.tenant_id', true), current_setting('transaction_isolation')"
    ),
    {},
)


@contextmanager
def _this_thread_pool() -> Iterator[dict[str, int]]:
    """Counts of this thread's SQLAlchemy connections and pool checkouts and checkins while inside (the
    in-process API's threads may use the pool meanwhile: theirs are not counted)."""
    me = threading.get_ident()
    counts = {"connections": 0, "checkouts": 0, "checkins": 0}

    def counter(name: str) -> Any:
        def count(*_args: Any) -> None:
            if threading.get_ident() == me:
                counts[name] += 1

        return count

    engine = get_engine()
    with (
        listening(engine, engine_connect=counter("connections")),
        listening(engine.pool, checkout=counter("checkouts"), checkin=counter("checkins")),
    ):
        yield counts


def test_a_unit_of_core_sql_statements_takes_one_pooled_connection_and_no_sqlalchemy_connection(client, tenant):
    memory_id = _save(client, tenant, "read without the ORM")
    with _this_thread_pool() as counts:
        with tenant_session(tenant.tenant_id) as session:
            assert sql.run(session, _bump(tenant.tenant_id, memory_id), commit=True) == [(1,)]
            assert not session.in_transaction()
            ((_txid, tenant_setting, _level),) = sql.run(session, _TRANSACTION)  # a second transaction
            assert tenant_setting == str(tenant.tenant_id)
            assert session.in_transaction()
    assert counts == {"connections": 0, "checkouts": 2, "checkins": 2}
    assert _access_count(tenant.tenant_id, memory_id) == 1


def test_the_orm_joins_the_transaction_core_sql_began_with_its_tenant_and_level(client, tenant):
    with _this_thread_pool() as counts:
        with tenant_session(tenant.tenant_id) as session:
            read_one_snapshot(session)
            ((txid, tenant_setting, level),) = sql.run(session, _TRANSACTION)
            assert (tenant_setting, level) == (str(tenant.tenant_id), "repeatable read")
            orm = session.execute(text("SELECT txid_current(), current_setting('engram.tenant_id', true)")).one()
            assert tuple(orm) == (txid, tenant_setting)
            # (and core.sql, once the ORM holds the connection, goes on in that transaction too)
            assert sql.run(session, _TRANSACTION)[0][0] == txid
    assert counts == {"connections": 1, "checkouts": 1, "checkins": 1}


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_what_core_sql_and_the_orm_wrote_in_one_session_ends_together(client, tenant, ending):
    tenant_id = tenant.tenant_id
    first, second = _save(client, tenant, "first"), _save(client, tenant, "second")
    with tenant_session(tenant_id) as session:
        sql.run(session, _bump(tenant_id, first))
        session.execute(update(Memory).where(Memory.id == second).values(access_count=Memory.access_count + 5))
        getattr(session, ending)()
    expected = (1, 5) if ending == "commit" else (0, 0)
    assert (_access_count(tenant_id, first), _access_count(tenant_id, second)) == expected


def test_a_flush_with_nothing_to_write_leaves_core_sql_work_to_commit(client, tenant):
    """The ORM's transaction begun without a statement (an object added, then taken back) commits with
    core.sql's, which is still the one on the connection."""
    memory_id = _save(client, tenant, "kept")
    with tenant_session(tenant.tenant_id) as session:
        sql.run(session, _bump(tenant.tenant_id, memory_id))
        stray = Memory(id="m_stray", tenant_id=tenant.tenant_id, content="never written")
        session.add(stray)
        session.expunge(stray)
        session.commit()
    assert _access_count(tenant.tenant_id, memory_id) == 1


def test_commit_and_rollback_hooks_run_for_core_sql_transactions(client, tenant):
    events: list[str] = []
    with listening(
        Session,
        after_commit=lambda session: events.append("commit"),
        after_soft_rollback=lambda session, _previous: events.append("rollback"),
    ):
        with tenant_session(tenant.tenant_id) as session:
            sql.run(session, _TRANSACTION)
        assert events == ["commit"]
        with tenant_session(tenant.tenant_id) as session:
            sql.run(session, _TRANSACTION)
            session.rollback()
        assert events == ["commit", "rollback"]


def test_a_failed_statement_rolls_back_and_gives_the_connection_back(client, tenant):
    memory_id = _save(client, tenant, "untouched")
    failing = sql.Query("test-session-fail", lambda: text("SELECT 1 / 0"), {})
    with _this_thread_pool() as counts, pytest.raises(Exception, match="division by zero"):
        with tenant_session(tenant.tenant_id) as session:
            sql.run(session, _bump(tenant.tenant_id, memory_id))
            sql.run(session, failing)
    assert counts["checkouts"] == counts["checkins"] == 1
    assert _access_count(tenant.tenant_id, memory_id) == 0


def test_a_connection_lost_under_core_sql_replaces_every_pooled_connection_as_old(client, tenant):
    """As SQLAlchemy does on a disconnect: a restarted PostgreSQL broke every pooled connection, so after the
    first one found broken none of the others is handed out again (one request fails, not one per connection)."""
    from contextlib import ExitStack

    from core.db import get_owner_engine

    engine = get_engine()
    with ExitStack() as held:  # a few connections in the pool, each with its backend
        connections = [held.enter_context(engine.connect()) for _ in range(3)]
        old = {connection.execute(text("SELECT pg_backend_pid()")).scalar() for connection in connections}
        for connection in connections:
            connection.rollback()
    with pytest.raises(psycopg.OperationalError), tenant_session(tenant.tenant_id) as session:
        sql.run(session, _TRANSACTION)
        pid = session.driver_connection().info.backend_pid  # type: ignore[attr-defined]
        with get_owner_engine().connect() as owner:  # (as a restart would)
            owner.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        sql.run(session, _TRANSACTION)
    with ExitStack() as held:
        connections = [held.enter_context(engine.connect()) for _ in range(3)]
        now = {connection.execute(text("SELECT pg_backend_pid()")).scalar() for connection in connections}
    assert not now & (old | {pid})


def test_close_detaches_what_the_orm_loaded_and_leaves_the_session_usable(client, tenant):
    from sqlalchemy import inspect, select

    memory_id = _save(client, tenant, "loaded, then detached")
    with tenant_session(tenant.tenant_id) as session:
        memory = session.execute(select(Memory).where(Memory.id == memory_id)).scalar_one()
    assert inspect(memory).detached
    with _this_thread_pool() as counts, tenant_session(tenant.tenant_id) as session:
        sql.run(session, _TRANSACTION)
        session.close()  # holding nothing of the ORM's
        assert not session.in_transaction()
        assert sql.run(session, _TRANSACTION)[0][1] == str(tenant.tenant_id)
    assert counts["checkouts"] == counts["checkins"] == 2
