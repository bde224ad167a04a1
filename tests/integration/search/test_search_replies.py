"""Replies (core.search.replies): a hit that asks something lends its relevance to the memory replying to it,
the next memory of its episode, as a graph hop of weight 1 does (core.search.fusion.with_hops)."""

from __future__ import annotations

import pytest

from core.db import tenant_session
from core.search import replies
from core.search.filters import MEMORIES
from core.search.fusion import GRAPH_SHARE
from core.search.index import catch_up_before_search
from core.search.schemas import SearchRequest
from core.search.service import (
    _fused,
    eligible_candidates,
    fuse,
    memory_candidates,
    new_state,
    open_channels,
    resolve_inputs,
)
from core.tenancy.context import Caller
from tests.helpers.api import save


@pytest.mark.parametrize(
    ("rule", "rows", "seeds", "expected"),
    [
        ("a seed's reply is worth the seed's relevance", [("q", "a")], ["q", "x"], [("a", 0.9)]),
        (
            "a reply of two seeds keeps the better one's value",
            [("q1", "a"), ("q2", "a")],
            ["q1", "q2"],
            [("a", 0.9)],
        ),
        (
            "replies are ordered by their question's value, then id",
            [("q2", "b"), ("q1", "c"), ("x", "a")],
            ["q1", "q2", "x"],
            [("c", 0.9), ("b", 0.5), ("a", 0.5)],
        ),
        ("a seed listed as its own reply lends nothing", [("q1", "q1")], ["q1"], []),
        ("rows of another bucket's seeds lend nothing here", [("other", "a")], ["q1"], []),
    ],
)
def test_replies_from_rows(rule, rows, seeds, expected) -> None:
    """A reply's value is the relevance of the question it follows (its best question when two lead to it)."""
    scores = {"q": 0.9, "q1": 0.9, "q2": 0.5, "x": 0.5, "other": 1.0}
    got = replies.from_rows(rows, seeds={MEMORIES: seeds}, seed_scores={MEMORIES: scores})
    assert got[MEMORIES] == expected, rule


def test_merged_hops_keep_each_docs_best_value() -> None:
    """Graph hops and replies merge into one hop ranking: each doc at its best value, best first, ties by id."""
    assert replies.merged([("a", 0.2), ("b", 0.6)], [("a", 0.7), ("c", 0.6)]) == [("a", 0.7), ("b", 0.6), ("c", 0.6)]


def _caller(tenant) -> Caller:  # type: ignore[no-untyped-def]
    return Caller(tenant_id=tenant.tenant_id, tenant_name=tenant.name, user="u", role="admin", key_id="k")


RUN = {"run_id": "chat-7", "category": "workspace"}
DATED = {"occurred_at": "2023-05-08T13:56:00Z"}


@pytest.mark.parametrize(
    ("rule", "asked", "episode", "reply_episode", "lifted"),
    [
        ("the reply to a question among the hits is lifted", "Did you enjoy the glacier hike?", RUN, RUN, True),
        (
            "an episode of one explicit event time has replies as a run does",
            "Did you enjoy the glacier hike?",
            DATED,
            DATED,
            True,
        ),
        ("a hit that asks nothing lends nothing", "You enjoyed the glacier hike.", RUN, RUN, False),
        ("the next memory of another episode is no reply", "Did you enjoy the glacier hike?", RUN, {}, False),
    ],
)
def test_reply_to_a_question_hit_is_lifted_as_a_hop(client, tenant, rule, asked, episode, reply_episode, lifted):
    """The memory after a hit that asks something (same episode, event time then save order) gains
    (1 - r) * GRAPH_SHARE * q, q the question's relevance and r its own: at most half the question's worth
    when nothing else found it. A hit without a question mark, or a next memory outside its episode, gains
    nothing."""
    for n in range(4):
        save(client, tenant, {"content": f"the glacier hike guide {n} is booked for spring", "sync_embed": True})
    question = save(client, tenant, {"content": asked, "sync_embed": True, **episode})
    reply = save(client, tenant, {"content": "Honestly it was the best day of my whole year", **reply_episode})
    catch_up_before_search(tenant.tenant_id)
    request = SearchRequest(question="glacier hike enjoy", max_memories=10, max_example_queries=0)
    with tenant_session(tenant.tenant_id) as session:
        state = new_state(session, caller=_caller(tenant), request=request)
        resolve_inputs(state)
        assert open_channels(state) is None
        memory_candidates(state)
        eligible_candidates(state)
        # The direct channels' relevance, before hops and replies.
        direct = dict(_fused(state, state.eligible[MEMORIES], MEMORIES))
        final = dict(fuse(state)[MEMORIES])
    q = direct[question]
    assert q > 0, rule
    r = direct.get(reply, 0.0)
    if lifted:
        assert final[reply] == pytest.approx(r + (1 - r) * GRAPH_SHARE * q), rule
        assert final[reply] > r, rule
    else:
        assert final.get(reply, 0.0) == pytest.approx(r), rule


def test_reply_outside_the_filters_is_not_returned(client, tenant):
    """A reply is judged by the search's filters like any hop: one of another kind stays out."""
    question = save(client, tenant, {"content": "Did you enjoy the glacier hike?", "kind": "event", **RUN})
    reply = save(client, tenant, {"content": "Honestly it was the best day of my whole year", "kind": "fact", **RUN})
    catch_up_before_search(tenant.tenant_id)
    request = SearchRequest(question="glacier hike enjoy", kind="event", max_example_queries=0)
    with tenant_session(tenant.tenant_id) as session:
        state = new_state(session, caller=_caller(tenant), request=request)
        resolve_inputs(state)
        open_channels(state)
        memory_candidates(state)
        eligible_candidates(state)
        found = [d for d, _ in fuse(state)[MEMORIES]]
    assert question in found and reply not in found


def test_only_hits_in_an_episode_are_asked_for_a_reply(client, tenant):
    """Only a memory of an episode has a reply, and the tenant's facts say which hits are: a search none of whose
    hits is in one sends no statement for replies, and one whose hits include a question of a run still lifts its
    reply."""
    from tests.helpers.api import search
    from tests.helpers.events import sql_calls

    for n in range(3):
        save(client, tenant, {"content": f"Is the glacier hike guide {n} booked for spring?"})
    body = {"question": "glacier hike booked", "max_example_queries": 0}
    search(client, tenant, body)  # (the facts loaded)
    with sql_calls(tenant.tenant_id) as seen:
        found = search(client, tenant, body)["memories"]
    assert len(found) == 3
    assert not any("replies" in keys for keys in seen), seen

    save(client, tenant, {"content": "Did you enjoy the glacier hike?", **RUN})
    reply = save(client, tenant, {"content": "Honestly it was the best day of my whole year", **RUN})
    with sql_calls(tenant.tenant_id) as seen:
        found = search(client, tenant, {**body, "question": "glacier hike enjoy"})["memories"]
    assert any("replies" in keys for keys in seen), seen
    assert reply in [hit["id"] for hit in found]
