"""The non-ranking modes and the recency fallback: eligible memories in a fixed order.

* ``recent`` and the fallback (hybrid with nothing to search for): newest ``created_at`` first;
* ``important``: highest ``importance`` first, then newest;
* ``typed``: memories of the requested ``kind`` (a filter every mode honours), newest first.

Each bucket is its own query with its own cap (learning-only memories vs query-bearing ones), so a
bucket depends only on its cap. Scores, in [0, 1] as everywhere in search: ``importance`` in
``important`` mode, otherwise the relevance of a lone ranking, (60 + 1) / (60 + rank): 1 for the first.

The buckets' queries go out together through core.sql (one round trip, each planned for its values: how
many of a tenant's memories the filter keeps decides the plan), and read the columns a hit shows, so the
hits need no query of their own.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Executable, Integer, bindparam, not_, select
from sqlalchemy.orm import Session

from core import sql
from core.memories.models import Memory
from core.search.filters import EXAMPLE_QUERIES, MEMORIES, MemoryFilter, has_query, tenant_param
from core.search.fusion import single_ranking_scores
from core.search.hits import HIT_COLUMNS, memories_from_rows

_IMPORTANCE = [column.key for column in HIT_COLUMNS].index("importance")


def _query(memory_filter: MemoryFilter, mode: str, bucket: str, cap: int) -> sql.Query:
    def build() -> Executable:
        order: tuple[Any, ...]
        if mode == "important":
            order = (Memory.importance.desc(), Memory.created_at.desc(), Memory.id)
        else:
            order = (Memory.created_at.desc(), Memory.id)
        partition = has_query() if bucket == EXAMPLE_QUERIES else not_(has_query())
        return (
            select(*HIT_COLUMNS)
            .where(Memory.tenant_id == tenant_param(), *memory_filter.clauses(), partition)
            .order_by(*order)
            .limit(bindparam("cap", value=0, type_=Integer))
        )

    key = ("ordered", memory_filter.shape(), mode == "important", bucket)
    return sql.Query(key, build, {"cap": cap, **memory_filter.values()})


def ordered_buckets(
    session: Session, *, memory_filter: MemoryFilter, mode: str, caps: dict[str, int]
) -> tuple[dict[str, list[tuple[str, float]]], dict[str, Memory]]:
    """(bucket -> [(memory id, score)], the hit columns of those memories by id) for ``mode`` in ``recent``,
    ``important``, ``typed``."""
    asked = [bucket for bucket, cap in caps.items() if cap > 0]
    results = sql.run_many(session, [_query(memory_filter, mode, bucket, caps[bucket]) for bucket in asked])
    out: dict[str, list[tuple[str, float]]] = {bucket: [] for bucket in caps}
    loaded: dict[str, Memory] = {}
    for bucket, rows in zip(asked, results, strict=True):
        ranked = single_ranking_scores(len(rows))
        out[bucket] = [
            (row[0], float(row[_IMPORTANCE]) if mode == "important" else score)
            for score, row in zip(ranked, rows, strict=True)
        ]
        loaded.update(memories_from_rows(rows))
    return out, loaded


__all__ = ["EXAMPLE_QUERIES", "MEMORIES", "ordered_buckets"]
