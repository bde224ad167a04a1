"""POST /v1/search over memories on the real stack (CONTRACT section 6, reference search.md)."""

from __future__ import annotations

import shutil

import pytest
from rank_bm25 import BM25Plus

from tests.helpers.api import ids, save, search


def test_response_shape(client, tenant):
    """The response carries every contract field; hits carry theirs."""
    save(client, tenant, {"content": "weekly revenue is computed on fiscal weeks", "kind": "decision"})
    out = search(client, tenant, {"question": "fiscal weeks revenue"})
    assert set(out) >= {
        "memories",
        "example_queries",
        "entities",
        "resolved_input_entities",
        "warnings",
        "channels",
        "degraded",
    }
    assert set(out["channels"]) == {"entity_bm25", "fulltext", "dense", "graph"}
    hit = out["memories"][0]
    assert set(hit) >= {
        "id",
        "score",
        "text",
        "matched_entities",
        "kind",
        "category",
        "importance",
        "created_at",
    }
    assert hit["kind"] == "decision" and hit["importance"] == 0.8
    assert hit["text"] == "weekly revenue is computed on fiscal weeks"


@pytest.mark.parametrize(
    "query_hubs",
    [(0, 2), (0, 1, 2), (1, 1), (2,)],
    ids=["two", "three (a padded statement)", "one repeated", "one"],
)
def test_entity_bm25_scores_equal_rank_bm25(client, tenant, query_hubs):
    """Channel 1 scores equal rank_bm25.BM25Plus over the tenant's corpus of entity tags plus the
    implicit self reference; memories without overlap are excluded; alone, the ranking is BM25's order."""
    hubs = [save(client, tenant, {"content": f"hub {i}"}) for i in range(3)]
    refs = [f"memory:{h}" for h in hubs]
    layout = [[0], [0, 1], [1], [1, 2], [0, 1, 2], [2], [], [0, 0 + 1]]
    for n, tags in enumerate(layout):
        save(client, tenant, {"content": f"note {n}", "linked_entities": [refs[t] for t in tags]})
    # The oracle corpus: every active memory of the tenant.
    listing = client.get("/v1/memories?limit=200", headers=tenant.headers()).json()["memories"]
    corpus = {m["id"]: [*m["entities"], f"memory:{m['id']}"] for m in listing}
    doc_ids = sorted(corpus)
    query = [refs[h] for h in query_hubs]
    oracle = BM25Plus([corpus[d] for d in doc_ids]).get_scores(query)
    expected = {d: s for d, s in zip(doc_ids, oracle, strict=True) if any(q in corpus[d] for q in query)}
    out = search(client, tenant, {"entities": query, "max_memories": 100, "max_entities": 0})
    got = {h["id"]: h["score"] for h in out["memories"]}
    assert set(got) == set(expected)
    # Alone, the channel's relevance is its vote: (61 / (60 + rank)) * score / top score (core.search.fusion).
    ranked = sorted(expected.items(), key=lambda item: (-item[1], item[0]))
    assert [h["id"] for h in out["memories"]] == [memory_id for memory_id, _ in ranked]
    top = ranked[0][1]
    for rank, (memory_id, score) in enumerate(ranked, start=1):
        assert got[memory_id] == pytest.approx(61 / (60 + rank) * score / top, rel=1e-12)
    assert got[ranked[0][0]] == 1.0
    assert out["channels"] == {"entity_bm25": True, "fulltext": False, "dense": False, "graph": False}
    assert out["degraded"] is False


def test_memory_self_reference_surfaces_first(client, tenant):
    """entities=["memory:<id>"] puts that memory on top with matched_entities ["memory:<id>"]."""
    target = save(client, tenant, {"content": "the named one"})
    for _ in range(3):
        save(client, tenant, {"content": "linked", "linked_entities": [f"memory:{target}", f"memory:{target}"]})
    out = search(client, tenant, {"entities": [f"memory:{target}"], "max_entities": 0})
    assert out["memories"][0]["id"] == target
    assert out["memories"][0]["matched_entities"] == [f"memory:{target}"]
    assert out["resolved_input_entities"] == [f"memory:{target}"]
    assert out["entities"] == []


def test_lenient_entity_input(client, tenant):
    """Unresolved refs become warnings and are left out of resolved_input_entities; search proceeds."""
    target = save(client, tenant, {"content": "exists"})
    out = search(client, tenant, {"entities": [f"memory:{target}", "memory:nonexistent"]})
    assert "entity 'memory:nonexistent' dropped: No memory with id 'nonexistent'" in out["warnings"]
    assert out["resolved_input_entities"] == [f"memory:{target}"]
    assert ids(out["memories"]) == [target]


def test_recency_fallback(client, tenant):
    """Nothing to search for: newest learning-only and newest query-bearing memories, with a warning."""
    old = [save(client, tenant, {"content": f"learning {i}"}) for i in range(4)]
    queries = [save(client, tenant, {"content": f"example {i}", "query": {"measures": ["x"]}}) for i in range(3)]
    out = search(client, tenant, {"max_memories": 2, "max_example_queries": 1})
    assert ids(out["memories"]) == old[::-1][:2]
    assert ids(out["example_queries"]) == queries[-1:]
    assert out["example_queries"][0]["query"] == {"measures": ["x"]}
    assert any("most recent" in w for w in out["warnings"])
    assert out["channels"] == {"entity_bm25": False, "fulltext": False, "dense": False, "graph": False}
    assert out["degraded"] is False


def test_fulltext_read_your_writes_and_stemming(client, tenant):
    """A memory saved is found by the next search; English stemming; `_` and `.` split words."""
    first = search(client, tenant, {"question": "shipping delays"})
    assert first["memories"] == []
    mid = save(client, tenant, {"content": "orders shipped late during the holiday_season"})
    out = search(client, tenant, {"question": "shipping delays"})
    assert ids(out["memories"]) == [mid]
    assert ids(search(client, tenant, {"question": "season"})["memories"]) == [mid]
    assert out["channels"]["fulltext"] and out["channels"]["graph"]


def test_index_directory_deleted_is_rebuilt(client, tenant, stack):
    """Deleting the index directory loses nothing: the next write's catch-up rebuilds it from PostgreSQL."""
    from core.search.index import forget_open_indexes

    mid = save(client, tenant, {"content": "quarterly churn analysis by region"})
    assert ids(search(client, tenant, {"question": "churn"})["memories"]) == [mid]
    shutil.rmtree(stack.home / "index" / f"tenant-{tenant.tenant_id}")
    forget_open_indexes()
    assert ids(search(client, tenant, {"question": "churn"})["memories"]) == [mid]
    other = save(client, tenant, {"content": "churn is measured monthly"})
    assert set(ids(search(client, tenant, {"question": "churn"})["memories"])) == {mid, other}


def test_a_search_never_opens_an_index_from_inside_its_transaction(client, tenant):
    """Rule: opening an index may wait for its lock, so inside a search's transaction the index is only
    caught up when this process has it open already; otherwise the search catches up outside (and opens it
    there), and finds the memory either way."""
    from core.db import tenant_session
    from core.search.index import _open_index, catch_up_before_search, catch_up_in, forget_open_indexes

    mid = save(client, tenant, {"content": "kittiwake cliff census"})
    forget_open_indexes()
    with tenant_session(tenant.tenant_id) as session:
        assert catch_up_in(session, tenant.tenant_id) is False
    assert _open_index(tenant.tenant_id) is None
    assert ids(search(client, tenant, {"question": "kittiwake"})["memories"]) == [mid]
    assert _open_index(tenant.tenant_id) is not None
    other = save(client, tenant, {"content": "kittiwake chick count"})
    catch_up_before_search(tenant.tenant_id)
    with tenant_session(tenant.tenant_id) as session:
        assert catch_up_in(session, tenant.tenant_id) is True
    assert set(ids(search(client, tenant, {"question": "kittiwake"})["memories"])) == {mid, other}

def test_forgotten_never_stale_only_with_flag(client, tenant):
    """Forgotten memories never appear; stale ones only with include_stale."""
    from sqlalchemy import update

    from core.changes import bump_change_seq
    from core.db import tenant_session
    from core.memories.models import Memory

    gone = save(client, tenant, {"content": "obsolete margin rule"})
    stale = save(client, tenant, {"content": "stale margin rule"})
    keep = save(client, tenant, {"content": "current margin rule"})
    assert client.delete(f"/v1/memories/{gone}", headers=tenant.headers()).status_code == 200
    with tenant_session(tenant.tenant_id) as session:
        _, seq = bump_change_seq(session, tenant_id=tenant.tenant_id)
        session.execute(update(Memory).where(Memory.id == stale).values(status="stale", change_seq=seq))
    for body in ({"question": "margin rule"}, {}, {"mode": "recent"}):
        assert set(ids(search(client, tenant, body)["memories"])) == {keep}
        with_stale = search(client, tenant, {**body, "include_stale": True})
        assert set(ids(with_stale["memories"])) == {keep, stale}


def test_visibility_applies_to_every_hit(client, tenant, member_key):
    """Agent-scoped memories reach only their agent; personas only their persona; admins see all."""
    key = member_key()
    mine = save(client, tenant, {"content": "ledger note for agent a", "agent_id": "a"}, key=key)
    other = save(client, tenant, {"content": "ledger note for agent b", "agent_id": "b"}, key=key)
    shared = save(client, tenant, {"content": "ledger note shared", "agent_id": "b", "category": "workspace"}, key=key)
    persona = save(client, tenant, {"content": "ledger note persona", "persona": "analyst"}, key=key)
    for body in ({"question": "ledger note"}, {}, {"mode": "important"}):
        body = {**body, "max_memories": 50}
        seen = set(ids(search(client, tenant, {**body, "agent_id": "a"}, key=key)["memories"]))
        assert seen == {mine, shared}
        seen = set(ids(search(client, tenant, {**body, "agent_id": "a", "persona": "analyst"}, key=key)["memories"]))
        assert seen == {mine, shared, persona}
        assert set(ids(search(client, tenant, body)["memories"])) == {mine, other, shared, persona}
    out = search(client, tenant, {"entities": [f"memory:{other}"], "agent_id": "a"}, key=key)
    assert out["resolved_input_entities"] == [] and out["memories"] == []


def test_tenants_never_see_each_other(client, make_tenant):
    a, b = make_tenant(), make_tenant()
    save(client, a, {"content": "secret pricing formula"})
    assert search(client, b, {"question": "secret pricing formula"})["memories"] == []
    assert search(client, b, {})["memories"] == []
    out = search(client, b, {"entities": ["memory:1"]})
    assert out["memories"] == [] and out["resolved_input_entities"] == []


@pytest.mark.parametrize(
    ("mode", "extra", "expected"),
    [
        ("recent", {}, ["d", "c", "b", "a"]),
        ("important", {}, ["c", "a", "d", "b"]),
        ("typed", {"kind": "todo"}, ["d", "b"]),
        ("recent", {"category": "workspace"}, ["c"]),
        ("important", {"kind": "todo"}, ["d", "b"]),
    ],
)
def test_modes(client, tenant, mode, extra, expected):
    """recent: newest first; important: importance then newest; typed: that kind, newest first."""
    bodies = {
        "a": {"kind": "fact", "importance": 0.6},
        "b": {"kind": "todo", "importance": 0.1},
        "c": {"kind": "decision", "importance": 0.9, "category": "workspace"},
        "d": {"kind": "todo", "importance": 0.3},
    }
    for name, body in bodies.items():
        save(client, tenant, {"id": name, "content": f"memory {name}", **body})
    out = search(client, tenant, {"mode": mode, "max_memories": 10, **extra})
    assert ids(out["memories"]) == expected
    assert out["entities"] == [] and out["channels"]["fulltext"] is False


def test_occurred_filters(client, tenant):
    """occurred_after / occurred_before bound the event time (inclusive) in every mode."""
    for day in (1, 2, 3):
        save(
            client,
            tenant,
            {
                "id": f"d{day}",
                "content": f"standup notes day {day}",
                "occurred_at": f"2024-05-0{day}T10:00:00Z",
            },
        )
    window = {"occurred_after": "2024-05-02T00:00:00Z", "occurred_before": "2024-05-03T10:00:00Z"}
    for body in ({"question": "standup notes"}, {"mode": "recent"}, {}):
        assert set(ids(search(client, tenant, {**body, **window})["memories"])) == {"d2", "d3"}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"mode": "typed"}, 422, "kind"),
        ({"mode": "sideways"}, 422, "mode"),
        ({"max_memories": -1}, 422, "max_memories"),
        ({"max_entities": 1000}, 422, "max_entities"),
        ({"entities": "memory:1"}, 422, "entities"),
        ({"kind": "rumour"}, 422, "kind"),
        (
            {"occurred_after": "2024-02-01T00:00:00Z", "occurred_before": "2024-01-01T00:00:00Z"},
            422,
            "occurred_after",
        ),
        ({"datasource": "no_such_ds"}, 400, "datasource"),
        ({"question": 42}, 422, "question"),
    ],
)
def test_bad_input_is_4xx_json(client, tenant, body, status, field):
    response = client.post("/v1/search", json=body, headers=tenant.headers())
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field


def test_bad_body_and_auth(client, tenant):
    assert client.post("/v1/search", json=[1, 2], headers=tenant.headers()).status_code == 422
    assert client.post("/v1/search", json={}).status_code == 401


def test_dense_degraded_without_embeddings_never_without_question(client, tenant):
    """A question and no stored embeddings: a warning and degraded, never an error; no question: not degraded."""
    save(client, tenant, {"content": "refund policy for damaged goods"})
    out = search(client, tenant, {"question": "refund policy"})
    assert out["degraded"] is True and out["channels"]["dense"] is False
    assert any("dense channel skipped" in w for w in out["warnings"])
    assert len(out["memories"]) == 1
    mid = out["memories"][0]["id"]
    assert search(client, tenant, {"entities": [f"memory:{mid}"]})["degraded"] is False


def test_dense_runs_with_embeddings(client, tenant):
    """With embeddings of the active model the dense channel runs; it finds paraphrases full-text misses."""
    target = save(client, tenant, {"content": "the customer was reimbursed for the broken parcel", "sync_embed": True})
    save(client, tenant, {"content": "warehouse shelves are restocked on monday", "sync_embed": True})
    out = search(client, tenant, {"question": "refund damaged package", "max_memories": 1})
    assert out["channels"]["dense"] is True and out["degraded"] is False
    assert ids(out["memories"]) == [target]


def test_graph_one_hop_from_top_hits(client, tenant):
    """A memory associated with a top hit surfaces through the graph channel even without shared words."""
    top = save(client, tenant, {"content": "invoice reconciliation runs nightly"})
    linked = save(
        client,
        tenant,
        {"content": "see the finance runbook", "associations": [{"target_id": top, "weight": 0.9}]},
    )
    save(client, tenant, {"content": "unrelated lunch menu"})
    out = search(client, tenant, {"question": "invoice reconciliation"})
    assert ids(out["memories"])[:2] == [top, linked]
    assert out["channels"]["graph"] is True
    entity_only = search(client, tenant, {"entities": [f"memory:{top}"]})
    assert ids(entity_only["memories"]) == [top] and entity_only["channels"]["graph"] is False


def test_per_bucket_invariance(client, tenant):
    """A bucket's membership and order depend only on the corpus, the inputs and its own cap."""
    for i in range(30):
        body = {"content": f"revenue note {i} " + "revenue " * (i % 5)}
        if i % 3 == 0:
            body["query"] = {"measures": [f"revenue_{i}"]}
        save(client, tenant, body)
    for inputs in ({"question": "revenue note"}, {}, {"mode": "important"}):
        base = search(client, tenant, {**inputs, "max_memories": 7, "max_example_queries": 3})
        for other in (0, 1, 10, 50):
            varied = search(
                client,
                tenant,
                {**inputs, "max_memories": 7, "max_example_queries": other, "max_entities": other},
            )
            assert [(h["id"], h["score"]) for h in varied["memories"]] == [
                (h["id"], h["score"]) for h in base["memories"]
            ]
            again = search(client, tenant, {**inputs, "max_memories": other, "max_example_queries": 3})
            assert ids(again["example_queries"]) == ids(base["example_queries"])
        prefix = search(client, tenant, {**inputs, "max_memories": 3})
        assert ids(prefix["memories"]) == ids(base["memories"])[:3]
