"""Searches share the eligibility verdicts a tenant's facts remember when their filters judge alike
(`MemoryFilter.verdict_key`): equal keys must mean equal verdicts on every memory."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta

from core.search.facts import Fact
from core.search.filters import MemoryFilter
from core.tenancy.context import Caller

BASE = datetime(2026, 1, 1, tzinfo=UTC)


def _caller(rng: random.Random) -> Caller:
    return Caller(
        tenant_id=1,
        tenant_name="acme",
        user=rng.choice(["ana@example.com", "bo@example.com", "cy@example.com"]),
        role=rng.choice(["admin", "member", "reader"]),
        key_id=rng.choice(["k1", "k2", "k3", "k4"]),
        agent_id=rng.choice([None, "planner", "writer"]),
        persona=rng.choice([None, "analyst", "support"]),
    )


def _filter(rng: random.Random) -> MemoryFilter:
    return MemoryFilter(
        caller=_caller(rng),
        include_stale=rng.random() < 0.3,
        kind=rng.choice([None, None, "fact", "decision"]),
        category=rng.choice([None, None, "core", "reference"]),
        occurred_after=rng.choice([None, None, BASE + timedelta(days=2)]),
        occurred_before=rng.choice([None, None, BASE + timedelta(days=6)]),
        datasource=rng.choice([None, None, "shop"]),
        tags=rng.choice([(), (), ("billing",), ("billing", "eu")]),
    )


def _fact(rng: random.Random) -> Fact:
    return Fact(
        status=rng.choice(["active", "stale", "forgotten"]),
        persona=rng.choice([None, "analyst", "support"]),
        agent_id=rng.choice([None, "planner", "writer"]),
        category=rng.choice(["core", "daily", "conversation", "reference"]),
        kind=rng.choice(["fact", "decision", "preference"]),
        occurred_at=rng.choice([None, BASE + timedelta(days=rng.randrange(9))]),
        carries_query=rng.random() < 0.3,
        roots=frozenset(rng.sample(["shop", "crm"], rng.randrange(3))),
        tags=frozenset(rng.sample(["billing", "eu", "ops"], rng.randrange(4))),
        in_episode=rng.random() < 0.3,
    )


def test_filters_with_equal_verdict_keys_judge_every_memory_alike():
    rng = random.Random(31)
    facts = [_fact(rng) for _ in range(400)] + [None]
    filters = [_filter(rng) for _ in range(300)]
    by_key: dict[tuple, list[MemoryFilter]] = {}
    for memory_filter in filters:
        by_key.setdefault(memory_filter.verdict_key(), []).append(memory_filter)
    shared = [group for group in by_key.values() if len(group) > 1]
    assert len(shared) > 20  # the generated filters do share keys (else this test would prove nothing)
    for group in shared:
        first = [group[0].verdict(fact) for fact in facts]
        assert len(set(first)) > 1 or all(verdict is None for verdict in first)
        for other in group[1:]:
            assert [other.verdict(fact) for fact in facts] == first


def test_callers_differing_only_in_key_user_or_role_share_a_key_and_visibility_does_not():
    member = Caller(tenant_id=1, tenant_name="acme", user="a@x", role="member", key_id="k1", agent_id="planner")
    keys = {
        MemoryFilter(caller=Caller(**{**vars(member), "user": user, "key_id": key, "role": role})).verdict_key()
        for user, key, role in itertools.product(["a@x", "b@x"], ["k1", "k2"], ["member", "reader"])
    }
    assert len(keys) == 1
    others = [
        Caller(**{**vars(member), "agent_id": "writer"}),
        Caller(**{**vars(member), "persona": "analyst"}),
        Caller(**{**vars(member), "role": "admin", "agent_id": None}),  # an admin naming no agent sees all
    ]
    assert len({MemoryFilter(caller=c).verdict_key() for c in others} | keys) == 4
    # Admins who see all judge alike whatever else they carry.
    admins = {
        MemoryFilter(caller=Caller(tenant_id=1, tenant_name="acme", user=u, role="admin", key_id=k)).verdict_key()
        for u, k in itertools.product(["a@x", "b@x"], ["k1", "k2"])
    }
    assert len(admins) == 1
