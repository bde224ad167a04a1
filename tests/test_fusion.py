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
