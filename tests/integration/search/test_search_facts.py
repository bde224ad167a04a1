"""Eligibility judged from the process's facts (core.search.facts) is the SQL predicate's verdict, always."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from core.config import get_settings
from core.search import facts
from core.search.filters import MemoryFilter
from tests.helpers.api import ids, save, search

AGENTS = (None, "a", "b")
PERSONAS = (None, "analyst", "ops")
CATEGORIES = ("core", "daily", "conversation", "workspace")
KINDS = ("fact", "decision", "todo")
STATUSES = ("active", "active", "stale", "forgotten")
ENTITIES = ("shop.orders", "shop.orders.amount", "crm", "crm.accounts", "memory:m1", "wh.sales.total")
TAGS = ("s1", "s2", "urgent")
BASE = datetime(2024, 1, 1, tzinfo=UTC)


def _fill(tenant_id: int, rng: random.Random, count: int) -> list[str]:
    from core.db import tenant_session
    from core.memories.models import Memory

    with tenant_session(tenant_id) as session:
        for n in range(count):
            session.add(
                Memory(
                    id=f"m{n}",
                    tenant_id=tenant_id,
                    content=f"note {n}",
                    kind=rng.choice(KINDS),
                    category=rng.choice(CATEGORIES),
                    importance=0.5,
                    occurred_at=BASE + timedelta(days=rng.randrange(60)),
                    tags=rng.sample(TAGS, rng.randrange(3)),
                    entities=rng.sample(ENTITIES, rng.randrange(3)),
                    query=rng.choice((None, {"sql": "select 1"})),
                    status=rng.choice(STATUSES),
                    persona=rng.choice(PERSONAS),
                    agent_id=rng.choice(AGENTS),
                    created_by="test@example.com",
                    change_seq=n + 1,
                )
            )
    return [f"m{n}" for n in range(count)]


def _random_caller(rng: random.Random, tenant):  # type: ignore[no-untyped-def]
    from core.tenancy.context import Caller

    return Caller(
        tenant_id=tenant.tenant_id,
        tenant_name=tenant.name,
        user="u@example.com",
        role=rng.choice(("member", "member", "admin")),
        key_id="k",
        agent_id=rng.choice(AGENTS),
        persona=rng.choice(PERSONAS),
    )


def test_fact_verdicts_equal_the_sql_predicate(stack, tenant):
    """On random memories, callers and filters, the in-process verdict is the database's, id by id."""
    from core.db import tenant_session
    from core.search.filters import Eligibility

    rng = random.Random(7)
    memory_ids = _fill(tenant.tenant_id, rng, 300) + ["missing", "m1x"]
    loaded = facts.TenantFacts(tenant.tenant_id)
    with tenant_session(tenant.tenant_id) as session:
        loaded.catch_up(session, current_seq=300)
        assert 0 < len(loaded) < 300  # forgotten ones are not kept
        for case in range(200):
            caller = _random_caller(rng, tenant)
            after = BASE + timedelta(days=rng.randrange(60)) if rng.random() < 0.5 else None
            memory_filter = MemoryFilter(
                caller=caller,
                include_stale=rng.random() < 0.5,
                kind=rng.choice((None, None, *KINDS)),
                category=rng.choice((None, None, *CATEGORIES)),
                occurred_after=after,
                occurred_before=after + timedelta(days=rng.randrange(30)) if after and rng.random() < 0.6 else None,
                datasource=rng.choice((None, None, "shop", "crm", "wh")),
                tags=tuple(sorted(rng.sample(TAGS, rng.choice((0, 0, 1, 2))))),
            )
            in_sql = Eligibility(session=session, memory_filter=memory_filter)
            in_sql.check(memory_ids)
            in_process = Eligibility(session=session, memory_filter=memory_filter, facts_source=lambda: loaded)
            in_process.check(memory_ids)
            expected = {m: in_sql.bucket(m) for m in memory_ids}
            assert {m: in_process.bucket(m) for m in memory_ids} == expected, (case, memory_filter)
            narrowed = memory_filter.datasource or memory_filter.occurred_after or memory_filter.tags
            assert any(expected.values()) or narrowed


def _random_filter(rng: random.Random, tenant) -> MemoryFilter:  # type: ignore[no-untyped-def]
    return MemoryFilter(
        caller=_random_caller(rng, tenant),
        include_stale=rng.random() < 0.5,
        kind=rng.choice((None, None, *KINDS)),
        category=rng.choice((None, None, *CATEGORIES)),
        datasource=rng.choice((None, None, "shop", "crm")),
        tags=tuple(sorted(rng.sample(TAGS, rng.choice((0, 0, 1))))),
    )


def test_remembered_verdicts_outlive_a_catch_up_but_not_for_the_memories_it_changed(stack, tenant):
    """A catch-up keeps the most recent filters' verdicts on memories it did not change; those it changed
    (edited, forgotten, purged, created) are judged again: after rounds of random writes every verdict is still
    the database's."""
    from sqlalchemy import text

    from core.db import tenant_session
    from core.entities.cascade import write_tombstones
    from core.memories.models import Memory
    from core.search.filters import Eligibility

    rng = random.Random(11)
    memory_ids = _fill(tenant.tenant_id, rng, 300)
    asked = [*memory_ids, *(f"m{n}" for n in range(300, 320))]  # ids created in later rounds
    filters = [_random_filter(rng, tenant) for _ in range(facts.MEMOS_KEPT + 2)]
    loaded = facts.TenantFacts(tenant.tenant_id)
    seq, created = 300, 300

    def judged_alike(session) -> None:  # type: ignore[no-untyped-def]
        for memory_filter in filters:
            in_sql = Eligibility(session=session, memory_filter=memory_filter)
            in_sql.check(asked)
            in_process = Eligibility(session=session, memory_filter=memory_filter, facts_source=lambda: loaded)
            in_process.check(asked)
            assert {m: in_process.bucket(m) for m in asked} == {m: in_sql.bucket(m) for m in asked}, memory_filter

    with tenant_session(tenant.tenant_id) as session:
        loaded.catch_up(session, current_seq=seq)
        judged_alike(session)
    for _ in range(6):
        with tenant_session(tenant.tenant_id) as session:
            changed = set(rng.sample(memory_ids, 12))
            for memory_id in sorted(changed):
                seq += 1
                session.execute(
                    text(
                        "UPDATE memories SET kind = :kind, status = :status, persona = :persona, tags = :tags, "
                        "change_seq = :seq WHERE tenant_id = :tenant AND id = :id"
                    ),
                    {
                        "kind": rng.choice(KINDS),
                        "status": rng.choice(STATUSES),
                        "persona": rng.choice(PERSONAS),
                        "tags": rng.sample(TAGS, rng.randrange(3)),
                        "seq": seq,
                        "tenant": tenant.tenant_id,
                        "id": memory_id,
                    },
                )
            purged = rng.choice(sorted(set(memory_ids) - changed))
            seq += 1
            session.execute(
                text("DELETE FROM memories WHERE tenant_id = :tenant AND id = :id"),
                {"tenant": tenant.tenant_id, "id": purged},
            )
            write_tombstones(session, tenant_id=tenant.tenant_id, doc_ids=[f"memory:{purged}"], change_seq=seq)
            memory_ids.remove(purged)
        if created < 320:
            seq += 1
            with tenant_session(tenant.tenant_id) as session:
                session.add(
                    Memory(
                        id=f"m{created}",
                        tenant_id=tenant.tenant_id,
                        content="new",
                        kind="fact",
                        category="core",
                        importance=0.5,
                        occurred_at=BASE,
                        tags=[],
                        entities=["shop.orders"],
                        status="active",
                        created_by="test@example.com",
                        change_seq=seq,
                    )
                )
            memory_ids.append(f"m{created}")
            created += 1
        with tenant_session(tenant.tenant_id) as session:
            before = {f: loaded.memo(f.verdict_key()) for f in filters[-facts.MEMOS_KEPT :]}
            assert loaded.catch_up(session, current_seq=seq)
            for memory_filter, old in before.items():
                kept = loaded.memo(memory_filter.verdict_key())
                assert kept is not old  # a search still holding the old dict adds to it, not to this one
                unchanged = set(old) - changed - {purged, f"m{created - 1}"}
                assert unchanged and unchanged <= set(kept), memory_filter
                assert not (changed & set(kept))
            judged_alike(session)


def test_facts_follow_every_kind_of_write(client, tenant):
    """Facts warmed by searches see the next edit, forget, purge and restore, as the database does."""
    first = save(client, tenant, {"content": "margin by channel is weekly", "kind": "fact"})
    second = save(client, tenant, {"content": "margin by channel excludes returns", "kind": "fact"})
    body = {"question": "margin by channel"}
    for _ in range(2):
        assert set(ids(search(client, tenant, body)["memories"])) == {first, second}
    assert client.patch(f"/v1/memories/{first}", json={"kind": "decision"}, headers=tenant.headers()).status_code == 200
    assert ids(search(client, tenant, {**body, "kind": "decision"})["memories"]) == [first]
    assert ids(search(client, tenant, {**body, "kind": "fact"})["memories"]) == [second]
    assert client.delete(f"/v1/memories/{second}", headers=tenant.headers()).status_code == 200
    assert ids(search(client, tenant, body)["memories"]) == [first]
    assert client.delete(f"/v1/memories/{first}?purge=true", headers=tenant.headers()).status_code == 200
    assert search(client, tenant, body)["memories"] == []
    again = save(client, tenant, {"content": "margin by channel is weekly", "kind": "fact"})
    assert ids(search(client, tenant, body)["memories"]) == [again]


def test_a_tenant_over_the_budget_is_judged_in_sql(client, make_tenant, monkeypatch):
    """Past ``search_facts_max_memories`` a tenant's facts are not kept, and searches answer the same."""
    small, large = make_tenant(), make_tenant()
    for tenant in (small, large):
        for n in range(3):
            save(client, tenant, {"content": f"cohort retention note {n}", "agent_id": "a" if n else None})
    body = {"question": "cohort retention"}
    answers = {t.tenant_id: ids(search(client, t, body)["memories"]) for t in (small, large)}
    assert all(len(a) == 3 for a in answers.values())
    monkeypatch.setattr(get_settings(), "search_facts_max_memories", 3)
    assert ids(search(client, small, body)["memories"]) == answers[small.tenant_id]
    # Room for one tenant of three memories: the least recently searched one is let go.
    assert small.tenant_id in facts._tenants and large.tenant_id not in facts._tenants
    # The running total the budget is checked against is the sum over the tenants held, no more.
    assert set(facts._sizes) == set(facts._tenants) and facts._held == sum(facts._sizes.values()) <= 3
    monkeypatch.setattr(get_settings(), "search_facts_max_memories", 2)
    save(client, large, {"content": "cohort retention note 4"})
    assert len(search(client, large, body)["memories"]) == 4
    assert large.tenant_id not in facts._tenants
    assert set(facts._sizes) == set(facts._tenants) and facts._held == sum(facts._sizes.values())


def test_a_search_does_not_wait_unbounded_for_another_ones_catch_up(client, tenant, monkeypatch):
    """While another search holds a tenant's facts (catching them up), a search waits at most
    CATCH_UP_WAIT_SECONDS and then judges eligibility in SQL: the same answer, never a hang."""
    for i in range(5):
        save(client, tenant, {"content": f"courier parcel {i} leaves the depot"})
    body = {"question": "courier parcel depot", "max_memories": 10}
    expected = ids(search(client, tenant, body)["memories"])
    save(client, tenant, {"content": "courier parcel 9 leaves the depot late"})  # the facts are behind now
    monkeypatch.setattr(facts, "CATCH_UP_WAIT_SECONDS", 0.05)
    held = facts._tenants[tenant.tenant_id]
    assert held.lock.acquire(timeout=1)
    try:
        answer = ids(search(client, tenant, body)["memories"])
    finally:
        held.lock.release()
    assert set(expected) < set(answer) and len(answer) == len(expected) + 1
    assert ids(search(client, tenant, body)["memories"]) == answer  # caught up again once free
