"""Concurrent writers of one tenant against a real API over TCP: one lock order, so no deadlock reaches a
client; the rare conflict PostgreSQL still reports is retried inside the request."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter

import httpx
import pytest
from sqlalchemy import text

from tests.helpers.processes import running_api

pytestmark = pytest.mark.slow

CLIENTS = 20
# Rounds of the same-new-id race (100 writes each); ENGRAM_RACE_ROUNDS=60 races for about half a minute.
RACE_ROUNDS = int(os.environ.get("ENGRAM_RACE_ROUNDS", "3"))


@pytest.fixture(scope="module")
def api_url(stack):  # type: ignore[no-untyped-def]
    with running_api(stack.env) as url:
        yield url


def _race(url: str, headers: dict[str, str], requests: list[tuple[str, str, dict]]) -> Counter[int]:
    """Each of CLIENTS threads sends every request in ``requests``, all starting together."""
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    start = threading.Barrier(CLIENTS)
    lock = threading.Lock()

    def client(n: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            start.wait()
            for method, path, body in requests:
                sent = {**body, "content": f"{body['content']} {n}"} if "content" in body else body
                response = http.request(method, path, json=sent)
                with lock:
                    statuses[response.status_code] += 1
                    if response.status_code >= 300:
                        failures.append(response.text)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, f"{len(failures)} failed, first: {failures[:3]}"
    return statuses


def _rows(tenant_id: int, memory_id: str) -> tuple[int, int]:
    from core.db import system_connection

    with system_connection() as connection:
        rows = connection.execute(
            text("SELECT count(*) FROM memories WHERE tenant_id = :t AND id = :id"), {"t": tenant_id, "id": memory_id}
        ).scalar()
        versions = connection.execute(
            text("SELECT count(*) FROM memory_versions WHERE tenant_id = :t AND memory_id = :id"),
            {"t": tenant_id, "id": memory_id},
        ).scalar()
    return int(rows or 0), int(versions or 0)


def test_clients_racing_one_new_id_all_get_201(api_url, tenant):
    """20 clients save the same new id at once, again and again (fresh ids each round): every request is a
    201, the memory is one row, and it has one revision per write."""
    started = time.monotonic()
    for _ in range(RACE_ROUNDS):
        memory_id = f"race-{uuid.uuid4().hex[:8]}"
        writes = [("POST", "/v1/memories", {"id": memory_id, "content": "racing writer"})] * 5
        statuses = _race(api_url, tenant.headers(), writes)
        assert statuses == Counter({201: CLIENTS * len(writes)})
        assert _rows(tenant.tenant_id, memory_id) == (1, CLIENTS * len(writes))
    print(f"same-new-id race: {RACE_ROUNDS * CLIENTS * 5} writes in {time.monotonic() - started:.1f} s, all 201")


def test_every_save_path_races_without_a_failure(api_url, tenant):
    """Upserts of a new and an existing id, batches naming it, PATCH and import of it, all at once."""
    memory_id = f"mixed-{uuid.uuid4().hex[:8]}"
    new_id = f"mixed-new-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=api_url, headers=tenant.headers(), timeout=30) as http:
        assert http.post("/v1/memories", json={"id": memory_id, "content": "first"}).status_code == 201
    writes = [
        ("POST", "/v1/memories", {"id": new_id, "content": "new"}),
        ("POST", "/v1/memories", {"id": memory_id, "content": "existing"}),
        ("POST", "/v1/memories:batch", {"items": [{"id": memory_id, "content": "b"}, {"id": new_id, "content": "b"}]}),
        ("PATCH", f"/v1/memories/{memory_id}", {"content": "patched"}),
        ("POST", "/v1/memories", {"content": "no id", "associations": [{"target_id": memory_id}]}),
    ]
    statuses = _race(api_url, tenant.headers(), writes)
    assert set(statuses) <= {200, 201}, statuses
    assert _rows(tenant.tenant_id, new_id)[0] == 1


def test_a_deadlock_that_still_happens_is_retried_inside_the_write(stack, tenant):
    """Two writes lock two rows in opposite orders on their first attempt: PostgreSQL ends one with
    `deadlock detected`, tenant_write runs it again, and both complete."""
    from core.db import tenant_write
    from core.memories.models import Memory
    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import save_memories
    from core.tenancy.context import Caller

    caller = Caller(tenant_id=tenant.tenant_id, tenant_name=tenant.name, user="admin", role="admin", key_id="k")
    first, second = f"dl-a-{uuid.uuid4().hex[:6]}", f"dl-b-{uuid.uuid4().hex[:6]}"
    tenant_write(
        tenant.tenant_id,
        lambda s: save_memories(s, caller=caller, items=[SaveMemoryIn(id=i, content=i) for i in (first, second)]),
    )
    both_hold_one = threading.Barrier(2, timeout=10)
    attempts: Counter[str] = Counter()

    def opposite(order: tuple[str, str]):  # type: ignore[no-untyped-def]
        def work(session):  # type: ignore[no-untyped-def]
            attempts[order[0]] += 1
            from sqlalchemy import select

            session.scalars(select(Memory).where(Memory.id == order[0]).with_for_update()).one()
            if attempts[order[0]] == 1:
                both_hold_one.wait()
            session.scalars(select(Memory).where(Memory.id == order[1]).with_for_update()).one()
            return order[0]

        return work

    results: list[str] = []
    threads = [
        threading.Thread(target=lambda o=o: results.append(tenant_write(tenant.tenant_id, opposite(o))))
        for o in ((first, second), (second, first))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results) == sorted([first, second])
    assert sum(attempts.values()) == 3  # one of them lost the deadlock once and ran again


def test_the_503_names_what_postgres_reported():
    import psycopg

    from api.errors import database_busy_message

    assert "deadlock" in (database_busy_message(psycopg.errors.DeadlockDetected("x")) or "")
    assert "conflicting" in (database_busy_message(psycopg.errors.SerializationFailure("x")) or "")
    assert "time budget" in (database_busy_message(psycopg.errors.QueryCanceled("x")) or "")
    # A conflict is retried as the driver raises it too (a statement sent on its connection: core.sql).
    from core.db import is_conflict

    assert is_conflict(psycopg.errors.DeadlockDetected("x")) and is_conflict(psycopg.errors.SerializationFailure("x"))
    assert not is_conflict(psycopg.errors.QueryCanceled("x"))
    assert database_busy_message(psycopg.OperationalError("server closed the connection")) is None


def _plan_counts(driver, statement_like: str) -> dict[str, tuple[int, int]]:  # type: ignore[no-untyped-def]
    """(generic, custom) plan counts of engram's prepared statements on this connection whose text is LIKE."""
    rows = driver.execute(
        "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE name LIKE 'engram_%%' AND statement LIKE %s",
        [statement_like],
    ).fetchall()
    driver.commit()  # (not a rollback: psycopg deallocates every prepared statement at one)
    return {name: (generic, custom) for name, generic, custom in rows}


def _one_statement_ran(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """The generic and custom plans one statement gained between two counts (the pooled connection may hold
    other shapes from earlier calls: only what changed counts)."""
    changed = {name: counts for name, counts in after.items() if before.get(name) != counts}
    assert len(changed) == 1, (before, after)
    ((name, (generic, custom)),) = changed.items()
    return generic - before.get(name, (0, 0))[0], custom - before.get(name, (0, 0))[1]


def test_a_save_runs_on_its_generic_plan_prepared_once_per_connection(client, tenant):
    """A save writes by key only (the tenant's row, the items' ids, a job's id): its statement is prepared
    once per connection and PostgreSQL runs it on one generic plan, not planned again for each save's values;
    the saves read back whole."""
    from sqlalchemy.orm import Session

    from core.db import get_engine
    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import recall_memory, save_memory
    from core.tenancy.context import Caller

    caller = Caller(
        tenant_id=tenant.tenant_id, tenant_name=tenant.name, user="admin@localhost", role="admin", key_id="k"
    )
    saved = []
    with get_engine().connect() as connection:
        driver = connection.connection.driver_connection
        before = _plan_counts(driver, "%INSERT INTO memories%")
        for n in range(3):
            with Session(bind=connection, info={"tenant_id": tenant.tenant_id, "outbox": []}) as session:
                saved.append(save_memory(session, caller=caller, item=SaveMemoryIn(content=f"plan note {n}")).memory_id)
                session.commit()
        after = _plan_counts(driver, "%INSERT INTO memories%")
    assert _one_statement_ran(before, after) == (3, 0)
    with Session(bind=get_engine(), info={"tenant_id": tenant.tenant_id}) as session:
        assert [recall_memory(session, caller=caller, memory_id=m)["content"] for m in saved] == [
            f"plan note {n}" for n in range(3)
        ]
        session.rollback()


def test_a_batch_save_is_planned_for_its_values_and_a_single_one_is_not(client, tenant):
    """A statement of several rows is not run under the generic plans' setting, which its rows' foreign-key
    checks would follow (a cached generic check made while the tables had no statistics scans the tenant's rows
    at every row: a 1,000-item batch took 230 ms and more against ~80 ms planned); a single save still runs on its
    generic plan. Both read back whole."""
    from sqlalchemy.orm import Session

    from core.db import get_engine
    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import recall_memory, save_memories
    from core.tenancy.context import Caller

    caller = Caller(
        tenant_id=tenant.tenant_id, tenant_name=tenant.name, user="admin@localhost", role="admin", key_id="k"
    )
    saved: list[str] = []
    with get_engine().connect() as connection:
        driver = connection.connection.driver_connection
        for size, plans in ((3, None), (1, (1, 0)), (2, None)):
            before = _plan_counts(driver, "%INSERT INTO memories%")
            with Session(bind=connection, info={"tenant_id": tenant.tenant_id, "outbox": []}) as session:
                items = [SaveMemoryIn(content=f"batch {size} note {n}") for n in range(size)]
                results = save_memories(session, caller=caller, items=items, action="memory.save")
                saved += [r.memory_id for r in results]  # type: ignore[union-attr]
                session.commit()
            after = _plan_counts(driver, "%INSERT INTO memories%")
            if plans is None:
                assert after == before  # no prepared save ran: planned for its values
            else:
                assert _one_statement_ran(before, after) == plans
    with Session(bind=get_engine(), info={"tenant_id": tenant.tenant_id}) as session:
        contents = [recall_memory(session, caller=caller, memory_id=m)["content"] for m in saved]
        session.rollback()
    assert contents == [f"batch {size} note {n}" for size in (3, 1, 2) for n in range(size)]


def test_a_get_runs_on_its_generic_plan_for_every_caller_of_its_shape(client, tenant):
    """A get by id reads one row by key: one statement, prepared once per connection, run on its generic plan
    for every agent (the caller's agent is a parameter: another agent's private memory stays hidden), counting
    the access and bringing the associations along, ordered."""
    from sqlalchemy.orm import Session

    from core.db import get_engine
    from core.errors import NotFound
    from core.memories.service import recall_memory
    from core.tenancy.context import Caller

    h = tenant.headers()
    links = [{"target_id": "zeta", "relation_type": "updates", "weight": 1.0}, {"target_id": "alpha", "weight": 0.25}]
    for target in ("zeta", "alpha"):
        assert client.post("/v1/memories", json={"content": target, "id": target}, headers=h).status_code == 201
    body = {"content": "agent A keeps this", "id": "recall-1", "agent_id": "A", "associations": links}
    assert client.post("/v1/memories", json=body, headers=h).status_code == 201

    def caller(agent: str) -> Caller:
        return Caller(
            tenant_id=tenant.tenant_id,
            tenant_name=tenant.name,
            user="u@localhost",
            role="member",
            key_id="k",
            agent_id=agent,
        )

    with get_engine().connect() as connection:
        driver = connection.connection.driver_connection
        before = _plan_counts(driver, "%UPDATE memories SET access_count%")
        with Session(bind=connection, info={"tenant_id": tenant.tenant_id}) as session:
            first = recall_memory(session, caller=caller("A"), memory_id="recall-1")
            with pytest.raises(NotFound):
                recall_memory(session, caller=caller("B"), memory_id="recall-1")
            again = recall_memory(session, caller=caller("A"), memory_id="recall-1")
            session.commit()
        after = _plan_counts(driver, "%UPDATE memories SET access_count%")
    assert _one_statement_ran(before, after) == (3, 0)
    assert first["content"] == "agent A keeps this" and first["agent_id"] == "A"
    assert first["associations"] == [
        {"target_id": "alpha", "relation_type": "related_to", "weight": 0.25},
        {"target_id": "zeta", "relation_type": "updates", "weight": 1.0},
    ]
    assert isinstance(first["associations"][1]["weight"], float)
    assert (first["access_count"], again["access_count"]) == (1, 2)
    assert again["last_accessed_at"] is not None
    # The REST answer is the same shape.
    got = client.get("/v1/memories/recall-1?agent_id=A", headers=h).json()
    assert got["associations"] == first["associations"] and got["access_count"] == 3


def test_a_save_that_finishes_its_transaction_commits_with_its_statement(client, tenant):
    """``finish`` (the routes: nothing follows the save in its transaction): the save's statement carries the
    COMMIT, so the session is committed when it returns, and the commit hook still hands over the jobs the
    statement wrote (its embed job), and only those: a save the quota refuses hands over none."""
    import core.jobs.service as jobs
    from core.db import system_connection, tenant_session
    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import save_memory
    from core.tenancy.context import Caller

    caller = Caller(
        tenant_id=tenant.tenant_id, tenant_name=tenant.name, user="admin@localhost", role="admin", key_id="k"
    )

    class Recorded:
        def __init__(self) -> None:
            self.sent: list[list[str]] = []

        def send(self, job_ids: list[str]) -> None:
            self.sent.append(job_ids)

    previous, queue = jobs.get_job_queue(), Recorded()
    jobs.set_job_queue(queue)
    try:
        with tenant_session(tenant.tenant_id) as session:
            saved = save_memory(session, caller=caller, item=SaveMemoryIn(content="committed with it"), finish=True)
            assert not session.in_transaction()
            with system_connection() as connection:  # another transaction sees it, and its job, already
                assert (
                    connection.execute(
                        text("SELECT content FROM memories WHERE tenant_id = :t AND id = :id"),
                        {"t": tenant.tenant_id, "id": saved.memory_id},
                    ).scalar()
                    == "committed with it"
                )
                embed_jobs = (
                    connection.execute(
                        text("SELECT id FROM jobs WHERE tenant_id = :t AND kind = 'embed'"), {"t": tenant.tenant_id}
                    )
                    .scalars()
                    .all()
                )
        assert len(embed_jobs) == 1 and queue.sent == [[embed_jobs[0]]]
        # Without finish, the caller's commit ends the transaction (and hands the job over then).
        with tenant_session(tenant.tenant_id) as session:
            save_memory(session, caller=caller, item=SaveMemoryIn(content="committed after"))
            assert session.in_transaction() and len(queue.sent) == 1
        assert len(queue.sent) == 2
        from tests.helpers.api import OPERATOR

        limited = client.patch(f"/v1/tenants/{tenant.name}", json={"quotas": {"max_memories": 2}}, headers=OPERATOR)
        assert limited.status_code == 200, limited.text
        with pytest.raises(Exception, match="quota|limit|max"):  # noqa: PT011 - the quota's own error
            with tenant_session(tenant.tenant_id) as session:
                save_memory(session, caller=caller, item=SaveMemoryIn(content="over the quota"), finish=True)
        assert len(queue.sent) == 2
    finally:
        jobs.set_job_queue(previous)
