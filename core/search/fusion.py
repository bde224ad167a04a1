"""Reciprocal Rank Fusion of per-channel rankings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

RRF_K = 60


def rrf(rankings: Mapping[str, Sequence[str]] | Sequence[Sequence[str]], *, k: int = RRF_K) -> list[tuple[str, float]]:
    """Fuse rankings (best first) into [(doc_id, score)], score = sum of 1 / (k + rank), rank from 1.

    A doc repeated within one ranking counts at its first (best) position only. Ties on score are
    broken by the best single rank the doc reached in any ranking, then by doc id, so the result
    depends only on the rankings' contents, never on the order the channels are given in.
    """
    channels = rankings.values() if isinstance(rankings, Mapping) else rankings
    ranks: dict[str, list[int]] = {}
    known = ranks.get
    for ranking in channels:
        seen: set[str] = set()
        position = 0
        for doc_id in ranking:
            position += 1
            if doc_id in seen:
                continue
            seen.add(doc_id)
            doc_ranks = known(doc_id)
            if doc_ranks is None:
                ranks[doc_id] = [position]
            else:
                doc_ranks.append(position)
    # Sorted as plain tuples (negated score, best rank, doc id): the order the docstring gives.
    fused: list[tuple[float, int, str]] = []
    for doc_id, doc_ranks in ranks.items():
        if len(doc_ranks) == 1:
            fused.append((-1.0 / (k + doc_ranks[0]), doc_ranks[0], doc_id))
        else:
            # Summing in sorted rank order makes the float sum independent of channel order.
            doc_ranks.sort()
            fused.append((-sum(1.0 / (k + r) for r in doc_ranks), doc_ranks[0], doc_id))
    fused.sort()
    return [(doc_id, -negated) for negated, _, doc_id in fused]
