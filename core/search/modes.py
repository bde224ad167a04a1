"""The non-ranking modes and the recency fallback: eligible memories in a fixed order.

* ``recent`` and the fallback (hybrid with nothing to search for): newest ``created_at`` first;
* ``important``: highest ``importance`` first, then newest;
* ``typed``: memories of the requested ``kind`` (a filter every mode honours), newest first.

Each bucket is its own query with its own cap (learning-only memories vs query-bearing ones), so a
bucket depends only on its cap. Scores, in [0, 1] as everywhere in search: ``importance`` in
``important`` mode, otherwise the relevance of a lone ranking, (60 + 1) / (60 + rank): 1 for the first.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import not_, select
from sqlalchemy.orm import Session

from core.memories.models import Memory
from core.search.filters import EXAMPLE_QUERIES, MEMORIES, MemoryFilter, has_query
from core.search.fusion import single_ranking_scores


def ordered_buckets(
    session: Session, *, memory_filter: MemoryFilter, mode: str, caps: dict[str, int]
) -> dict[str, list[tuple[str, float]]]:
    """bucket -> [(memory id, score)] for ``mode`` in ``recent``, ``important``, ``typed``."""
    order: tuple[Any, ...]
    if mode == "important":
        order = (Memory.importance.desc(), Memory.created_at.desc(), Memory.id)
    else:
        order = (Memory.created_at.desc(), Memory.id)
    out: dict[str, list[tuple[str, float]]] = {}
    for bucket, cap in caps.items():
        if cap <= 0:
            out[bucket] = []
            continue
        partition = has_query() if bucket == EXAMPLE_QUERIES else not_(has_query())
        rows = session.execute(
            select(Memory.id, Memory.importance).where(*memory_filter.clauses(), partition).order_by(*order).limit(cap)
        ).all()
        ranked = single_ranking_scores(len(rows))
        out[bucket] = [
            (memory_id, float(importance) if mode == "important" else score)
            for score, (memory_id, importance) in zip(ranked, rows, strict=True)
        ]
    return out


__all__ = ["EXAMPLE_QUERIES", "MEMORIES", "ordered_buckets"]
