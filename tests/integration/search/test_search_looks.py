"""How deep a channel first looks down its ranking for a bucket's eligible docs (core.search.rankings.FIRST_LOOK)
changes what a search costs, not what it answers: a look that holds too few eligible docs (a member agent's
search in a tenant of many agents) goes deeper until it holds them, and any look that holds them picks the same
(docs of exactly equal full-text score aside: which of those make a look's cut depends on its depth)."""

from __future__ import annotations

import random

import pytest

from core.search import rankings, service
from tests.helpers.api import search
from tests.helpers.embeddings import run_pending_jobs

WORDS = "orders invoices refunds region customers revenue churn weekly shipping returns latency quota".split()
QUESTIONS = ("refunds region churn", "weekly shipping latency", "orders revenue", "quota invoices returns")


@pytest.fixture
def agents_tenant(client, make_tenant):  # type: ignore[no-untyped-def]
    """A tenant of 360 notes on a small vocabulary: 20 shared, 40 of agent a1's own and 300 of eight other agents;
    a1 sees a sixth of them, so its first looks come up short."""
    tenant = make_tenant("looks")
    rng = random.Random(5)
    items = [{"content": " ".join(rng.sample(WORDS, 5)), "category": "workspace"} for _ in range(20)]
    for agent, count in [("a1", 40)] + [(f"b{i}", 38) for i in range(8)]:
        items += [
            {"content": " ".join(rng.sample(WORDS, 5)), "category": "daily", "agent_id": agent} for _ in range(count)
        ]
    response = client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
    assert response.status_code in (200, 201), response.text
    run_pending_jobs(tenant.tenant_id)  # every note embedded: dense ranks them all
    return tenant


def _answers(client, tenant):  # type: ignore[no-untyped-def]
    out = []
    for question in QUESTIONS:
        body = {"question": question, "agent_id": "a1", "max_memories": 10, "max_entities": 0}
        found = search(client, tenant, body)
        assert found["channels"]["dense"] and not found["degraded"]
        out.append([(hit["id"], hit["score"]) for hit in found["memories"]])
    return out


def test_answers_do_not_depend_on_how_deep_the_first_look_goes(client, agents_tenant, monkeypatch):
    looks: list[int] = []
    ranked = service._rank

    def recorded(state, channel, bucket, limit):  # type: ignore[no-untyped-def]
        looks.append(limit)
        return ranked(state, channel, bucket, limit)

    monkeypatch.setattr(service, "_rank", recorded)
    answers = {}
    for first in (1, 2, 3, rankings.MAX_SCAN):
        monkeypatch.setattr(rankings, "FIRST_LOOK", first)
        looks.clear()
        answers[first] = _answers(client, agents_tenant)
        first_look = min(first * rankings.bucket_depth(10), rankings.MAX_SCAN)
        deeper = [limit for limit in looks if limit > first_look]
        if first == 1:
            # a1 sees a sixth of the notes: 30 deep holds ~5 of its own, so the channels looked deeper.
            assert deeper, looks
    assert all(hits for hits in answers[1])
    assert answers[1] == answers[2] == answers[3] == answers[rankings.MAX_SCAN]


def test_a_short_look_goes_as_deep_as_the_share_it_saw_asks():
    # 6 of 60 accepted, 30 wanted: at that share 300 more, with the margin 450.
    assert rankings.deeper_look(60, 6, 30) == 450
    # At least twice as deep; none seen: as deep as may be.
    assert rankings.deeper_look(60, 29, 30) == 120
    assert rankings.deeper_look(60, 0, 30) == rankings.MAX_SCAN
    assert rankings.deeper_look(600, 100, 30) == rankings.MAX_SCAN
    ranking = [(f"d{i}", 1.0 - i / 1000) for i in range(60)]
    assert rankings.short(ranking, 60, 10, 30)
    assert not rankings.short(ranking, 60, 30, 30)  # enough found
    assert not rankings.short(ranking[:50], 60, 10, 30)  # the ranking ended inside the look
    assert not rankings.short([(f"d{i}", 0.5) for i in range(1000)], 1000, 10, 30)  # MAX_SCAN deep already


def test_filtered_ranking_picks_what_a_whole_scan_picks():
    rng = random.Random(3)
    for _ in range(200):
        total, depth = rng.randrange(0, 1500), rng.randrange(1, 40)
        kept = {f"d{i}" for i in range(total) if rng.random() < rng.choice((0.02, 0.2, 0.9))}
        ranking = [(f"d{i}", float(total - i)) for i in range(total)]
        limits: list[int] = []

        def fetch(limit: int, ranking=ranking, limits=limits) -> rankings.Ranking:
            limits.append(limit)
            return ranking[:limit]

        picked = rankings.filtered_ranking(fetch, keep=lambda docs, kept=kept: kept.__contains__, depth=depth)
        whole = [hit for hit in ranking[: rankings.MAX_SCAN] if hit[0] in kept][:depth]
        assert picked == whole
        assert limits == sorted(set(limits)) and limits[-1] <= rankings.MAX_SCAN
