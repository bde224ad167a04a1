"""Channel 4: one hop along memory associations from the fused top hits.

Associations are followed in both directions (an ``updates`` edge links the newer and the older note
either way). A neighbour is ranked by the heaviest association weight that reaches it, then by the
best rank of the seed it hangs off, then by id; a seed reached from another seed counts too. With the
seeds' relevance given, a hop's value is association weight times its seed's relevance (ranked by that
value first): a hop is worth what the direct evidence it follows is worth (core.search.fusion.with_hops).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Executable, and_, any_, or_, select
from sqlalchemy.orm import Session

from core import sql
from core.memories.models import Association, Memory
from core.search.filters import EXAMPLE_QUERIES, MEMORIES, Eligibility, any_of, has_query, tenant_param

SEEDS = 10


def neighbours(
    session: Session, *, seeds: dict[str, list[str]], eligibility: Eligibility | None = None
) -> dict[str, list[tuple[str, float]]]:
    """For each key's seeds (best first): [(memory id, weight)] one hop away, best first, in one query.

    With ``eligibility``, the same query also gives the verdict of every memory at either end of the
    edges (joined under the search's filters), so the hops need no eligibility query of their own.
    """
    everything = sorted({seed for key_seeds in seeds.values() for seed in key_seeds})
    if not everything:
        return {key: [] for key in seeds}
    if eligibility is None:
        touches = or_(any_of(Association.source_id, everything), any_of(Association.target_id, everything))
        columns = (Association.source_id, Association.target_id, Association.weight)
        rows: Sequence[Any] = session.execute(select(*columns).where(touches)).all()
        return {key: _rank(rows, key_seeds) for key, key_seeds in seeds.items()}
    return from_rows(
        sql.run(session, query(seeds=seeds, eligibility=eligibility)), seeds=seeds, eligibility=eligibility
    )


def query(*, seeds: dict[str, list[str]], eligibility: Eligibility) -> sql.Query:
    """The statement of :func:`neighbours` (with ``eligibility``), for :func:`core.sql.run_many`."""
    memory_filter = eligibility.memory_filter

    def build() -> Executable:
        seed_ids = sql.text_array("seeds")
        return (
            select(Association.source_id, Association.target_id, Association.weight, Memory.id, has_query())
            .outerjoin(
                Memory,
                and_(
                    Memory.tenant_id == tenant_param(),
                    or_(Memory.id == Association.source_id, Memory.id == Association.target_id),
                    *memory_filter.clauses(),
                ),
            )
            .where(
                Association.tenant_id == tenant_param(),
                or_(Association.source_id == any_(seed_ids), Association.target_id == any_(seed_ids)),
            )
        )

    everything = sorted({seed for key_seeds in seeds.values() for seed in key_seeds})
    # By the seeds' keys (both ends of an association are indexed): one plan whatever the seeds. Compiled once
    # per shape of the filter: the tenant, caller and filter values are parameters.
    values = {"seeds": everything, **memory_filter.values()}
    return sql.Query(("graph", memory_filter.shape()), build, values, generic=True)


def from_rows(
    found: Sequence[Any],
    *,
    seeds: dict[str, list[str]],
    eligibility: Eligibility,
    seed_scores: dict[str, dict[str, float]] | None = None,
) -> dict[str, list[tuple[str, float]]]:
    """The rankings of :func:`neighbours` from the rows of :func:`query`; teaches ``eligibility`` the verdicts."""
    edges: dict[tuple[str, str, float], None] = {}
    verdicts: dict[str, str | None] = {}
    for source, target, weight, memory_id, carries_query in found:
        edges[(source, target, weight)] = None
        if memory_id is not None:
            verdicts[memory_id] = EXAMPLE_QUERIES if carries_query else MEMORIES
    for source, target, _ in edges:
        for end in (source, target):
            verdicts.setdefault(end, None)
    eligibility.learn(verdicts)
    rows = list(edges)
    scores = seed_scores or {}
    return {key: _rank(rows, key_seeds, scores.get(key)) for key, key_seeds in seeds.items()}


def _rank(rows: Sequence[Any], seeds: list[str], scores: dict[str, float] | None = None) -> list[tuple[str, float]]:
    """[(memory id, value)] best first: value = weight (times the seed's relevance when ``scores``)."""
    seed_rank = {seed: rank for rank, seed in enumerate(seeds)}
    best: dict[str, tuple[float, float, int]] = {}
    for source, target, weight in rows:
        for seed, other in ((source, target), (target, source)):
            if seed not in seed_rank or other == seed:
                continue
            value = float(weight) * (scores.get(seed, 0.0) if scores is not None else 1.0)
            key = (value, float(weight), -seed_rank[seed])
            if other not in best or key > best[other]:
                best[other] = key
    ordered = sorted(best.items(), key=lambda item: (-item[1][0], -item[1][1], -item[1][2], item[0]))
    return [(memory_id, value) for memory_id, (value, _, _) in ordered]
