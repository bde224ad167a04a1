"""Channel 4: one hop along memory associations from the fused top hits.

Associations are followed in both directions (an ``updates`` edge links the newer and the older note
either way). A neighbour is ranked by the heaviest association weight that reaches it, then by the
best rank of the seed it hangs off, then by id; a seed reached from another seed counts too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from core.memories.models import Association
from core.search.filters import any_of

SEEDS = 10


def neighbours(session: Session, *, seeds: dict[str, list[str]]) -> dict[str, list[tuple[str, float]]]:
    """For each key's seeds (best first): [(memory id, weight)] one hop away, best first, in one query."""
    everything = sorted({seed for key_seeds in seeds.values() for seed in key_seeds})
    if not everything:
        return {key: [] for key in seeds}
    rows = session.execute(
        select(Association.source_id, Association.target_id, Association.weight).where(
            or_(any_of(Association.source_id, everything), any_of(Association.target_id, everything))
        )
    ).all()
    return {key: _rank(rows, key_seeds) for key, key_seeds in seeds.items()}


def _rank(rows: Sequence[Any], seeds: list[str]) -> list[tuple[str, float]]:
    seed_rank = {seed: rank for rank, seed in enumerate(seeds)}
    best: dict[str, tuple[float, int]] = {}
    for source, target, weight in rows:
        for seed, other in ((source, target), (target, source)):
            if seed not in seed_rank or other == seed:
                continue
            key = (float(weight), -seed_rank[seed])
            if other not in best or key > best[other]:
                best[other] = key
    ordered = sorted(best.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
    return [(memory_id, weight) for memory_id, (weight, _) in ordered]
