"""What a search needs to know of a memory to judge its eligibility, held in this process per tenant.

Judging a few hundred candidate ids was one query per search (an index probe and a heap fetch per id,
a few milliseconds at 10k memories): the same few columns of the same rows, read again and again. A
tenant's facts (status, persona, agent, category, kind, event time, whether it carries a query, the
datasources its entities are rooted at, its tags, whether it is in an episode) are loaded once and then
caught up from the tenant's change feed, as the full-text index is: every write that touches a memory stamps
it with the tenant's new ``change_seq`` and a purge leaves a tombstone, so the rows with ``change_seq`` above
the last one applied, read in the search's own snapshot (which the head's ``change_seq`` came from), are all that
changed. A search with nothing new makes no query for eligibility at all.

The verdict (:meth:`MemoryFilter.verdict`) is the same predicate as the SQL one of
:meth:`MemoryFilter.clauses`; a test checks both on random memories, callers and filters.

Memory: a fact costs about 450 bytes (measured with tracemalloc at 10k: the row tuple, its id, its event
time and the dict entry). A process keeps at most ``search_facts_max_memories`` facts over all tenants
(least recently searched tenants go first); a tenant larger than that is judged in SQL.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.orm import Session

from core import sql
from core.caches import CACHE_BYTES, CACHE_ENTRIES, CACHE_EVICTIONS, CACHE_HITS, CACHE_MISSES
from core.changes import feed_range, feed_values
from core.config import get_settings
from core.entities.canonical import is_memory_ref
from core.refs import MEMORY_PREFIX
from core.search.filters import HAS_QUERY_SQL, IN_EPISODE_SQL

# Filters (what a verdict depends on: statuses, the caller's visibility, kind, ...) whose verdicts a tenant's facts
# remember, least recent out first.
MEMOS = 64
# How many of them (the most recently used) a catch-up carries over, less the memories it changed; the others
# start empty again. Carrying one copies its dict: a few filters are worth it, 64 large ones would not be.
MEMOS_KEPT = 4


# How long a search waits for another search of the same tenant to finish catching its facts up.
CATCH_UP_WAIT_SECONDS = 2.0


class Fed:
    """The rows of a change feed's statements after ``since`` (this module's :func:`feed_queries`, the full-text
    index's, the dense layout's), read ahead in a search's first round trip, in the snapshot its head came from.
    ``narrow`` gives the rows after a later point, for a cache that another search caught up meanwhile (see
    core.search.feeds)."""

    __slots__ = ("since", "rows", "_narrow")

    def __init__(
        self, since: int, rows: list[Sequence[Any]], narrow: Callable[[int], list[Sequence[Any]]] | None = None
    ) -> None:
        self.since, self.rows, self._narrow = since, rows, narrow

    def rows_after(self, point: int) -> list[Sequence[Any]] | None:
        """The feed's rows after ``point`` (a cache's change seq, at most the snapshot's), or None when the feed
        cannot give them (it starts after ``point``, or cannot narrow to it): the cache then reads its own."""
        if point == self.since:
            return self.rows
        if point > self.since and self._narrow is not None:
            return self._narrow(point)
        return None


def feed_after(
    session: Session, fed: Fed | None, since: int, own: Callable[[], list[sql.Query]]
) -> list[Sequence[Any]]:
    """A cache's change feed after ``since``: from ``fed`` (read ahead with the search's head) when it covers
    ``since``, else read now in ``session`` with the cache's ``own`` statements."""
    rows = None if fed is None else fed.rows_after(since)
    return rows if rows is not None else sql.run_many(session, own())


class Fact(NamedTuple):
    status: str
    persona: str | None
    agent_id: str | None
    category: str
    kind: str
    occurred_at: datetime | None
    carries_query: bool
    roots: frozenset[str]
    tags: frozenset[str]
    # In an episode (a run, or an explicit event time: core.search.index.episode_of), where a memory may have a reply
    # (core.search.replies).
    in_episode: bool


_FACT_SQL = (
    "SELECT memories.id, memories.status, memories.persona, memories.agent_id, memories.category, memories.kind, "
    f"memories.occurred_at, {HAS_QUERY_SQL}, memories.entities, memories.tags, {IN_EPISODE_SQL} FROM memories "
    "WHERE memories.tenant_id = :tenant AND " + feed_range("memories.change_seq")
)
_GONE_SQL = (
    "SELECT tombstones.doc_id FROM tombstones WHERE tombstones.tenant_id = :tenant "
    "AND " + feed_range("tombstones.change_seq") + " AND starts_with(tombstones.doc_id, '" + MEMORY_PREFIX + "')"
)


class TenantFacts:
    """One tenant's facts, as of change seq ``seq`` (-1: nothing loaded)."""

    def __init__(self, tenant_id: int) -> None:
        self.tenant_id = tenant_id
        self.seq = -1
        self.rows: dict[str, Fact] = {}
        self.lock = threading.Lock()
        # Repeated values (statuses, agents, root sets) are shared, not stored once per memory.
        self._shared: dict[Any, Any] = {}
        # Verdicts already reached per filter (caller and search filters); a catch-up drops those of what it changed.
        self._memos: OrderedDict[Hashable, dict[str, str | None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, memory_id: str) -> Fact | None:
        return self.rows.get(memory_id)

    def catch_up(self, session: Session, *, current_seq: int, fed: Fed | None = None) -> bool:
        """Apply the changes up to ``current_seq``, read in ``session`` (whose snapshot saw that seq), or read
        ahead in it already (``fed``, used when it covers where these facts stand).

        False when another search of the tenant held the facts longer than CATCH_UP_WAIT_SECONDS: the
        caller, which holds a connection and a transaction, judges eligibility in SQL instead of waiting on.
        """
        if self.seq >= current_seq:
            return True
        if not self.lock.acquire(timeout=CATCH_UP_WAIT_SECONDS):
            return False
        try:
            if self.seq >= current_seq:
                return True
            since = self.seq
            changed, gone = feed_after(session, fed, since, lambda: feed_queries(self.tenant_id, since))
            self._apply(changed, gone)
            if changed or gone:
                self._memos = self._memos_less(
                    [row[0] for row in changed] + [doc_id[len(MEMORY_PREFIX) :] for (doc_id,) in gone]
                )
            self.seq = current_seq
            return True
        finally:
            self.lock.release()

    def memo(self, key: Hashable) -> dict[str, str | None]:
        """The verdicts reached so far under ``key`` (a search filter's ``verdict_key``) on these facts, to read
        and add to."""
        with self.lock:
            memos = self._memos
            found = memos.get(key)
            if found is None:
                found = memos[key] = {}
                while len(memos) > MEMOS:
                    memos.popitem(last=False)
            else:
                memos.move_to_end(key)
            return found

    def _memos_less(self, memory_ids: list[str]) -> OrderedDict[Hashable, dict[str, str | None]]:
        """The memos to keep after a catch-up: the most recent MEMOS_KEPT, copied without ``memory_ids``.

        A verdict depends on nothing but its memory's facts and the filter, so the others' stay true. Copies,
        not the dicts themselves: a search that took a memo before this catch-up may still add a verdict it
        judged from a memory's old facts, into the old dict, which no later search reads.
        """
        kept: OrderedDict[Hashable, dict[str, str | None]] = OrderedDict()
        memos = self._memos
        for key in list(memos)[-MEMOS_KEPT:]:
            memo = memos[key].copy()
            for memory_id in memory_ids:
                memo.pop(memory_id, None)
            kept[key] = memo
        return kept

    def _apply(self, changed: Sequence[Any], gone: Sequence[Any]) -> None:
        rows, share = self.rows, self._share
        for (doc_id,) in gone:
            rows.pop(doc_id[len(MEMORY_PREFIX) :], None)
        for row in changed:
            memory_id, status, persona, agent_id, category, kind, occurred_at, carries_query, entities, tags = row[:10]
            episodic = row[10]
            if status == "forgotten":
                rows.pop(memory_id, None)
                continue
            roots = frozenset(e.split(".", 1)[0] for e in entities or () if not is_memory_ref(e))
            rows[sys.intern(memory_id)] = Fact(
                share(status),
                share(persona),
                share(agent_id),
                share(category),
                share(kind),
                occurred_at,
                bool(carries_query),
                share(roots),
                share(frozenset(tags or ())),
                bool(episodic),  # (in an episode)
            )

    def _share(self, value: Any) -> Any:
        return self._shared.setdefault(value, value)


_CACHE = "search_facts"
_HITS, _MISSES = CACHE_HITS.labels(_CACHE), CACHE_MISSES.labels(_CACHE)
# Measured with tracemalloc: one memory's facts take ~450 bytes (core.config's search_facts_max_memories).
FACT_BYTES = 450
_tenants: OrderedDict[int, TenantFacts] = OrderedDict()
# Each held tenant's memory count when it was last searched, and their sum: the budget is checked in
# constant time per search, however many tenants the process holds.
_sizes: dict[int, int] = {}
_held = 0
_registry_lock = threading.Lock()


def feed_queries(tenant_id: int, since: int) -> list[sql.Query]:
    """The memories changed after ``since`` and those purged, for :func:`core.sql.run_many`."""
    values = feed_values(tenant_id, since)
    return [
        sql.Query("facts", lambda: text(_FACT_SQL), values, generic=True),
        sql.Query("facts-gone", lambda: text(_GONE_SQL), values, generic=True),
    ]


def held_seq(tenant_id: int) -> int | None:
    """The change seq of the tenant's facts this process holds (None: none loaded)."""
    facts = _tenants.get(tenant_id)
    return None if facts is None or facts.seq < 0 else facts.seq


def tenant_facts(
    session: Session, *, tenant_id: int, current_seq: int, memories: int, fed: Fed | None = None
) -> TenantFacts | None:
    """The tenant's facts caught up to ``current_seq`` (from ``fed`` when that starts where they stand), or None
    when the tenant (``memories`` active or stale memories) is too large to keep: its eligibility is then asked
    of the database."""
    global _held
    budget = get_settings().search_facts_max_memories
    if memories > budget:
        forget_tenant(tenant_id)
        return None
    evictions = 0
    with _registry_lock:
        facts = _tenants.get(tenant_id)
        (_HITS if facts is not None else _MISSES).inc()
        if facts is None:
            facts = _tenants[tenant_id] = TenantFacts(tenant_id)
        _tenants.move_to_end(tenant_id)
        moved = memories - _sizes.get(tenant_id, -1)
        _held += memories - _sizes.get(tenant_id, 0)
        _sizes[tenant_id] = memories
        # Make room: the least recently searched tenants go first (never the one asked for).
        while _held > budget and len(_tenants) > 1:
            evicted, _ = _tenants.popitem(last=False)
            _held -= _sizes.pop(evicted, 0)
            evictions += 1
        if moved or evictions:
            _publish()  # (the gauges only move with a tenant's size or the tenants held)
    if evictions:
        CACHE_EVICTIONS.labels(_CACHE).inc(evictions)
    return facts if facts.catch_up(session, current_seq=current_seq, fed=fed) else None


def forget_tenant(tenant_id: int) -> None:
    global _held
    with _registry_lock:
        _tenants.pop(tenant_id, None)
        _held -= _sizes.pop(tenant_id, 0)
        _publish()


def _publish() -> None:
    """The cache's size on /metrics (core.caches' families), bytes estimated per fact as measured."""
    CACHE_ENTRIES.labels(_CACHE).set(len(_tenants))
    CACHE_BYTES.labels(_CACHE).set(_held * FACT_BYTES)


def clear() -> None:
    """Drop every tenant's facts (tests that rebuild a database under the same tenant ids)."""
    global _held
    with _registry_lock:
        _tenants.clear()
        _sizes.clear()
        _held = 0
