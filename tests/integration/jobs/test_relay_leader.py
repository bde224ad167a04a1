"""One outbox relay leads: of the relays of one database only the holder of the leader's lock claims and
publishes; a standby takes over when the leader stops or loses its connection."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import select, text

from tests.helpers.processes import wait_for

# Who holds the leader's lock (core.jobs.relay: the claim locks' key space, key 0), as PostgreSQL sees it.
_HOLDERS = text(
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND classid = :space AND objid = 0 AND objsubid = 2"
)


class _Published:
    def __init__(self) -> None:
        self.job_ids: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, messages) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            self.job_ids.extend(job_id for message in messages for job_id in message.job_ids)


def _dsn() -> str:
    from core.db import get_engine

    return get_engine().url.render_as_string(hide_password=False).replace("postgresql+psycopg://", "postgresql://")


@contextmanager
def _relay(published: _Published) -> Iterator:  # type: ignore[type-arg]
    from core.jobs.relay import OutboxRelay

    relay = OutboxRelay(dsn=_dsn(), publish=published, interval=0.2)
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()
        relay.join(timeout=10)


def _holders() -> list[int]:
    from core.db import system_connection
    from core.jobs.relay import _CLAIM_LOCK_SPACE

    with system_connection() as connection:
        return list(connection.execute(_HOLDERS, {"space": _CLAIM_LOCK_SPACE}).scalars())


def _saved_job(client, tenant, content: str) -> str:  # type: ignore[no-untyped-def]
    from core.db import system_session
    from core.jobs.models import Job

    response = client.post("/v1/memories", json={"content": content}, headers=tenant.headers())
    assert response.status_code == 201, response.text
    doc = f"memory:{response.json()['memory_id']}"
    with system_session() as session:
        jobs = session.scalars(select(Job).where(Job.tenant_id == tenant.tenant_id, Job.kind == "embed")).all()
        return next(job.id for job in jobs if doc in job.payload.get("doc_ids", []))


def _release(job_ids: list[str]) -> None:
    """Jobs these relays published to no queue: back to the outbox, for whatever relay comes next."""
    from core.db import system_connection

    with system_connection() as connection:
        connection.execute(
            text("UPDATE jobs SET dispatched_at = NULL WHERE id = ANY(:ids) AND state = 'queued'"), {"ids": job_ids}
        )


def test_one_relay_leads_and_a_standby_takes_over_when_it_stops(client, tenant, stack):
    assert _holders() == [], "a relay of another test still leads"
    first, second = _Published(), _Published()
    try:
        with _relay(first) as leader:
            wait_for(leader.leads, timeout=10)
            with _relay(second) as standby:
                job = _saved_job(client, tenant, "a note while the first relay leads")
                wait_for(lambda: job in first.job_ids, timeout=30)
                time.sleep(1.0)  # five of the standby's tries for the lock
                assert not standby.leads() and second.job_ids == []
                assert len(_holders()) == 1

                leader.stop()
                leader.join(timeout=10)
                wait_for(standby.leads, timeout=10)
                later = _saved_job(client, tenant, "a note after the first relay stopped")
                wait_for(lambda: later in second.job_ids, timeout=30)
                assert later not in first.job_ids and job not in second.job_ids
        assert _holders() == []
    finally:
        _release(first.job_ids + second.job_ids)


def test_a_leader_that_loses_its_connection_lets_another_lead(client, tenant, stack):
    assert _holders() == [], "a relay of another test still leads"
    first, second = _Published(), _Published()
    try:
        with _relay(first) as one, _relay(second) as other:
            wait_for(lambda: one.leads() or other.leads(), timeout=10)
            (pid,) = _holders()
            with psycopg.connect(_dsn(), autocommit=True) as connection:  # (the relays' own role)
                assert connection.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
            wait_for(lambda: (holders := _holders()) and holders != [pid], timeout=15)
            wait_for(lambda: one.leads() != other.leads(), timeout=10)
            job = _saved_job(client, tenant, "a note after the leader's connection was cut")
            wait_for(lambda: job in first.job_ids + second.job_ids, timeout=30)
    finally:
        _release(first.job_ids + second.job_ids)
