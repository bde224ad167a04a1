"""Dense channel: run context blending and full-text feedback (core.search.dense)."""

from __future__ import annotations

import numpy as np
import pytest

from core.search.dense import CONTEXT_WEIGHT, with_context
from tests.helpers.api import ids, save, search
from tests.helpers.embeddings import converge


def test_with_context_blends_neighbour_mean_and_keeps_lone_rows():
    scores = np.array([0.9, 0.1, 0.3, 0.5], dtype=np.float32)
    neighbours = np.array([[-1, 1], [0, 2], [1, -1], [-1, -1]])
    out = with_context(scores, neighbours)
    w = CONTEXT_WEIGHT
    expected = [
        (0.9 + w * 0.1) / (1 + w),
        (0.1 + w * (0.9 + 0.3) / 2) / (1 + w),
        (0.3 + w * 0.1) / (1 + w),
        0.5,  # no neighbours: its own cosine
    ]
    assert np.allclose(out, expected)
    assert with_context(scores, np.full((4, 2), -1)) is scores


def test_dense_context_and_feedback_keep_bucket_invariance(client, tenant):
    """Memories in runs, with embeddings: buckets still depend only on corpus, inputs and own cap."""
    for i in range(24):
        body = {
            "content": f"turn {i} about the {'garden' if i % 4 else 'invoice'} plans",
            "run_id": f"run-{i % 3}",
            "sync_embed": True,
        }
        if i % 5 == 0:
            body["query"] = {"measures": [f"revenue_{i}"]}
        save(client, tenant, body)
    base = search(client, tenant, {"question": "invoice plans", "max_memories": 6, "max_example_queries": 2})
    assert base["channels"]["dense"] is True and base["degraded"] is False
    assert base["memories"]
    for other in (0, 1, 10):
        varied = search(client, tenant, {"question": "invoice plans", "max_memories": 6, "max_example_queries": other})
        assert [(h["id"], h["score"]) for h in varied["memories"]] == [(h["id"], h["score"]) for h in base["memories"]]
        again = search(client, tenant, {"question": "invoice plans", "max_memories": other, "max_example_queries": 2})
        assert ids(again["example_queries"]) == ids(base["example_queries"])


def test_graph_hops_respect_visibility_and_filters(client, tenant, member_key):
    """Memories one hop away surface through the graph only when the caller may see them."""
    key = member_key()
    top = save(client, tenant, {"content": "invoice reconciliation runs nightly", "agent_id": "a"}, key=key)
    visible = save(
        client,
        tenant,
        {"content": "see the runbook", "agent_id": "a", "associations": [{"target_id": top, "weight": 0.9}]},
        key=key,
    )
    hidden = save(
        client,
        tenant,
        {"content": "private aside", "agent_id": "b", "associations": [{"target_id": top, "weight": 0.95}]},
        key=key,
    )
    out = search(client, tenant, {"question": "invoice reconciliation", "agent_id": "a"}, key=key)
    assert ids(out["memories"]) == [top, visible]
    everything = search(client, tenant, {"question": "invoice reconciliation"})
    assert set(ids(everything["memories"])) == {top, visible, hidden}
    typed = search(client, tenant, {"question": "invoice reconciliation", "kind": "todo"})
    assert ids(typed["memories"]) == []


def test_dense_feedback_uses_only_eligible_fulltext_hits(client, tenant, member_key):
    """The feedback guess is corrected when a top full-text hit is not the caller's to see."""
    from core.db import tenant_session
    from core.search.filters import MEMORIES
    from core.search.index import catch_up_before_search
    from core.search.schemas import SearchRequest
    from core.search.service import FEEDBACK_DOCS, run_search
    from core.tenancy.context import Caller

    key = member_key()
    private = save(
        client,
        tenant,
        {"content": "invoice invoice invoice reconciliation", "agent_id": "b", "sync_embed": True},
        key=key,
    )
    for i in range(6):
        save(client, tenant, {"content": f"invoice note {i}", "agent_id": "a", "sync_embed": True}, key=key)
    caller = Caller(
        tenant_id=tenant.tenant_id, tenant_name=tenant.name, user="m", role="member", key_id="k", agent_id="a"
    )
    # As search() does: the index is caught up before the search's transaction starts.
    catch_up_before_search(tenant.tenant_id)
    with tenant_session(tenant.tenant_id) as session:
        run = run_search(session, caller=caller, request=SearchRequest(question="invoice reconciliation"))
        response = run.response
    assert response.channels.dense is True
    assert private not in run.feedback[MEMORIES] and len(run.feedback[MEMORIES]) == FEEDBACK_DOCS
    assert private not in ids(response.model_dump()["memories"])


@pytest.mark.parametrize("runs", [False, True])
def test_the_scan_of_int8_codes_answers_as_the_float32_rows(client, make_tenant, monkeypatch, runs):
    """A tenant's searches ranked from the codes of its rows (every side scanned so: APPROXIMATE_MIN_ROWS at 1) and
    from the float32 rows answer the same: hits, order and scores, through context, feedback and the floor."""
    from core.embeddings.matrix import Side
    from core.search import dense

    tenant = make_tenant()
    topics = ("invoice", "garden", "deploy", "billing", "refund", "schema")
    items = []
    for i in range(90):
        body = {
            "content": f"turn {i}: the {topics[i % 6]} plan, step {i % 7}, owner {topics[(i * 5) % 6]}",
        }
        if runs:
            body["run_id"] = f"run-{i % 4}"
        if i % 9 == 0:
            body["query"] = {"measures": [f"{topics[i % 6]}_total"]}
        items.append(body)
    response = client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
    assert response.status_code == 200, response.text
    assert not [r for r in response.json()["results"] if "error" in r]
    converge(client, tenant, dense.dense_model())
    questions = [f"what is the {topic} plan owner" for topic in topics] + ["step 3 of the refund", "garden invoice"]
    body = {"max_memories": 8, "max_example_queries": 3}

    def answers():
        return [search(client, tenant, {**body, "question": question}) for question in questions]

    exact = answers()
    scans = []
    approximate = Side.approximate
    monkeypatch.setattr(Side, "approximate", lambda side, query: scans.append(side.n) or approximate(side, query))
    monkeypatch.setattr(dense, "APPROXIMATE_MIN_ROWS", 1)
    coded = answers()
    assert scans and all(n == 90 for n in scans)
    for one, other in zip(exact, coded, strict=True):
        assert one["channels"]["dense"] and other["channels"]["dense"]
        for bucket in ("memories", "example_queries"):
            assert ids(one[bucket]) == ids(other[bucket])
            assert [h["score"] for h in one[bucket]] == pytest.approx([h["score"] for h in other[bucket]], abs=1e-5)
    assert any(answer["memories"] for answer in exact) and any(answer["example_queries"] for answer in exact)
