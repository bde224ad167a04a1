"""Fair job scheduling: lanes, round-robin claims over tenants, in-flight and per-tenant caps, and a real
worker serving a fresh save while another tenant's backlog drains."""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import text

from tests.helpers.processes import WorkerProcess, wait_for

LANE_CASES = [
    ("embed", {"doc_ids": ["memory:1"]}, "interactive"),
    ("embed", {"doc_ids": ["memory:1", "memory:2"]}, "bulk"),
    ("embed", {"doc_ids": ["memory:1"], "reason": "reconcile"}, "bulk"),
    ("embed", {"doc_ids": ["memory:1"], "split_from": "abc"}, "bulk"),
    ("embed", {"doc_ids": "memory:1"}, "bulk"),
    ("embed", {}, "bulk"),
    ("ingest", {"doc_ids": ["memory:1"]}, "bulk"),
    ("refresh_samples", {}, "bulk"),
    ("prune", {}, "bulk"),
]


def _add_jobs(tenant_id: int | None, kind: str, payloads: list[dict], *, state: str = "queued") -> list[str]:
    """Job rows straight into the outbox (each a microsecond apart, so their age orders them)."""
    from core.db import system_connection

    ids = [uuid.uuid4().hex for _ in payloads]
    with system_connection() as connection:
        for n, (job_id, payload) in enumerate(zip(ids, payloads, strict=True)):
            connection.execute(
                text(
                    "INSERT INTO jobs (id, tenant_id, kind, state, payload, attempts, created_at, updated_at)"
                    " VALUES (:id, :t, :k, :s, CAST(:p AS jsonb), 0,"
                    " clock_timestamp() + :n * interval '1 microsecond', now())"
                ),
                {"id": job_id, "t": tenant_id, "k": kind, "s": state, "p": __import__("json").dumps(payload), "n": n},
            )
    return ids


def _forget_jobs(ids: list[str], claimed_by_test: list[str]) -> None:
    """Delete this test's rows and hand back to the real relays whatever else the test's claims took."""
    from core.db import system_connection

    with system_connection() as connection:
        connection.execute(text("DELETE FROM jobs WHERE id = ANY(:ids)"), {"ids": ids})
        others = [j for j in claimed_by_test if j not in set(ids)]
        connection.execute(
            text("UPDATE jobs SET dispatched_at = NULL WHERE id = ANY(:ids) AND state = 'queued'"), {"ids": others}
        )


@pytest.mark.parametrize(("kind", "payload", "lane"), LANE_CASES)
def test_the_lane_rule_is_one_rule_in_sql_and_python(stack, tenant, kind, payload, lane):
    from core.db import system_connection
    from core.jobs.lanes import lane_of, lane_sql

    (job_id,) = _add_jobs(tenant.tenant_id, kind, [payload], state="failed")
    try:
        with system_connection() as connection:
            in_sql = connection.execute(
                text(f"SELECT {lane_sql()} FROM jobs WHERE id = :id"), {"id": job_id, "interactive_max_docs": 1}
            ).scalar_one()
        assert in_sql == lane_of(kind, payload, interactive_max_docs=1) == lane
    finally:
        _forget_jobs([job_id], [])


def _in_flight(lane: str) -> int:
    from core.db import system_connection
    from core.jobs.lanes import lane_sql
    from core.jobs.relay import IN_FLIGHT

    with system_connection() as connection:
        return int(
            connection.execute(
                text(f"SELECT count(*) FROM jobs WHERE {IN_FLIGHT} AND {lane_sql()} = :lane"),
                {"lane": lane, "interactive_max_docs": 1, "stale_s": 30.0, "lease_s": 20.0},
            ).scalar_one()
        )


def test_a_fresh_job_is_claimed_before_another_tenants_backlog(stack, make_tenant):
    """Tenant A queued 60 bulk jobs, then B one: B's takes the first round's turn with A's oldest, ahead of
    A's second; and no claim puts more in flight than the lane allows."""
    from core.jobs.relay import RelayLimits, claim_lane

    a, b = make_tenant("backlog"), make_tenant("fresh")
    backlog = _add_jobs(a.tenant_id, "embed", [{"doc_ids": ["memory:x", "memory:y"]}] * 60)
    (fresh,) = _add_jobs(b.tenant_id, "embed", [{"doc_ids": ["memory:1", "memory:2"]}])
    claimed: list[str] = []
    try:
        limits = RelayLimits(bulk_inflight=_in_flight("bulk") + 20)
        first = [head.id for head, _, _ in claim_lane("bulk", limits=limits)]
        claimed += first
        assert len(first) == 20 and fresh in first
        assert first.index(fresh) < first.index(backlog[1])
        assert [j for j in first if j in backlog] == backlog[: len([j for j in first if j in backlog])]
        # The lane is full: nothing more goes out until a job finishes.
        assert claim_lane("bulk", limits=limits) == []
        from core.db import system_connection

        with system_connection() as connection:
            connection.execute(text("UPDATE jobs SET state = 'succeeded' WHERE id = ANY(:ids)"), {"ids": first[:3]})
        again = [head.id for head, _, _ in claim_lane("bulk", limits=limits)]
        claimed += again
        assert len(again) == 3
    finally:
        _forget_jobs([*backlog, fresh], claimed)


def test_a_tenants_ingest_and_refresh_run_within_its_cap(stack, make_tenant):
    """With a cap of one per tenant and kind, a tenant's second ingest waits for its first; another tenant's
    ingest, and the same tenant's refresh, go out meanwhile."""
    from core.db import system_connection
    from core.jobs.relay import RelayLimits, claim_lane

    c, d = make_tenant("slow-source"), make_tenant("other-source")
    c_ingest = _add_jobs(c.tenant_id, "ingest", [{"datasource": "x"}] * 3)
    c_refresh = _add_jobs(c.tenant_id, "refresh_samples", [{"datasource": "x"}] * 2)
    d_ingest = _add_jobs(d.tenant_id, "ingest", [{"datasource": "y"}])
    mine = [*c_ingest, *c_refresh, *d_ingest]
    claimed: list[str] = []
    try:
        limits = RelayLimits(bulk_inflight=_in_flight("bulk") + 50)
        first = [head.id for head, _, _ in claim_lane("bulk", limits=limits)]
        claimed += first
        assert [j for j in first if j in mine] == [c_ingest[0], c_refresh[0], d_ingest[0]] or sorted(
            j for j in first if j in mine
        ) == sorted([c_ingest[0], c_refresh[0], d_ingest[0]])
        second = [head.id for head, _, _ in claim_lane("bulk", limits=limits)]
        claimed += second
        assert not set(second) & set(mine)
        with system_connection() as connection:
            connection.execute(text("UPDATE jobs SET state = 'succeeded' WHERE id = :id"), {"id": c_ingest[0]})
        third = [head.id for head, _, _ in claim_lane("bulk", limits=limits)]
        claimed += third
        assert [j for j in third if j in mine] == [c_ingest[1]]
    finally:
        _forget_jobs(mine, claimed)


def _embedded(tenant_id: int, doc_ids: list[str]) -> int:
    from core.db import system_connection

    with system_connection() as connection:
        return int(
            connection.execute(
                text("SELECT count(*) FROM embeddings WHERE tenant_id = :t AND canonical_id = ANY(:ids)"),
                {"t": tenant_id, "ids": doc_ids},
            ).scalar_one()
        )


def _unfinished_embed_jobs(tenant_id: int) -> int:
    from core.db import system_connection

    with system_connection() as connection:
        return int(
            connection.execute(
                text("SELECT count(*) FROM jobs WHERE tenant_id = :t AND kind = 'embed' AND state <> 'succeeded'"),
                {"t": tenant_id},
            ).scalar_one()
        )


def test_a_fresh_save_gets_its_vector_while_another_tenants_backlog_drains(stack, client, make_tenant):
    """A's 6,000 memories are queued before B saves one memory and a batch of two; then a real worker
    starts. B's single save (interactive lane) and B's small batch (its first turn in the bulk lane) both
    get their vectors while A's backlog is still being worked through."""
    a, b = make_tenant("import"), make_tenant("agent")
    for start in range(0, 6000, 1000):
        items = [{"content": f"imported row {n}: the nightly orders load finished"} for n in range(start, start + 1000)]
        response = client.post("/v1/memories:batch", json={"items": items}, headers=a.headers())
        assert response.status_code == 200, response.text
    saved = client.post("/v1/memories", json={"content": "the agent's fresh note"}, headers=b.headers())
    assert saved.status_code == 201, saved.text
    single = [f"memory:{saved.json()['memory_id']}"]
    small = client.post(
        "/v1/memories:batch", json={"items": [{"content": "first of two"}, {"content": "second of two"}]},
        headers=b.headers(),
    )
    assert small.status_code == 200, small.text
    pair = [f"memory:{r['memory_id']}" for r in small.json()["results"]]
    worker = WorkerProcess(stack)
    try:
        started = time.monotonic()
        wait_for(lambda: _embedded(b.tenant_id, single) == 1, timeout=60, interval=0.02)
        single_after = time.monotonic() - started
        a_left_at_single = _unfinished_embed_jobs(a.tenant_id)
        wait_for(lambda: _embedded(b.tenant_id, pair) == 2, timeout=60, interval=0.02)
        a_left_at_pair = _unfinished_embed_jobs(a.tenant_id)
        print(f"B's save embedded {single_after:.2f} s after the worker started; A had {a_left_at_single} jobs left")
        assert a_left_at_single > 0 and a_left_at_pair > 0, (a_left_at_single, a_left_at_pair)
        wait_for(lambda: _unfinished_embed_jobs(a.tenant_id) == 0, timeout=180, interval=0.2)
    finally:
        worker.stop()


def test_the_claim_runs_on_a_generic_plan_not_planned_each_round(stack, make_tenant):
    """The claim has no tenant among its parameters: after psycopg prepares it (its fifth run on a
    connection) PostgreSQL runs it on the statement's generic plan, and it still claims right."""
    from core.db import _SYSTEM_MODE, _name_transaction, get_engine
    from core.jobs.relay import RelayLimits, claim_in

    tenant = make_tenant("generic")
    ids = _add_jobs(tenant.tenant_id, "embed", [{"doc_ids": ["memory:x", "memory:y"]}] * 8)
    claimed: list[str] = []
    try:
        with get_engine().connect() as connection:  # one connection: its prepared statements are its own
            for _ in range(8):
                with connection.begin():
                    _name_transaction(connection, _SYSTEM_MODE)
                    limits = RelayLimits(bulk_inflight=_in_flight("bulk") + 1)
                    claimed += [head.id for head, _, _ in claim_in(connection, "bulk", limits=limits, most=1)]
            plans = connection.execute(
                text(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                    " WHERE statement LIKE '%WITH ranked AS%'"
                )
            ).all()
        ours = [j for j in claimed if j in ids]
        assert len(claimed) == 8 and ours and ours == ids[: len(ours)]  # one a round, oldest first
        assert len(plans) == 1 and plans[0].generic_plans >= 3 and plans[0].custom_plans == 0
    finally:
        _forget_jobs(ids, claimed)


def test_a_relay_round_ends_a_lane_at_a_claim_that_took_fewer_than_a_batch(stack, make_tenant, monkeypatch):
    """A claim that takes fewer jobs than a batch left nothing claimable in its lane (or no free slot): the
    round makes no second claim there, a transaction under the claim lock that would find nothing."""
    from core.jobs import relay

    tenant = make_tenant("round")
    ids = _add_jobs(tenant.tenant_id, "embed", [{"doc_ids": ["memory:x", "memory:y"]}] * 5)
    calls: list[tuple[str, int]] = []
    original = relay.claim_lane

    def counted(lane, **kwargs):  # type: ignore[no-untyped-def]
        found = original(lane, **kwargs)
        calls.append((lane, len(found)))
        return found

    monkeypatch.setattr(relay, "claim_lane", counted)
    published: list = []
    claimed: list[str] = []
    try:
        limits = relay.RelayLimits(bulk_inflight=_in_flight("bulk") + 50)
        counts = relay.relay_once(published.extend, limits=limits, lanes=("bulk",))
        claimed = [job_id for message in published for job_id in message.job_ids]
        assert set(ids) <= set(claimed) and counts == {"bulk": len(claimed)}
        assert calls == [("bulk", len(claimed))]
    finally:
        _forget_jobs(ids, claimed)
