"""Reciprocal Rank Fusion of per-channel rankings, and the relevance search reports (RRF normalised).

Search fuses with :func:`relevance`: the contract's RRF (k = 60) with each term scaled so that the first
rank is worth 1, averaged over the channels that ran (so 1 means first everywhere and a score means the
same in any query), and each channel's vote scaled by the evidence its hit carries (:func:`evidence_share`):
a lexical hit by its BM25 score relative to the channel's top hit (a doc sharing only common words with the
question no longer sits level with one sharing its rare words), a dense hit by where its cosine sits
between the channel's last hit and its first. Graph hops (and replies, core.search.replies) are added by
:func:`with_hops`, bounded by the seed they hang off. :func:`rrf` is the plain form, kept as the baseline the
tests and benchmarks compare against.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

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


# -- relevance: RRF normalised to [0, 1] and weighted by the evidence each channel carries -------------

Ranking = list[tuple[str, float]]
# Channels whose scores measure words shared with the input (BM25, zero for no evidence): a hit's share of
# the channel's top score scales its vote, so a doc that only shares common words with the question votes little.
LEXICAL = frozenset({"entity_bm25", "fulltext"})
# Channels whose scores are similarities (cosines) with no zero for "no evidence": every doc has one, and the
# docs a channel ranks sit in a narrow band (say 0.74 down to 0.65). A hit's vote is scaled by where its score
# stands in the band the channel ranked, from its last hit (0) to its first (1).
SIMILARITY = frozenset({"dense"})
# A graph hop is worth at most this share of the seed it hangs off (see with_hops).
GRAPH_SHARE = 0.5


def evidence_share(score: float, *, top: float, low: float, channel: str) -> float:
    """How much of a channel's strongest evidence a hit's score carries, in [0, 1] (1 for other channels)."""
    if channel in LEXICAL:
        return max(float(score), 0.0) / top if top > 0 else 1.0
    if channel in SIMILARITY:
        return (float(score) - low) / (top - low) if top > low else 1.0
    return 1.0


def channel_votes(ranking: Sequence[tuple[str, float]], *, channel: str, k: int = RRF_K) -> dict[str, float]:
    """A channel's vote for each doc it ranks, in [0, 1]: ``(k + 1) / (k + rank)`` (RRF's term scaled so the
    first doc gets 1) times the hit's :func:`evidence_share` (a doc repeated counts once, first).

    Both channels of a question thus vote on the same footing: by rank, and by how close the hit's own
    score comes to the channel's best. Scaling only the lexical votes (as before) left dense's mid-list hits
    worth nearly their full rank term while full-text's were worth half, so dense outvoted full-text's
    stronger evidence.
    """
    votes: dict[str, float] = {}
    if not ranking:
        return votes
    top, low = ranking[0][1], ranking[-1][1]
    # evidence_share written out per kind of channel (the same operations in the same order, so the same
    # floats): a search fuses a few hundred hits, and a call per hit cost more than the arithmetic.
    lexical, similarity = channel in LEXICAL, channel in SIMILARITY
    rank = 0
    for doc_id, score in ranking:
        rank += 1
        if doc_id in votes:
            continue
        if lexical:
            share = max(float(score), 0.0) / top if top > 0 else 1.0
        elif similarity:
            share = (float(score) - low) / (top - low) if top > low else 1.0
        else:
            share = 1.0
        votes[doc_id] = (k + 1) / (k + rank) * share
    return votes


def relevance(
    rankings: Mapping[str, Sequence[tuple[str, float]]],
    *,
    blind: Mapping[str, Callable[[str], bool]] | None = None,
    k: int = RRF_K,
) -> Ranking:
    """Fuse the rankings of the channels that ran (``rankings`` holds one per channel, empty when it found
    nothing) into [(doc_id, relevance)] best first, relevance in [0, 1].

    relevance(d) = sum over channels ranking d of its vote (:func:`channel_votes`) / the number of channels
    that ran and could have ranked d: 1 when every such channel put d first. ``blind[c](d)`` says channel c
    cannot see d at all (dense, for a memory whose vector is not stored yet): c then neither votes for d nor
    counts against it, so a fresh memory is not pushed down by a channel that cannot know it. Ties as in
    :func:`rrf`: best single rank, then doc id; sums run in channel-name order, so the result does not depend
    on the order the channels are given in.
    """
    names = sorted(rankings)
    totals: dict[str, float] = {}
    best: dict[str, int] = {}
    ranked_by: dict[str, dict[str, float]] = {}
    for name in names:
        votes = ranked_by[name] = channel_votes(rankings[name], channel=name, k=k)
        rank = 0
        for doc_id, vote in votes.items():
            rank += 1
            total = totals.get(doc_id)
            if total is None:
                totals[doc_id] = 0.0 + vote
                best[doc_id] = rank
            else:
                totals[doc_id] = total + vote
                if rank < best[doc_id]:
                    best[doc_id] = rank
    blinds = [(ranked_by[name], sees_not) for name, sees_not in (blind or {}).items() if name in ranked_by]
    channels = len(names)
    if blinds:
        fused: list[tuple[float, int, str]] = []
        for doc_id, total in totals.items():
            seen_by = channels
            for ranked, sees_not in blinds:
                if doc_id not in ranked and sees_not(doc_id):
                    seen_by -= 1
            fused.append((-(total / seen_by if seen_by else 0.0), best[doc_id], doc_id))
    else:
        fused = [(-(total / channels), best[doc_id], doc_id) for doc_id, total in totals.items()]
    fused.sort()
    return [(doc_id, -negated) for negated, _, doc_id in fused]


def with_hops(fused: Sequence[tuple[str, float]], hops: Sequence[tuple[str, float]]) -> Ranking:
    """``fused`` with the graph's hops: a hop valued ``v`` (association weight times its seed's relevance,
    at most the seed's) lifts a doc's relevance r to r + (1 - r) * GRAPH_SHARE * v.

    So a hop found by no other channel scores at most half its seed: the graph follows direct evidence and
    never outranks it. The result stays in [0, 1]; ties by the order in ``fused``, then hop order, then id.
    """
    lift: dict[str, float] = {}
    for doc_id, value in hops:
        lift.setdefault(doc_id, GRAPH_SHARE * min(max(float(value), 0.0), 1.0))
    order = {doc_id: n for n, (doc_id, _) in enumerate(fused)}
    if not lift and len(order) == len(fused):
        # No hop (the common case): each doc keeps its relevance (lifted by nothing) and its position.
        unlifted = [(-(score + (1.0 - score) * 0.0), n, doc_id) for n, (doc_id, score) in enumerate(fused)]
        unlifted.sort()
        return [(doc_id, -negated) for negated, _, doc_id in unlifted]
    scored = {doc_id: score for doc_id, score in fused}
    for doc_id in lift:
        scored.setdefault(doc_id, 0.0)
    extra = len(order)
    hop_order = {doc_id: extra + n for n, (doc_id, _) in enumerate(hops)}
    # Sorted as plain tuples (negated score, position, id): the order the docstring gives, compared in C.
    ordered = []
    for doc_id, score in scored.items():
        lifted = score + (1.0 - score) * lift.get(doc_id, 0.0)
        position = order.get(doc_id)
        if position is None:
            position = hop_order.get(doc_id, extra)
        ordered.append((-lifted, position, doc_id))
    ordered.sort()
    return [(doc_id, -negated) for negated, _, doc_id in ordered]


def single_ranking_scores(count: int, *, k: int = RRF_K) -> list[float]:
    """The relevance of the docs of a lone ordering (recency): (k + 1) / (k + rank)."""
    return [(k + 1) / (k + rank) for rank in range(1, count + 1)]
