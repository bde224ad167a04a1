"""The change feeds a search reads ahead with its head, read once for all its caches.

While a tenant's writes stream in, a search catches three caches up to its head: the full-text index
(core.search.index), the tenant's facts (core.search.facts) and the dense layout (core.search.dense). Each has a
feed of its own (the memories and the tombstones written after where it stands), and reading the three in the
head's round trip (core.search.service's ``_head_queries``) was six statements over the same rows, each
planned for its values: most of what PostgreSQL planned under a stream of saves. Here the memories and the
tombstones written after the oldest of the caches' points are read once, with every column any of them takes
and each row's change seq, and each cache is given its own feed's rows (:func:`split`): those after its point,
in its feed's shape, as its own statements would have returned them in the same snapshot. What else the
full-text index's catch-up reads (the change seq its feed brings it to, whether the tenant has a catalog) is in
the head itself.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import text

from core import sql
from core.changes import feed_range, feed_values
from core.refs import MEMORY_PREFIX
from core.search.facts import Fed
from core.search.filters import HAS_QUERY_SQL
from core.search.index import episode_of

# The caches, by the name service._head_queries gives their feeds.
FULLTEXT, FACTS, DENSE = "fulltext", "facts", "dense"

_MEMORY_COLUMNS = (
    "memories.id, memories.change_seq, memories.status, {content}, memories.entities, memories.tags, "
    f"memories.run_id, memories.occurred_at, memories.created_at, {HAS_QUERY_SQL}, memories.persona, "
    "memories.agent_id, memories.category, memories.kind"
)
_MEMORIES = "SELECT {columns} FROM memories WHERE memories.tenant_id = :tenant AND " + feed_range("memories.change_seq")
# With the full-text index among the caches (the only one that reads contents: of the rows after its point
# alone, should another cache stand far behind it), and without.
_WITH_CONTENT = text(
    _MEMORIES.format(
        columns=_MEMORY_COLUMNS.format(content="CASE WHEN memories.change_seq > :text_since THEN memories.content END")
    )
)
_WITHOUT_CONTENT = text(_MEMORIES.format(columns=_MEMORY_COLUMNS.format(content="NULL")))
_TOMBSTONES = text(
    "SELECT tombstones.doc_id, tombstones.change_seq FROM tombstones"
    " WHERE tombstones.tenant_id = :tenant AND " + feed_range("tombstones.change_seq")
)


def queries(tenant_id: int, points: Mapping[str, int]) -> list[sql.Query]:
    """The statements reading every feed of ``points`` (each cache's name and the change seq it stands at), for
    :func:`core.sql.run_many`; :func:`split` makes each cache's rows of their results, in the same order. Each runs
    on its generic plan (core.changes.feed_range)."""
    values = feed_values(tenant_id, min(points.values()))
    content = FULLTEXT in points
    statements = [
        sql.Query("feed-changes", lambda: _WITH_CONTENT, {**values, "text_since": points[FULLTEXT]}, generic=True)
        if content
        else sql.Query("feed-changes-no-content", lambda: _WITHOUT_CONTENT, values, generic=True),
        sql.Query("feed-gone", lambda: _TOMBSTONES, values, generic=True),
    ]
    return statements


def split(
    points: Mapping[str, int], results: Sequence[Sequence[Any]], *, change_seq: int, has_catalog: bool
) -> dict[str, Fed]:
    """Each cache's feed (``points`` as given to :func:`queries`; ``results`` its statements' rows), which also
    gives its rows after a later point: a cache another search caught up after this one read its head.

    ``change_seq`` and ``has_catalog``: the tenant's, read in the same snapshot (the search's head), which the
    full-text index's own feed reads in two statements of its own (core.search.index.feed_queries)."""
    changed, tombstones = results
    fed: dict[str, Fed] = {}
    for name, since in points.items():
        if name == FULLTEXT:
            seq_rows = [(change_seq,)]
            catalogs = [(1,)] if has_catalog else []
            project = functools.partial(_fulltext, changed, tombstones, seq_rows, catalogs)
        elif name == FACTS:
            project = functools.partial(_facts, changed, tombstones)
        elif name == DENSE:
            project = functools.partial(_dense, changed, tombstones)
        else:
            raise ValueError(f"no change feed named {name!r}")
        fed[name] = Fed(since, project(since), narrow=project)
    return fed


Rows = Sequence[Sequence[Any]]


def _fulltext(changed: Rows, tombstones: Rows, seq_rows: Rows, catalogs: Rows, point: int) -> list[Rows]:
    """index.feed_queries' rows after ``point``."""
    memories = [_fulltext_row(row) for row in changed if row[1] > point]
    return [seq_rows, memories, [row for row in tombstones if row[1] > point], catalogs]


def _facts(changed: Rows, tombstones: Rows, point: int) -> list[Rows]:
    """facts.feed_queries' rows after ``point``."""
    return [
        [
            (r[0], r[2], r[10], r[11], r[12], r[13], r[7], r[9], r[4], r[5], episode_of(r[6], r[7], r[8]) is not None)
            for r in changed
            if r[1] > point
        ],
        [(doc_id,) for doc_id, seq in tombstones if seq > point and doc_id.startswith(MEMORY_PREFIX)],
    ]


def _dense(changed: Rows, tombstones: Rows, point: int) -> list[Rows]:
    """dense.layout_feed_queries' rows after ``point``."""
    return [
        [(r[0], _layout_member(r)) for r in changed if r[1] > point]
        + [
            (doc_id[len(MEMORY_PREFIX) :], False)
            for doc_id, seq in tombstones
            if seq > point and doc_id.startswith(MEMORY_PREFIX)
        ]
    ]


def _fulltext_row(row: Sequence[Any]) -> tuple[Any, ...]:
    """index._MemoryRow's columns (index._COLUMNS, then whether the memory carries a query)."""
    return (row[0], row[3], row[4], row[5], row[2], row[1], row[6], row[7], row[8], row[9])


def _layout_member(row: Sequence[Any]) -> bool:
    """Whether the dense layout is made from this memory (as dense._LAYOUT_CHANGES says it): not forgotten, and
    carrying a query, in a run, or given its own event time."""
    return row[2] != "forgotten" and bool(row[9] or episode_of(row[6], row[7], row[8]) is not None)
