"""Memory lifecycle (CONTRACT section 4): daily and conversation expiry, run teardown, importance decay,
the per-agent entry cap and the staleness watcher, on the real stack.

Passes run per tenant here (core.lifecycle.prune.prune_tenant), so they never touch other tests' data;
tests/integration/memories/test_lifecycle_worker.py runs the whole `prune` job through beat's task and a real worker.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text, update

from tests.helpers.api import save
from tests.helpers.catalog import create_and_ingest, sqlite_source
from tests.helpers.lifecycle import prune


def age(tenant, memory_ids, *, hours: float, accessed_hours: float | None = None):  # type: ignore[no-untyped-def]
    """Pretend memories were last written `hours` ago (and last read `accessed_hours` ago)."""
    from core.db import tenant_session
    from core.memories.models import Memory

    stamp = datetime.now(UTC) - timedelta(hours=hours)
    values = {"updated_at": stamp, "created_at": stamp}
    if accessed_hours is not None:
        values["last_accessed_at"] = datetime.now(UTC) - timedelta(hours=accessed_hours)
    with tenant_session(tenant.tenant_id) as session:
        session.execute(update(Memory).where(Memory.id.in_(list(memory_ids))).values(**values))


def row(tenant, memory_id):  # type: ignore[no-untyped-def]
    from core.db import tenant_session
    from core.memories.models import Memory

    with tenant_session(tenant.tenant_id) as session:
        return session.scalar(select(Memory).where(Memory.id == memory_id))


def tombstoned(tenant, memory_id) -> bool:  # type: ignore[no-untyped-def]
    from core.db import system_connection

    with system_connection() as connection:
        return bool(
            connection.execute(
                text("SELECT 1 FROM tombstones WHERE tenant_id = :t AND doc_id = :d"),
                {"t": tenant.tenant_id, "d": f"memory:{memory_id}"},
            ).scalar()
        )


def test_daily_memories_expire_72h_after_their_last_write(client, tenant):
    """Expired memories are purged (row gone, tombstone written) and references to them are stripped."""
    old = save(client, tenant, {"content": "standup notes", "category": "daily"})
    fresh = save(client, tenant, {"content": "today's notes", "category": "daily"})
    old_core = save(client, tenant, {"content": "the owner is Ana", "category": "core"})
    referrer = save(client, tenant, {"content": "see the notes", "linked_entities": [f"memory:{old}"]})
    age(tenant, [old, old_core], hours=73)
    age(tenant, [fresh], hours=71)
    before_seq = client.get(f"/v1/memories/{referrer}", headers=tenant.headers()).json()
    assert f"memory:{old}" in before_seq["entities"]
    counts = prune(tenant)
    assert counts["daily_expired"] == 1
    assert row(tenant, old) is None and tombstoned(tenant, old)
    assert row(tenant, fresh) is not None and row(tenant, old_core) is not None
    assert f"memory:{old}" not in client.get(f"/v1/memories/{referrer}", headers=tenant.headers()).json()["entities"]
    assert (
        client.get(f"/v1/memories/{old}", params={"include_forgotten": "true"}, headers=tenant.headers()).status_code
        == 404
    )


def test_a_write_restarts_the_daily_clock(client, tenant):
    mid = save(client, tenant, {"content": "follow up with Bob", "category": "daily"})
    age(tenant, [mid], hours=80)
    client.patch(f"/v1/memories/{mid}", json={"tags": ["bob"]}, headers=tenant.headers())
    assert prune(tenant)["daily_expired"] == 0
    assert row(tenant, mid) is not None


def test_conversation_memories_expire_after_24h(client, tenant):
    old = save(client, tenant, {"content": "scratch", "category": "conversation", "run_id": "r-old"})
    young = save(client, tenant, {"content": "scratch 2", "category": "conversation", "run_id": "r-young"})
    age(tenant, [old], hours=25)
    age(tenant, [young], hours=23)
    assert prune(tenant)["conversation_expired"] == 1
    assert row(tenant, old) is None and row(tenant, young) is not None


def test_deleting_a_run_forgets_its_conversation_memories(client, tenant):
    """Only the run's conversation memories die by default; the run's durable memories stay."""
    scratch = [
        save(client, tenant, {"content": f"step {i}", "category": "conversation", "run_id": "run-1"}) for i in range(3)
    ]
    durable = save(client, tenant, {"content": "learned: deploys on Fridays fail", "run_id": "run-1"})
    other_run = save(client, tenant, {"content": "other", "category": "conversation", "run_id": "run-2"})
    response = client.delete("/v1/runs/run-1", headers=tenant.headers())
    assert response.status_code == 200
    assert response.json() == {"run_id": "run-1", "status": "forgotten", "count": 3, "skipped": 0}
    for mid in scratch:
        assert row(tenant, mid).status == "forgotten" and row(tenant, mid).forget_reason == "run run-1 ended"
    assert row(tenant, durable).status == "active" and row(tenant, other_run).status == "active"
    listed = client.get("/v1/memories", params={"run_id": "run-1"}, headers=tenant.headers()).json()["memories"]
    assert [m["id"] for m in listed] == [durable]
    again = client.delete("/v1/runs/run-1", headers=tenant.headers()).json()
    assert again["count"] == 0
    everything = client.delete("/v1/runs/run-1", params={"all": "true", "purge": "true"}, headers=tenant.headers())
    assert everything.json()["count"] == 4 and everything.json()["status"] == "purged"
    assert row(tenant, durable) is None and tombstoned(tenant, durable)


def test_run_teardown_respects_visibility_and_ownership(client, tenant, member_key):
    alice, bob = member_key("alice@example.com"), member_key("bob@example.com")
    mine = save(client, tenant, {"content": "a", "category": "conversation", "run_id": "shared"}, key=alice)
    theirs = save(client, tenant, {"content": "b", "category": "conversation", "run_id": "shared"}, key=bob)
    hidden = save(
        client,
        tenant,
        {"content": "c", "category": "conversation", "run_id": "shared", "agent_id": "other-agent"},
        key=bob,
    )
    body = client.delete("/v1/runs/shared", headers={"Authorization": f"Bearer {alice}"}).json()
    assert body["count"] == 1 and body["skipped"] == 1
    assert row(tenant, mine).status == "forgotten"
    assert row(tenant, theirs).status == "active" and row(tenant, hidden).status == "active"
    bad = client.delete("/v1/runs/shared", params={"purge": "maybe"}, headers=tenant.headers())
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "purge"
    assert client.delete("/v1/runs/shared").status_code == 401


def test_importance_decays_except_identity(client, tenant):
    """Half the importance per half-life since the previous pass (or the last write, if later)."""
    from core.db import system_session
    from core.lifecycle.decay import apply_decay

    fact = save(client, tenant, {"content": "prefers tea", "kind": "fact"})
    identity = save(client, tenant, {"content": "I am the billing agent", "kind": "identity"})
    recent = save(client, tenant, {"content": "prefers green tea", "kind": "fact"})
    age(tenant, [fact, identity], hours=24 * 60)
    age(tenant, [recent], hours=24 * 15)
    now = datetime.now(UTC)
    with system_session() as session:
        result = apply_decay(
            session,
            now=now,
            half_life_days=30,
            interval=timedelta(hours=24),
            previous=now - timedelta(days=30),
            tenant_ids=[tenant.tenant_id],
        )
    assert result["memories"] == 2  # identity is exempt
    assert math.isclose(row(tenant, fact).importance, 0.25, rel_tol=1e-3)  # 30 days since the last pass
    assert math.isclose(row(tenant, recent).importance, 0.5 * 0.5**0.5, rel_tol=1e-3)  # 15 days since its write
    assert row(tenant, identity).importance == 1.0
    with system_session() as session:
        not_due = apply_decay(
            session,
            now=now,
            half_life_days=30,
            interval=timedelta(hours=24),
            previous=now,
            tenant_ids=[tenant.tenant_id],
        )
    assert "due_at" in not_due and math.isclose(row(tenant, fact).importance, 0.25, rel_tol=1e-3)


def test_entry_cap_evicts_the_coldest_non_core_first(client, tenant):
    ids = {
        "core": save(client, tenant, {"content": "core", "agent_id": "a1", "importance": 0.1}),
        "hot": save(client, tenant, {"content": "hot", "agent_id": "a1", "category": "daily", "importance": 0.9}),
        "cold": save(client, tenant, {"content": "cold", "agent_id": "a1", "category": "daily", "importance": 0.2}),
        "idle": save(client, tenant, {"content": "idle", "agent_id": "a1", "category": "workspace", "importance": 0.6}),
        "read": save(client, tenant, {"content": "read", "agent_id": "a1", "category": "workspace", "importance": 0.6}),
    }
    other_agent = [save(client, tenant, {"content": f"b{i}", "agent_id": "b1", "category": "daily"}) for i in range(3)]
    age(tenant, [ids["idle"], ids["read"]], hours=24 * 20)
    for _ in range(5):  # reads make `read` warmer than `idle`, which has the same importance and age
        client.get(f"/v1/memories/{ids['read']}", params={"agent_id": "a1"}, headers=tenant.headers())
    assert prune(tenant, agent_entry_cap=3)["evicted"] == 2
    gone = {name for name, mid in ids.items() if row(tenant, mid) is None}
    assert gone == {"cold", "idle"}
    assert all(row(tenant, mid) is not None for mid in other_agent)
    assert prune(tenant, agent_entry_cap=1)["evicted"] == 4  # a1: hot and read go, core stays; b1: two go
    assert row(tenant, ids["core"]) is not None


def test_core_goes_only_when_nothing_else_remains(client, tenant):
    cores = [
        save(client, tenant, {"content": f"c{i}", "agent_id": "solo", "importance": 0.1 * (i + 1)}) for i in range(3)
    ]
    workspace = save(client, tenant, {"content": "w", "agent_id": "solo", "category": "workspace", "importance": 1.0})
    assert prune(tenant, agent_entry_cap=2)["evicted"] == 2
    assert row(tenant, workspace) is None and row(tenant, cores[0]) is None
    assert row(tenant, cores[1]) is not None and row(tenant, cores[2]) is not None


@pytest.fixture
def shop(client, tenant, tmp_path):  # type: ignore[no-untyped-def]
    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        yield tenant


def test_watcher_marks_memories_stale_when_a_linked_entity_vanishes(client, shop):
    """An entity gone from the catalog without the cascade (here: a row deleted behind its back) marks the
    memories linking it stale with a reason; GET /v1/memories?status=stale lists them."""
    from core.changes import bump_change_seq
    from core.db import tenant_session
    from core.entities.models import CatalogColumn
    from core.entities.store import touch_catalog

    tenant = shop
    linked = save(client, tenant, {"content": "amount is net of tax", "linked_entities": ["shop.orders.amount"]})
    intact = save(client, tenant, {"content": "status values", "linked_entities": ["shop.orders.status"]})
    with tenant_session(tenant.tenant_id) as session:
        session.execute(
            CatalogColumn.__table__.delete().where(
                CatalogColumn.tenant_id == tenant.tenant_id,
                CatalogColumn.model == "orders",
                CatalogColumn.name == "amount",
            )
        )
        _, seq = bump_change_seq(session, tenant_id=tenant.tenant_id)
        touch_catalog(session, tenant_id=tenant.tenant_id, change_seq=seq)
    counts = prune(tenant)
    assert counts["marked_stale"] == 1
    stale = client.get("/v1/memories", params={"status": "stale"}, headers=tenant.headers()).json()["memories"]
    assert [m["id"] for m in stale] == [linked]
    assert "shop.orders.amount" in stale[0]["stale_reason"]
    assert client.get(f"/v1/memories/{intact}", headers=tenant.headers()).json()["status"] == "active"


def test_watcher_skips_a_tenant_that_did_not_change(client, tenant):
    from core.config import get_settings
    from core.lifecycle.prune import prune_tenant

    save(client, tenant, {"content": "nothing to see"})
    first = prune(tenant)
    again = prune_tenant(
        tenant_id=tenant.tenant_id,
        settings=get_settings(),
        watermark=first["change_seq"],
        change_seq=first["change_seq"],
    )
    assert again == {
        "daily_expired": 0,
        "conversation_expired": 0,
        "evicted": 0,
        "marked_stale": 0,
        "change_seq": first["change_seq"],
    }
