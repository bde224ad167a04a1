"""A question search's COMMIT goes with its last statements, the graph's query (core.search.service's fuse):
two round trips in all when its tenant is quiet. Hits lifted after that (by the graph's hops, by the question's
names) are read in a transaction of their own, as the caller may see them then."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from psycopg import pq
from sqlalchemy import text

from core import sql
from core.db import get_engine, system_session
from tests.helpers.api import ids, save, search
from tests.helpers.events import listening


@contextmanager
def traced(tenant_id: int) -> Iterator[list[list[str]]]:
    """The round trips of the tenant's transactions while inside, each the frontend messages sent in it (libpq's
    protocol trace of every connection checked out meanwhile, kept for those that set the tenant)."""
    engine, files = get_engine(), []
    trips: list[list[str]] = []

    def checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        handle = tempfile.TemporaryFile("w+")
        files.append(handle)
        dbapi_connection.pgconn.trace(handle.fileno())
        dbapi_connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def checkin(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.pgconn.untrace()

    try:
        with listening(engine, checkout=checkout, checkin=checkin):
            yield trips
    finally:
        for handle in files:
            handle.seek(0)
            sent: list[list[str]] = []
            last = "B"
            for line in handle.read().splitlines():
                direction, _, message = line.partition("\t")
                if direction == "F":
                    if last == "B":
                        sent.append([])
                    sent[-1].append(message)
                if direction in ("F", "B"):
                    last = direction
            handle.close()
            if any(f"'engram.tenant_id', '{tenant_id}'" in message for trip in sent for message in trip):
                trips.extend(sent)


def _quiet(client, tenant) -> None:  # type: ignore[no-untyped-def]
    save(client, tenant, {"content": "the harbour ships the zinc crates on Fridays"})
    for _ in range(2):  # the index open, the facts loaded, the head no longer moving
        search(client, tenant, {"question": "when does the harbour ship zinc"})


def test_a_quiet_question_search_is_two_round_trips_its_commit_with_the_graphs_query(client, tenant):
    _quiet(client, tenant)
    with traced(tenant.tenant_id) as trips:
        found = search(client, tenant, {"question": "when does the harbour ship zinc"})
    assert found["memories"]
    assert len(trips) == 2, trips
    head, last = trips
    assert any("BEGIN" in message for message in head)
    assert any('"COMMIT"' in message for message in last), last


def test_a_hop_read_after_the_search_ended_is_read_as_the_caller_sees_it_then(client, tenant):
    """A memory only the graph reaches (no words in common with the question, no vector: no worker runs here) is
    loaded after the graph's round trip ended the transaction; forgotten in between, it is not shown."""
    seed = save(client, tenant, {"content": "the harbour ships the zinc crates on Fridays"})
    association = {"target_id": seed, "relation_type": "related_to", "weight": 1.0}
    linked = save(client, tenant, {"content": "pallets wrapped twice", "associations": [association]})
    question = {"question": "when does the harbour ship zinc"}
    assert linked in ids(search(client, tenant, question)["memories"])  # lifted by its link to the seed

    real = sql._exchange

    def forget_after_the_graph(driver, queries, *rest):  # type: ignore[no-untyped-def]
        rows = real(driver, queries, *rest)
        if any(isinstance(q.key, tuple) and q.key[0] == "graph" for q in queries):
            with system_session() as session:
                session.execute(
                    text("UPDATE memories SET status = 'forgotten' WHERE tenant_id = :t AND id = :id"),
                    {"t": tenant.tenant_id, "id": linked},
                )
        return rows

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sql, "_exchange", forget_after_the_graph)
        found = search(client, tenant, question)
    assert seed in ids(found["memories"]) and linked not in ids(found["memories"])


def test_an_entity_search_is_two_round_trips_its_commit_with_the_hits(client, catalog):
    """Entities only (no graph): the entity channel with the head, then the hits' columns with the COMMIT."""
    tenant = catalog
    noted = save(client, tenant, {"content": "amounts are in cents", "linked_entities": ["shop.orders.amount"]})
    body = {"entities": ["shop.orders.amount"]}
    for _ in range(2):
        search(client, tenant, body)
    with traced(tenant.tenant_id) as trips:
        found = search(client, tenant, body)
    assert ids(found["memories"]) == [noted]
    assert len(trips) == 2, trips
    assert any('"COMMIT"' in message for message in trips[-1]), trips[-1]
