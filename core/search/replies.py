"""Replies: the memory that answers a question among a bucket's fused top hits.

In a conversation saved turn by turn, a question is answered by the turn after it: "What gave you the
idea for all the colours?" ranks first for a question about the colours, and the answer ("I wanted to
catch the eye and make people smile") shares none of its words. So a hit that asks something (its text
holds a question mark) lends its relevance to the next memory of its episode, the one that replies, as
an association of weight 1 would: through :func:`core.search.fusion.with_hops`, which lifts the reply by
at most half the question's relevance: a reply that nothing else found scores at most half its question,
and a memory that is not a reply is not moved.

Episodes are those whose memories lend each other context (core.search.index.episode_of): a run, else
the memories given one same explicit event time. The next memory is the next by event time, then save
order, then id, among the episode's memories that are not forgotten: the order the context windows use.
Replies are judged by the search's filters like any hop (the caller's eligibility step). A search asks only of
its seeds that the tenant's facts place in an episode (core.search.service), and nothing of a tenant without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Executable, text

from core import sql
from core.search import hits

# What marks a memory that asks something: a question mark (ASCII, full-width, Arabic).
QUESTION_MARKS = "?？؟"
_ASKS = f"s.content ~ '[{QUESTION_MARKS}]'"
_REPLY = ", ".join(f"m.{column}" for column in hits.HitMemory._fields)

# One row per seed that asks something and has a next memory in its episode: (seed id, the reply's hit columns),
# so a reply lifted into the hits needs no query of its own to be shown. Each seed is read by its primary key
# (the LIMIT keeps the planner from joining the seeds to a scan of the tenant when the table has no statistics
# yet), then probes the index that leads with its kind of episode and follows its order (migration 0015): two
# index descents per seed, whatever the size of its run or of the tenant. One statement, on its generic plan
# (core.sql).
REPLIES_SQL = f"""
SELECT s.id, n.* FROM unnest(CAST(:seeds AS text[])) AS seed(id) CROSS JOIN LATERAL (
    SELECT s.tenant_id, s.id, s.run_id, s.occurred_at, s.created_at FROM memories AS s
    WHERE s.tenant_id = :tenant AND s.id = seed.id AND {_ASKS}
      AND (s.run_id IS NOT NULL OR s.occurred_at <> s.created_at)
    LIMIT 1
) AS s CROSS JOIN LATERAL (
    (SELECT {_REPLY} FROM memories AS m
     WHERE s.run_id IS NOT NULL AND m.tenant_id = s.tenant_id AND m.run_id = s.run_id
       AND m.status <> 'forgotten' AND (m.occurred_at, m.created_at, m.id) > (s.occurred_at, s.created_at, s.id)
     ORDER BY m.occurred_at, m.created_at, m.id LIMIT 1)
    UNION ALL
    (SELECT {_REPLY} FROM memories AS m
     WHERE s.run_id IS NULL AND m.tenant_id = s.tenant_id AND m.run_id IS NULL AND m.occurred_at = s.occurred_at
       AND m.occurred_at <> m.created_at AND m.status <> 'forgotten' AND (m.created_at, m.id) > (s.created_at, s.id)
     ORDER BY m.created_at, m.id LIMIT 1)
) AS n
"""


def query(*, tenant_id: int, seeds: dict[str, list[str]]) -> sql.Query:
    """The statement giving the replies of every bucket's seeds, for :func:`core.sql.run_many`."""

    def build() -> Executable:
        return text(REPLIES_SQL).bindparams(sql.text_array("seeds"))

    everything = sorted({seed for bucket_seeds in seeds.values() for seed in bucket_seeds})
    return sql.Query("replies", build, {"tenant": tenant_id, "seeds": everything}, generic=True)


def from_rows(
    rows: Sequence[Any], *, seeds: dict[str, list[str]], seed_scores: dict[str, dict[str, float]]
) -> dict[str, list[tuple[str, float]]]:
    """Per bucket: [(reply id, its question's relevance)] best first (ties by the question's rank, then id).
    A reply that is itself among the seeds (a question answered by a question) is lifted like any other."""
    reply_of = {row[0]: row[1] for row in rows}
    out: dict[str, list[tuple[str, float]]] = {}
    for bucket, bucket_seeds in seeds.items():
        scores = seed_scores.get(bucket, {})
        best: dict[str, tuple[float, int]] = {}
        for rank, seed in enumerate(bucket_seeds):
            reply = reply_of.get(seed)
            if reply is None or reply == seed:
                continue
            key = (scores.get(seed, 0.0), -rank)
            if reply not in best or key > best[reply]:
                best[reply] = key
        ordered = sorted(best.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
        out[bucket] = [(reply, value) for reply, (value, _) in ordered]
    return out


def loaded(rows: Sequence[Any]) -> dict[str, Any]:
    """The replies of the rows of :func:`query`, readable as memories for hits (core.search.hits)."""
    return hits.memories_from_rows([row[1:] for row in rows])


def merged(*rankings: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """Hop rankings merged: each doc at its best value, best first (ties by id)."""
    best: dict[str, float] = {}
    for ranking in rankings:
        for doc_id, value in ranking:
            if value > best.get(doc_id, -1.0):
                best[doc_id] = value
    return sorted(best.items(), key=lambda item: (-item[1], item[0]))
