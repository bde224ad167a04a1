"""Each tenant's full-text index and the change feed it catches up from.

The index of tenant T lives in ``<index_dir>/tenant-<T>`` (one directory per tenant, so tantivy's
statistics never mix tenants). Before a search answers, :func:`catch_up` compares the index's applied
change seq with the tenant's ``change_seq`` and, when behind, applies what changed in between:

* memories with ``change_seq > applied`` (active and stale ones are indexed, forgotten ones removed),
* tombstones with ``change_seq > applied`` (purged memories, deleted catalog docs),
* catalog docs from the catalog's change feed (hidden ones removed).

The feed is read in one REPEATABLE READ snapshot together with the tenant's ``change_seq``: every
write bumps that seq under the tenant row lock, so all changes up to it are visible in that snapshot
and none is skipped. Any process can do this (the index serialises writers with a file lock), so a
memory saved through one API process is found by the next search in any other.

Connections and locks: a search first tries :func:`catch_up_in`, inside its own transaction, which catches
up only when that needs no waiting (the process has the index open, its gate is free and the changes stay
in memory) and reads the changes in that transaction. Otherwise the search gives its transaction back
and catches up with :func:`catch_up_before_search`, so waiting for the index lock never holds a connection
or a transaction, and the catch-up's connection is the only one the request holds at that moment. Later
in the search's transaction :func:`catch_up` only moves the reader to what is committed already: it
neither waits nor connects.
The search still reflects every write committed before it started (read-your-writes); writes that
commit while it runs may be missed by full-text, as they would be by a search started a moment earlier.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Executable, and_, bindparam, literal_column, or_, select, text
from sqlalchemy.orm import Session

from core import sql
from core.caches import BoundedCache
from core.changes import feed_condition, feed_values
from core.config import get_settings
from core.db import driver_connection, read_one_snapshot, tenant_session
from core.entities.canonical import is_memory_ref
from core.entities.models import Datasource
from core.entities.render import render_memory_content
from core.memories.models import Memory, Tombstone
from core.refs import MEMORY_PREFIX
from core.search.catalog import catalog_changes
from core.search.facts import Fed, feed_after
from core.search.filters import any_of, has_query
from core.search.fulltext import DocChange, FulltextIndex

# How many memories before and after a memory of the same run lend it their text.
CONTEXT_TURNS = 2
# How many times a memory's own words count against each word it borrows from its context (BM25F's field
# weights: own 2, context 1, as the dense side weighs a memory's own cosine against its context's).
OWN_TEXT_WEIGHT = 2
# An evicted handle is dropped; a search still holding it finishes on it, and the next one reopens the
# directory (the index on disk is kept, so reopening costs a reader, not a rebuild).
_indexes: BoundedCache[FulltextIndex] = BoundedCache(
    "fulltext_indexes", max_entries=lambda: get_settings().fulltext_max_open_indexes
)


def memory_fulltext_text(*, content: str, entities: list[str], tags: list[str], context: Sequence[str] = ()) -> str:
    """What a memory contributes to full-text: its rendered text, its catalog entity tags, its tags,
    and the text of its neighbours in the same run.

    Entity tags are written out (``mydb.orders.amount`` is analysed into ``mydb``, ``order``,
    ``amount``) so a question naming a column finds the notes tagged with it; ``memory:<id>`` refs
    are left out, they carry no words. A turn of a conversation ("Yes, last Friday!") is often only
    findable through the turn it answers, so memories sharing a ``run_id`` carry the text of the
    memory before and after them (by event time, then save order).

    A memory's own words weigh more than those it borrows: with context, its own text is written
    ``OWN_TEXT_WEIGHT`` times. That is BM25F with field weights own = 2, context = 1 (BM25F adds up the
    fields' term frequencies, each times its field's weight, before saturating them). With equal weights a
    question's word ranked the turn that says it level with the turns around it, which only borrow it.
    """
    extra = [e for e in entities if not is_memory_ref(e)] + list(tags)
    own = "\n".join([content, " ".join(extra)]) if extra else content
    if not context:
        return own
    return "\n".join([*([own] * OWN_TEXT_WEIGHT), *context])


def memory_doc_kind(carries_query: bool) -> str:
    """The full-text kind of a memory: its search bucket."""
    return "example_query" if carries_query else "memory"


def tenant_index(tenant_id: int) -> FulltextIndex:
    """The process-wide handle on a tenant's index (opened once per process and directory, and kept while
    it is among the ``fulltext_max_open_indexes`` most recently used). Opening one may wait (bounded) for
    the index lock, when its directory holds no sound index yet."""
    path = index_path(tenant_id)
    return _indexes.get_or_create(
        str(path), lambda: FulltextIndex(path, lock_wait=get_settings().index_lock_wait_seconds)
    )


def _open_index(tenant_id: int) -> FulltextIndex | None:
    """The tenant's index if this process has it open already (never opens one, so never waits)."""
    return _indexes.get(str(index_path(tenant_id)))


def is_open(tenant_id: int) -> bool:
    """Whether this process has the tenant's index open (a search may then catch it up without waiting)."""
    return _open_index(tenant_id) is not None


def index_path(tenant_id: int) -> Path:
    return _path_in(get_settings().home, tenant_id)


@functools.lru_cache(maxsize=4096)
def _path_in(home: Path, tenant_id: int) -> Path:
    """A tenant's index directory (every search asks for it a few times: Path arithmetic is kept). Keyed by the
    home, whose Path object the settings keep (its hash computed once), where ``index_dir`` is a new Path at
    every call, hashed afresh."""
    return get_settings().index_dir / f"tenant-{tenant_id}"


def forget_index_handle(tenant_id: int) -> None:
    """Drop this process's handle on the tenant's index (a search holding it finishes on it)."""
    _indexes.pop(str(index_path(tenant_id)))


def forget_open_indexes() -> None:
    """Drop the process's index handles (tests that delete index directories)."""
    _indexes.clear()


def fetch_changes(tenant_id: int, since: int) -> tuple[list[DocChange], int]:
    """Every doc change of the tenant after ``since``, and the seq they bring the index to, read in a
    snapshot of their own."""
    with tenant_session(tenant_id) as session:
        read_one_snapshot(session)
        return _changes_in(session, tenant_id=tenant_id, since=since)


def feed_queries(tenant_id: int, since: int) -> list[sql.Query]:
    """The change seq, the changed memories, the tombstones and whether the tenant has a catalog, after
    ``since``: the statements of a catch-up's first read, for :func:`core.sql.run_many` (driver SQL)."""
    values = feed_values(tenant_id, since)
    return [
        sql.Query("feed-seq", lambda: _SEQ_SQL, values, generic=True),
        sql.Query("feed-memories", _changed_memories, values, generic=True),
        sql.Query("feed-tombstones", _changed_tombstones, values, generic=True),
        sql.Query("feed-has-catalog", _has_catalog, values, generic=True),
    ]


def _changes_in(session: Session, *, tenant_id: int, since: int, fed: Fed | None = None) -> tuple[list[DocChange], int]:
    """The changes after ``since`` as the session's snapshot sees them, and its change seq.

    :func:`feed_queries` go to the database together (one round trip), unless ``fed`` holds their rows read
    after ``since`` (or before it, when it can narrow them) in the session's snapshot; a tenant with a catalog
    then reads the catalog's changes too."""
    rows = feed_after(session, fed, since, lambda: feed_queries(tenant_id, since))
    seq_rows, memory_rows, tombstones, catalogs = rows
    high_water = int(seq_rows[0][0] or 0) if seq_rows else 0
    changes = _memory_changes(session, changed=[_MemoryRow(*row) for row in memory_rows])
    changes.extend(
        DocChange(doc_id=doc_id, doc_kind=_kind_of_doc(doc_id), text=None, deleted=True, seq=seq)
        for doc_id, seq in tombstones
    )
    if catalogs:
        # Catalog docs exist only under a datasource: a tenant without one has none to render (its
        # deleted catalog docs are among the tombstones above).
        changes.extend(catalog_changes(session, since=since))
    return changes, high_water


_SEQ_SQL = text("SELECT change_seq FROM tenants WHERE id = :tenant")


def _changed_memories() -> Executable:
    return select(*_COLUMNS, has_query()).where(
        Memory.tenant_id == bindparam("tenant"), feed_condition(Memory.change_seq)
    )


def _changed_tombstones() -> Executable:
    return select(Tombstone.doc_id, Tombstone.change_seq).where(
        Tombstone.tenant_id == bindparam("tenant"), feed_condition(Tombstone.change_seq)
    )


def _has_catalog() -> Executable:
    tenant = Datasource.tenant_id == bindparam("tenant")
    return select(literal_column("1")).select_from(Datasource).where(tenant).limit(1)


def _kind_of_doc(doc_id: str) -> str:
    # A deletion needs only the doc id; the kind just has to be one the index knows.
    return "memory" if is_memory_ref(doc_id) else "datasource"


_COLUMNS = (
    Memory.id,
    Memory.content,
    Memory.entities,
    Memory.tags,
    Memory.status,
    Memory.change_seq,
    Memory.run_id,
    Memory.occurred_at,
    Memory.created_at,
)


def episode_of(run_id: str | None, occurred_at: datetime | None, created_at: datetime | None) -> str | None:
    """The group whose neighbouring memories lend a memory their text: its run; else, for a memory given an
    explicit event time (``occurred_at`` differs from the save time it defaults to), the memories recorded
    at that same instant (the turns of one session imported with its date, an event noted in parts);
    None for a memory in no group."""
    if run_id is not None:
        return "run:" + run_id
    if occurred_at is not None and created_at is not None and occurred_at != created_at:
        return "at:" + occurred_at.isoformat()
    return None


class _MemoryRow(NamedTuple):
    """A row of ``_COLUMNS`` and whether the memory carries a query (as the driver returns it)."""

    id: str
    content: Any
    entities: list[str]
    tags: list[str]
    status: str
    change_seq: int
    run_id: str | None
    occurred_at: datetime | None
    created_at: datetime | None
    carries_query: bool


def _memory_changes(session: Session, *, changed: Sequence[Any]) -> list[DocChange]:
    """The ``changed`` memories, plus the other memories of their episodes (their context changed)."""
    rows = {r.id: r for r in changed}
    episode_seq: dict[str, int] = {}
    runs: set[str] = set()
    instants: set[datetime] = set()
    for row in rows.values():
        episode = episode_of(row.run_id, row.occurred_at, row.created_at)
        if episode is not None:
            episode_seq[episode] = max(episode_seq.get(episode, 0), row.change_seq)
            if row.run_id is not None:
                runs.add(row.run_id)
            else:
                instants.add(row.occurred_at)
    context: dict[str, list[str]] = {}
    seq_of = {memory_id: row.change_seq for memory_id, row in rows.items()}
    if episode_seq:
        grouped: list[ColumnElement[bool]] = []
        if runs:
            grouped.append(any_of(Memory.run_id, sorted(runs)))
        if instants:
            grouped.append(
                and_(
                    Memory.run_id.is_(None),
                    Memory.occurred_at.in_(sorted(instants)),
                    Memory.occurred_at != Memory.created_at,
                )
            )
        members = session.execute(
            select(*_COLUMNS, has_query())
            .where(or_(*grouped), Memory.status != "forgotten")
            .order_by(Memory.run_id, Memory.occurred_at, Memory.created_at, Memory.id)
        ).all()
        by_episode: dict[str, list[Any]] = {}
        for row in members:
            episode = episode_of(row.run_id, row.occurred_at, row.created_at)
            if episode is None or episode not in episode_seq:
                continue
            by_episode.setdefault(episode, []).append(row)
            rows.setdefault(row.id, row)
            # A neighbour's doc changes with the episode: stamp it with the episode's newest change.
            seq_of[row.id] = max(row.change_seq, episode_seq[episode])
        for run in by_episode.values():
            for n, row in enumerate(run):
                window = [*range(n - CONTEXT_TURNS, n), *range(n + 1, n + 1 + CONTEXT_TURNS)]
                context[row.id] = [render_memory_content(run[k].content) for k in window if 0 <= k < len(run)]
    changes = []
    for memory_id, row in rows.items():
        deleted = row.status == "forgotten"
        text = None
        if not deleted:
            text = memory_fulltext_text(
                content=render_memory_content(row.content),
                entities=row.entities,
                tags=row.tags,
                context=context.get(memory_id, []),
            )
        kind = memory_doc_kind(row[-1])
        changes.append(
            DocChange(
                doc_id=MEMORY_PREFIX + memory_id, doc_kind=kind, text=text, deleted=deleted, seq=seq_of[memory_id]
            )
        )
    return changes


def _change_seq(session: Session, tenant_id: int) -> int:
    """The tenant's change seq in the session's transaction, read through the driver directly: every search
    asks it first, and the ORM's compile and result machinery cost twice the statement itself."""
    driver: Any = driver_connection(session)
    row = driver.execute("SELECT change_seq FROM tenants WHERE id = %s", (tenant_id,)).fetchone()
    return int(row[0] or 0) if row is not None else 0


def current_change_seq(tenant_id: int) -> int:
    """The tenant's committed change seq, read on a connection held only for that statement."""
    with tenant_session(tenant_id) as session:
        return _change_seq(session, tenant_id)


def catch_up_before_search(tenant_id: int) -> FulltextIndex:
    """The tenant's index, brought up to every write committed so far. Call it holding no connection:
    it waits (bounded) for the index lock holding none, and the catch-up under the lock takes one."""
    index = tenant_index(tenant_id)
    current = current_change_seq(tenant_id)
    index.catch_up(lambda since: fetch_changes(tenant_id, since), current_seq=current)
    return index


def held_seq(tenant_id: int) -> int | None:
    """The change seq this process's open index of the tenant reflects, where :func:`catch_up_in` would read
    the feed from; None when it would not read it (the index is not open here, or too small to hold changes
    in memory)."""
    index = _open_index(tenant_id)
    return index.seq if index is not None and index.may_hold else None


def catch_up_in(session: Session, tenant_id: int, *, current_seq: int | None = None, fed: Fed | None = None) -> bool:
    """Bring the tenant's index up to the session's snapshot from inside its transaction, when that needs
    no waiting (core.search.fulltext.FulltextIndex.catch_up_in_memory): the changes are read in the
    session itself. False when it would have to wait: the caller then ends its transaction and calls
    :func:`catch_up_before_search`, as it does when the process has not opened the tenant's index yet
    (opening may wait for the index lock). ``current_seq``: the tenant's change seq in the session's
    snapshot when the caller read it already (else it is read here); ``fed``: the feed read with it, used when
    it starts where the index stands."""
    index = _open_index(tenant_id)
    if index is None:
        return False
    current = _change_seq(session, tenant_id) if current_seq is None else current_seq
    return index.catch_up_in_memory(
        lambda since: _changes_in(session, tenant_id=tenant_id, since=since, fed=fed), current_seq=current
    )


def catch_up(*, tenant_id: int, current_seq: int) -> FulltextIndex:
    """The tenant's index, its reader moved up to ``current_seq`` as far as committed catch-ups reach.

    Runs inside a search's transaction, so it neither waits for the index lock nor opens a connection
    (see the module docstring); :func:`catch_up_before_search` did the catching up.
    """
    index = tenant_index(tenant_id)
    index.refresh(current_seq)
    return index
