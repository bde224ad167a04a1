"""The search is a sequence of named steps over one explicit state (core.search.service): inputs -> channels ->
candidates per channel and bucket -> eligible candidates -> fusion -> hits. Each step can be called on its own,
and calling them in order gives exactly what ``search`` answers."""

from __future__ import annotations

from core.db import tenant_session
from core.search.filters import EXAMPLE_QUERIES, MEMORIES
from core.search.index import catch_up_before_search
from core.search.schemas import SearchRequest
from core.search.service import (
    FEEDBACK_DOCS,
    eligible_candidates,
    fuse,
    hydrate,
    memory_candidates,
    new_state,
    open_channels,
    resolve_inputs,
    run_search,
)
from core.tenancy.context import Caller
from tests.helpers.api import save


def _caller(tenant) -> Caller:  # type: ignore[no-untyped-def]
    return Caller(tenant_id=tenant.tenant_id, tenant_name=tenant.name, user="u", role="admin", key_id="k")


def test_each_step_of_a_search_can_be_called_and_inspected(client, tenant):
    """A question with a kind filter: every channel's candidates include the glacier note of the wrong kind,
    eligibility drops it, fusion puts the todo that quotes the question first, hydration makes it a hit."""
    todo = save(client, tenant, {"content": "measure glacier melt rates in spring", "kind": "todo", "sync_embed": True})
    other = save(client, tenant, {"content": "glacier melt rates doubled", "kind": "fact", "sync_embed": True})
    for i in range(4):
        save(client, tenant, {"content": f"ship the quarterly report {i}", "kind": "todo", "sync_embed": True})
    request = SearchRequest(question="glacier melt rates", kind="todo", max_example_queries=0)
    catch_up_before_search(tenant.tenant_id)
    with tenant_session(tenant.tenant_id) as session:
        state = new_state(session, caller=_caller(tenant), request=request)
        assert state.live() == [MEMORIES]

        inputs = resolve_inputs(state)
        assert inputs.resolved == [] and inputs.bm25_tokens == []

        assert open_channels(state) is None  # None: no catalog guess to undo
        assert state.response.channels.fulltext and state.response.channels.dense
        assert list(state.memory_fetch) == ["fulltext"] and state.dense_fetch is not None

        candidates = memory_candidates(state)
        assert set(candidates) == {("fulltext", MEMORIES), ("dense", MEMORIES)}
        assert other in [d for d, _ in candidates["fulltext", MEMORIES]]  # not yet judged
        assert 0 < len(state.feedback[MEMORIES]) <= FEEDBACK_DOCS

        eligible = eligible_candidates(state)
        assert set(eligible) == {MEMORIES}
        for ranking in eligible[MEMORIES].values():
            assert other not in [d for d, _ in ranking]
        assert other not in state.feedback[MEMORIES]  # feedback comes from eligible hits only

        buckets = fuse(state)
        assert buckets[EXAMPLE_QUERIES] == []
        assert buckets[MEMORIES][0][0] == todo and 0 < buckets[MEMORIES][0][1] <= 1
        scores = [score for _, score in buckets[MEMORIES]]
        assert scores == sorted(scores, reverse=True)

        response = hydrate(state)
        assert [hit.id for hit in response.memories] == [d for d, _ in buckets[MEMORIES]]

    with tenant_session(tenant.tenant_id) as session:
        whole = run_search(session, caller=_caller(tenant), request=request)
    assert whole.buckets == buckets
    assert [h.id for h in whole.response.memories] == [h.id for h in response.memories]
