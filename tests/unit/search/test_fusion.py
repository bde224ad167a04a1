"""RRF: score = sum of 1 / (k + rank) over the rankings a doc appears in (rank from 1); ties by
best single rank, then by id; the result does not depend on the order of the channels."""

from __future__ import annotations

import pytest

from core.search.fusion import rrf


def _ids(fused: list[tuple[str, float]]) -> list[str]:
    return [doc_id for doc_id, _ in fused]


@pytest.mark.parametrize(
    ("rankings", "expected"),
    [
        ([], []),
        ([[]], []),
        ([["a", "b", "c"]], ["a", "b", "c"]),
        # b is in both rankings: 1/62 + 1/61 beats a's 1/61 alone
        ([["a", "b"], ["b", "c"]], ["b", "a", "c"]),
        # equal scores (1/61 each): same best rank, so by id
        ([["y"], ["x"]], ["x", "y"]),
        # {1, 3} vs {2, 2}: 1/61 + 1/63 > 2/62
        ([["a", "b"], ["c", "b", "a"]], ["a", "b", "c"]),
        # a duplicate within one ranking counts once, at its best position
        ([["a", "a", "b"]], ["a", "b"]),
        ({"entity_bm25": ["m1", "m2"], "fulltext": ["m2", "m3"], "dense": ["m3", "m2"]}, ["m2", "m3", "m1"]),
    ],
)
def test_rrf_order(rankings, expected: list[str]) -> None:
    assert _ids(rrf(rankings)) == expected


def test_rrf_scores() -> None:
    fused = dict(rrf([["a", "b"], ["b"]], k=60))
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)


def test_rrf_k_changes_scores_not_single_channel_order() -> None:
    assert _ids(rrf([["a", "b", "c"]], k=1)) == ["a", "b", "c"]
    assert dict(rrf([["a"]], k=1))["a"] == pytest.approx(0.5)


def test_rrf_is_independent_of_channel_order() -> None:
    channels = [["a", "b", "c", "d"], ["d", "c"], ["b", "e", "a"]]
    assert rrf(channels) == rrf(list(reversed(channels)))
    assert rrf({"x": channels[0], "y": channels[1]}) == rrf({"y": channels[1], "x": channels[0]})


# -- relevance ---------------------------------------------------------------------------------------
from core.search.fusion import relevance, with_hops  # noqa: E402


@pytest.mark.parametrize(
    ("rule", "rankings", "blind", "expected"),
    [
        (
            "first in every channel that ran: 1",
            {"fulltext": [("a", 9.0), ("b", 3.0)], "dense": [("a", 0.8), ("b", 0.7)]},
            {},
            {"a": 1.0},
        ),
        (
            "a channel that ran and found nothing still counts: the best of nothing scores 1/2",
            {"fulltext": [], "dense": [("a", 0.5)]},
            {},
            {"a": 0.5},
        ),
        (
            "lexical votes scale by the share of the top score: rank 2 at a third of the top",
            {"fulltext": [("a", 9.0), ("b", 3.0)]},
            {},
            {"a": 1.0, "b": pytest.approx(61 / 62 / 3)},
        ),
        (
            "similarity votes scale by where the cosine sits between the channel's last hit (0) and first (1)",
            {"dense": [("a", 0.74), ("b", 0.71), ("c", 0.70), ("d", 0.66)]},
            {},
            {"a": 1.0, "b": pytest.approx(61 / 62 * 0.625), "c": pytest.approx(61 / 63 * 0.5), "d": 0.0},
        ),
        (
            "a lone similarity hit, or hits level with the first, vote by rank only",
            {"dense": [("a", 0.5), ("b", 0.5)]},
            {},
            {"a": 1.0, "b": pytest.approx(61 / 62)},
        ),
        (
            "the channels vote on the same footing: a doc dense barely ranks no longer outvotes full-text's second",
            {
                "fulltext": [("top", 10.0), ("second", 5.0)],
                "dense": [("top", 0.74), *((f"d{i}", 0.73 - i / 1000) for i in range(8))]
                + [("barely", 0.66), ("x", 0.65)],
            },
            {},
            {
                "second": pytest.approx(61 / 62 * 0.5 / 2),
                "barely": pytest.approx(61 / 70 * (0.01 / 0.09) / 2),
            },
        ),
    ],
)
def test_relevance_rules(rule, rankings, blind, expected) -> None:
    """Relevance is the mean over the channels that ran (and could see the doc) of each channel's vote:
    ``(k + 1) / (k + rank)`` times the hit's evidence share: ``score / top score`` for lexical channels,
    ``(score - last) / (top - last)`` for similarity channels; in [0, 1], 1 = first in all."""
    fused = dict(relevance(rankings, blind={name: docs.__contains__ for name, docs in blind.items()}))
    for doc_id, score in expected.items():
        assert fused[doc_id] == score, rule
    assert all(0.0 <= s <= 1.0 for s in fused.values()), rule


@pytest.mark.parametrize(
    ("rule", "rankings", "expected"),
    [
        (
            "rare-term evidence beats mid-list presence in several channels",
            {
                "fulltext": [("rare", 12.0)] + [(f"n{i}", 2.0) for i in range(5)],
                "dense": [(f"n{i}", 0.6) for i in range(5)] + [("rare", 0.5)] + [(f"t{i}", 0.4) for i in range(24)],
            },
            "rare",
        ),
        (
            "a pasted canonical id (boosted exact id match) beats its siblings that dense prefers",
            {
                "fulltext": [("shop.orders.country", 40.0), ("shop.orders", 6.0), ("shop.orders.city", 5.0)],
                "dense": [("shop.orders", 0.9), ("shop.orders.city", 0.88), ("shop.orders.country", 0.86)]
                + [(f"shop.orders.c{i}", 0.6) for i in range(27)],
            },
            "shop.orders.country",
        ),
        (
            "equal evidence: the doc in more channels wins (RRF's behaviour is kept)",
            {"fulltext": [("a", 5.0), ("b", 5.0)], "dense": [("b", 0.9), ("c", 0.8)]},
            "b",
        ),
    ],
)
def test_relevance_prefers_direct_evidence(rule, rankings, expected) -> None:
    """A doc carrying the question's rare terms, or named exactly, ranks first over docs that only sit
    mid-list in several channels. (Dense ranks a bucket 30 or more deep, so its lists here run on past the
    docs of the case: a similarity vote is measured against the channel's last hit.)"""
    assert relevance(rankings)[0][0] == expected, rule


def test_relevance_is_independent_of_channel_order() -> None:
    """Same rankings in another order: same result, to the bit."""
    a = {"fulltext": [("x", 3.0), ("y", 1.0)], "dense": [("y", 0.9), ("z", 0.5)], "entity_bm25": [("z", 2.0)]}
    b = dict(reversed(list(a.items())))
    assert relevance(a) == relevance(b)


@pytest.mark.parametrize(
    ("rule", "fused", "hops", "expected"),
    [
        (
            "a hop found by nothing else scores half its value",
            [("s", 0.8)],
            [("h", 0.8 * 0.5)],
            [("s", 0.8), ("h", 0.2)],
        ),
        (
            "a hop never outranks the seed it hangs off, even at weight 1",
            [("s", 0.6), ("m", 0.4)],
            [("h", 0.6)],
            [("s", 0.6), ("m", 0.4), ("h", 0.3)],
        ),
        (
            "a hop lifts a doc with direct evidence: r + (1 - r) * 0.5 * value",
            [("s", 0.9), ("d", 0.5)],
            [("d", 0.9)],
            [("s", 0.9), ("d", pytest.approx(0.5 + 0.5 * 0.45))],
        ),
    ],
)
def test_graph_hops_follow_direct_evidence(rule, fused, hops, expected) -> None:
    """Graph hops add (1 - r) * GRAPH_SHARE * value, value = association weight * seed relevance."""
    assert with_hops(fused, hops) == expected, rule
