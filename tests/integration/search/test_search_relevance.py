"""Relevance scores, the filters search and list gained, and read-your-writes in ranking (CONTRACT 4, 6)."""

from __future__ import annotations

import pytest

from tests.helpers.api import ids, save, search

NOTES = [
    "the nightly export job writes the orders table to the warehouse",
    "the orders export runs after the nightly backup of the warehouse",
    "warehouse loads are retried three times before the job fails",
    "the export job of the orders table is owned by the data platform team",
    "nightly jobs of the warehouse are paused during the quarterly close",
]


def _similar_notes(client, tenant, count: int) -> None:  # type: ignore[no-untyped-def]
    """``count`` embedded notes that all look alike (they share most of their words)."""
    for n in range(count):
        save(client, tenant, {"content": f"{NOTES[n % len(NOTES)]} (note {n})", "sync_embed": True})


def test_scores_are_relevances_comparable_across_queries(client, tenant):
    """Every score is in [0, 1]; an exact quotation scores about 1 (first or nearly so in every channel that
    ran: its twin "note 7" shares all but one word) and a question with no real match scores clearly lower,
    so a caller can threshold; min_score drops hits."""
    _similar_notes(client, tenant, 10)
    quoted = NOTES[2] + " (note 2)"
    exact = search(client, tenant, {"question": quoted})
    assert exact["channels"]["dense"] and exact["channels"]["fulltext"]
    assert ids(exact["memories"])[0] == "3"
    assert exact["memories"][0]["score"] >= 0.95
    nothing = search(client, tenant, {"question": "zebra"})
    for out in (exact, nothing):
        assert all(0.0 <= h["score"] <= 1.0 for h in out["memories"])
    assert max((h["score"] for h in nothing["memories"]), default=0.0) <= 0.5
    kept = search(client, tenant, {"question": quoted, "min_score": 0.9})
    assert ids(kept["memories"]) == [h["id"] for h in exact["memories"] if h["score"] >= 0.9]
    assert ids(search(client, tenant, {"question": "zebra", "min_score": 0.6})["memories"]) == []
    recent = search(client, tenant, {"mode": "recent", "max_memories": 3})
    assert recent["memories"][0]["score"] == 1.0
    assert all(0 < h["score"] <= 1 for h in recent["memories"])


@pytest.mark.parametrize("bad", [-0.1, 1.5, "high"])
def test_min_score_is_validated(client, tenant, bad):
    """min_score outside [0, 1] is a 422 naming it."""
    out = search(client, tenant, {"question": "x", "min_score": bad}, expect=422)
    assert out["error"]["field"] == "min_score"


def test_tags_filter_is_any_of(client, tenant):
    """``tags`` on search keeps the memories carrying at least one of the tags, in every mode."""
    a = save(client, tenant, {"content": "refund policy for parcels", "tags": ["ops", "eu"]})
    b = save(client, tenant, {"content": "refund policy for vouchers", "tags": ["finance"]})
    c = save(client, tenant, {"content": "refund policy for gift cards"})
    assert set(ids(search(client, tenant, {"question": "refund policy"})["memories"])) == {a, b, c}
    assert ids(search(client, tenant, {"question": "refund policy", "tags": ["eu"]})["memories"]) == [a]
    both = search(client, tenant, {"question": "refund policy", "tags": ["finance", "eu", "none"]})
    assert set(ids(both["memories"])) == {a, b}
    assert set(ids(search(client, tenant, {"mode": "recent", "tags": ["finance"]})["memories"])) == {b}
    assert search(client, tenant, {"question": "refund policy", "tags": ["none"]})["memories"] == []
    assert set(ids(search(client, tenant, {"question": "refund policy", "tags": []})["memories"])) == {a, b, c}


def test_list_filters_by_event_time(client, tenant):
    """GET /v1/memories takes occurred_after / occurred_before (inclusive); reversed bounds are a 422."""
    h = tenant.headers()
    made = {
        day: save(client, tenant, {"content": f"event on day {day}", "occurred_at": f"2024-03-{day:02d}T12:00:00Z"})
        for day in (1, 10, 20)
    }

    def listed(query: str) -> set[str]:
        response = client.get(f"/v1/memories?{query}", headers=h)
        assert response.status_code == 200, response.text
        return {m["id"] for m in response.json()["memories"]}

    assert listed("occurred_after=2024-03-10T12:00:00Z") == {made[10], made[20]}
    assert listed("occurred_before=2024-03-10T12:00:00Z") == {made[1], made[10]}
    assert listed("occurred_after=2024-03-02&occurred_before=2024-03-19") == {made[10]}
    bad = client.get("/v1/memories?occurred_after=2024-03-20&occurred_before=2024-03-01", headers=h)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "occurred_after"
    assert client.get("/v1/memories?occurred_after=yesterday", headers=h).status_code == 422


@pytest.mark.parametrize("path", ["exact", "approximate"])
def test_fresh_memory_is_first_for_its_own_words(client, tenant, monkeypatch, path):
    """Read-your-writes in ranking: in a tenant of ~60 similar embedded notes, a note saved without waiting
    for its embedding is the first hit for a question made of its unique token and its own words, at once
    and with default caps (dense cannot count against a memory it has no vector of), on the exact numpy
    path and on pgvector's approximate one."""
    from core.config import get_settings

    _similar_notes(client, tenant, 60)
    if path == "approximate":
        monkeypatch.setattr(get_settings(), "dense_exact_max_docs", 0)
    for attempt in range(5):
        token = f"zq{attempt}xv"
        content = f"the nightly export job of the warehouse now also writes {token} to the orders table"
        fresh = save(client, tenant, {"content": content})
        out = search(client, tenant, {"question": f"{token} nightly export job orders warehouse"})
        assert out["channels"]["dense"] is True
        assert ids(out["memories"])[0] == fresh, out["memories"]


def test_rare_terms_and_phrase_beat_notes_sharing_common_words(client, tenant):
    """A note holding the question's rare token and its phrase ranks first, over twenty embedded notes that
    share only common words ("in", "the", "cache") with the question, and over notes the graph reaches
    from them (hops follow direct evidence and never outrank it)."""
    fillers = [
        save(
            client,
            tenant,
            {"content": f"the cache {n} lives in the database and in redis in region {n}", "sync_embed": True},
        )
        for n in range(20)
    ]
    target = save(
        client,
        tenant,
        {"content": "the zorblat lookup table is kept in-process, rebuilt on start", "sync_embed": True},
    )
    for filler in fillers[:2]:
        save(
            client,
            tenant,
            {
                "content": f"see the other note about cache placement {filler}",
                "associations": [{"target_id": filler, "relation_type": "related_to", "weight": 1.0}],
                "sync_embed": True,
            },
        )
    out = search(client, tenant, {"question": "Is the zorblat cache in-process in the database?"})
    assert ids(out["memories"])[0] == target, out["memories"]
    assert out["memories"][0]["score"] > out["memories"][1]["score"]


def test_pasted_canonical_id_returns_that_column(client, catalog):  # noqa: F811
    """A question that is a canonical id returns that entity first, over its siblings and its model."""
    body = {
        "columns": [
            {"name": "country", "type": "TEXT", "description": "shipping country"},
            {"name": "country_code", "type": "TEXT", "description": "ISO code of the shipping country"},
            {"name": "city", "type": "TEXT", "description": "shipping city"},
        ]
    }
    response = client.put("/v1/models/shop/addresses", json=body, headers=catalog.headers())
    assert response.status_code == 200, response.text
    for question in ("shop.addresses.country", "shop.addresses.country_code", "shop.orders.amount"):
        out = search(client, catalog, {"question": question})
        assert ids(out["entities"])[0] == question, (question, out["entities"])


def test_memories_of_one_explicit_event_time_lend_their_words(client, tenant):
    """Without a run id, memories saved with the same explicit ``occurred_at`` (the turns of one session imported
    with its date) are one episode: each is indexed with its neighbours' text. A memory whose event time
    defaulted to its save time, or differs, is in no episode."""
    at = {"occurred_at": "2023-05-08T13:56:00Z"}
    asked = save(client, tenant, {"content": "Did you visit the aquarium?", **at})
    answer = save(client, tenant, {"content": "Yes, last Friday with my kids!", **at})
    other = save(client, tenant, {"content": "Yes, we went on Sunday", "occurred_at": "2023-05-09T10:00:00Z"})
    alone = save(client, tenant, {"content": "Yes, the museum, with no kids"})
    found = ids(search(client, tenant, {"question": "aquarium", "max_memories": 10})["memories"])
    assert set(found[:2]) == {asked, answer}
    assert other not in found and alone not in found


def test_dense_similarity_floor_is_a_setting(client, tenant, monkeypatch):
    """Dense ranks only docs at least ``dense_similarity_floor`` like the question: with no floor an unrelated
    question gets nearest neighbours, with an unreachable one nothing (the channel still ran)."""
    from core.config import get_settings

    _similar_notes(client, tenant, 6)
    monkeypatch.setattr(get_settings(), "dense_similarity_floor", -1.0)
    assert len(search(client, tenant, {"question": "zebra"})["memories"]) == 5
    monkeypatch.setattr(get_settings(), "dense_similarity_floor", 1.0)
    out = search(client, tenant, {"question": "zebra"})
    assert out["channels"]["dense"] is True and out["memories"] == []
