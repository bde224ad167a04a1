"""Persistent per-tenant full-text index (tantivy), kept in step with PostgreSQL by a change feed.

Layout of one tenant directory::

    <path>/index/       tantivy files
    <path>/state.json   {"schema_version", "applied_seq", "generation"}, replaced atomically
    <path>/lock         fcntl.flock target that serialises writers across processes

The index is a cache: it knows the change sequence it reflects (``applied_seq``) and catches up
from the database before answering. A missing, corrupt or incompatible directory is recreated
empty with ``applied_seq`` 0, and a catch-up from 0 is a full rebuild.

Writers: tantivy allows one IndexWriter per directory, across processes (a second one fails with
LockBusy). Opening a writer costs about a millisecond, so no writer is kept open: a commit takes the
flock, opens a writer, applies, commits, waits for merges and drops it. The commit dominates (~8 ms
of CPU for one doc), so an index of at least ``DELTA_MIN_READER_DOCS`` docs holds what a catch-up
fetches in memory (core.search.delta: searched with the reader, scored with its statistics) and
commits it only once it is many docs; a smaller index commits every catch-up. What one process
holds in memory the others fetch from the database themselves.

Text analysis: one analyzer (tantivy's simple tokenizer, which splits on every non-alphanumeric
character, hence on ``_`` and ``.``; lowercase; English Porter stemmer) is registered on the index
for the text field and used in Python to turn user text into terms. Queries are built from those
terms directly instead of going through tantivy's query grammar, so user text is never syntax:
quotes, parentheses, ``AND``/``OR`` and ``field:value`` are just words, and nothing raises.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import operator
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tantivy

from core.errors import Unavailable
from core.search.delta import Bm25Stats, Delta

# 3: a memory with run context indexes its own text twice (core.search.index.memory_fulltext_text).
# 4: each doc's kind is stored, so a search can tell the kinds of an unfiltered query's hits (see search).
SCHEMA_VERSION = 4
# A query-bearing memory is indexed as ``example_query`` so each search bucket is its own kind query.
MEMORY_KINDS = frozenset({"memory", "example_query"})
ENTITY_KINDS = frozenset({"datasource", "model", "column", "measure", "aggregation"})
DOC_KINDS = MEMORY_KINDS | ENTITY_KINDS
TOKENIZER_NAME = "engram_en"
# A query equal to a doc id (a pasted canonical string) gets that doc on top.
EXACT_ID_BOOST = 5.0
MAX_EXACT_ID_CHARS = 512
WRITER_HEAP_BYTES = 50_000_000
# How long a writer waits for the index lock by default. Every wait is bounded: a holder that never lets
# go (a hung process) must cost the waiters an error, not their threads.
LOCK_WAIT_SECONDS = 30.0
_FLOCK_POLL_MIN, _FLOCK_POLL_MAX = 0.002, 0.05
# Changes after the reader stay in memory (core.search.delta) while the committed reader has at least this
# many docs (below, each catch-up commits: a small index's statistics would move too much under a delta),
# until they are more than a sixteenth of it (at least DELTA_MIN_FOLD, at most DELTA_MAX_DOCS): then they
# are committed together.
DELTA_MIN_READER_DOCS = 256
# How long a search inside its transaction waits for another thread's in-memory catch-up (a millisecond or two).
IN_MEMORY_WAIT_SECONDS = 0.02
DELTA_MIN_FOLD = 32
DELTA_MAX_DOCS = 512


@dataclass(frozen=True)
class DocChange:
    """One entry of the change feed: the current rendered text of a doc, or its deletion.

    ``doc_id`` is unique within the tenant across kinds (the canonical id: ``memory:<id>`` for a
    memory, ``<ds>[.<model>[.<leaf>]]`` for catalog entities).
    """

    doc_id: str
    doc_kind: str
    text: str | None
    deleted: bool
    seq: int


FetchChanges = Callable[[int], tuple[Iterable[DocChange], int]]


class IndexBusy(Unavailable):
    """The index lock was not free within the wait allowed (another writer is slow or stuck)."""


class SnapshotRequired(Exception):
    """Raised by a fetch_changes that cannot serve changes since a seq (e.g. tombstones pruned):
    catch_up then wipes the index and fetches from 0."""


def build_analyzer() -> tantivy.TextAnalyzer:
    """The single analyzer for indexed text and query text."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def build_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("doc_id", stored=True, tokenizer_name="raw")
    builder.add_text_field("doc_kind", stored=True, tokenizer_name="raw")
    # No phrase queries are issued, so term frequencies are enough and positions are not stored.
    builder.add_text_field("text", tokenizer_name=TOKENIZER_NAME, index_option="freq")
    return builder.build()


@dataclass(frozen=True)
class _State:
    applied_seq: int
    generation: str


# Doc ids and kinds remembered per reader (about 100 bytes each).
DOC_ID_CACHE_MAX = 200_000
# Kinds that hold at least this share of the index's docs are searched without their kind filter, their hits
# picked from a deeper unfiltered ranking: a query of terms alone lets tantivy skip the blocks of docs that
# cannot reach its top (block-max WAND), where the kind filter makes it score every doc of a term; at 100k
# memories a memory bucket's query took ~1 ms filtered, ~0.3 ms so (see search).
DOMINANT_SHARE = 0.75
# How much deeper than the kind's share says the unfiltered ranking is first asked for (deeper again if short).
DEPTH_MARGIN = 1.25


class FulltextIndex:
    """One tenant's full-text index in ``path``; safe to use from many threads and processes."""

    def __init__(
        self, path: Path, *, lock_wait: float = LOCK_WAIT_SECONDS, delta_min_docs: int = DELTA_MIN_READER_DOCS
    ) -> None:
        self.path = Path(path)
        self.lock_wait = lock_wait
        self.delta_min_docs = delta_min_docs
        # Threads of this process queue here first (a bounded wait without polling), so at most one of
        # them polls the cross-process flock.
        self._writer_gate = threading.Lock()
        # Whether the gate's holder is an in-memory catch-up (catch_up_in_memory), which never waits on anything.
        self._in_memory_catch_up = False
        self._index_dir = self.path / "index"
        self._state_file = self.path / "state.json"
        self._lock_file = self.path / "lock"
        self._schema = build_schema()
        self._analyzer = build_analyzer()
        self._mutex = threading.Lock()
        # The seq the in-process reader is known to reflect, and the generation it was opened at.
        self._reader_seq = 0
        self._generation = ""
        # (Doc id, kind) by doc address for the current reader (addresses change only when it reloads): reading a
        # stored doc for every hit cost more than the search itself. A reader of one segment keys it by the
        # doc number alone (each attribute of a hit's address is a call into tantivy).
        self._doc_ids: dict[Any, tuple[str, str]] = {}
        # The share of the reader's docs each set of kinds asked for holds (see search), read once per reader.
        self._shares: dict[frozenset[str], float] = {}
        self._one_segment = False
        # The changes after the reader, held in memory (core.search.delta); the reader's doc count and
        # BM25 statistics (read when a search first scores the delta), and a count of reader moves.
        self._delta = Delta(base_seq=0, seq=0)
        self._reader_docs = 0
        self._stats: Bm25Stats | None = None
        self._reader_moves = 0
        # The state file's identity (inode, mtime, size) and the state read from it (see _glance_state).
        self._glanced: tuple[tuple[int, int, int], _State | None] | None = None
        self._index = self._open()

    # -- state -----------------------------------------------------------------------------

    @property
    def applied_seq(self) -> int:
        """The change seq the committed index reflects (0 when missing or unreadable)."""
        state = self._read_state()
        return state.applied_seq if state else 0

    def _read_state(self) -> _State | None:
        try:
            raw = json.loads(self._state_file.read_text())
            if raw.get("schema_version") != SCHEMA_VERSION:
                return None
            return _State(applied_seq=int(raw["applied_seq"]), generation=str(raw["generation"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _glance_state(self) -> _State | None:
        """The state as last read while its file looks unchanged (same inode, modification time and size: one
        ``stat``), else read afresh. For the paths that take no lock and only look for a newer commit to adopt
        (a search after a save made three reads of the file, ~4% of the API's CPU under the load mix): a glance
        that misses a commit leaves it to the locked path, which reads the file itself."""
        try:
            seen = os.stat(self._state_file)
        except OSError:
            return None
        key = (seen.st_ino, seen.st_mtime_ns, seen.st_size)
        glanced = self._glanced
        if glanced is not None and glanced[0] == key:
            return glanced[1]
        state = self._read_state()
        self._glanced = (key, state)
        return state

    def _write_state(self, state: _State) -> None:
        """Replace the state file (under the lock, after the tantivy commit it describes).

        The state must never claim more than the index holds. A write that moves the seq forward in the
        same generation follows a commit that is durable when it returns: losing it in a machine crash
        leaves the previous state, hence a replay (upserts and deletes are idempotent), so it is not
        fsynced; each fsync cost a tenant's first search ~1 ms at the median and up to ~10 ms on a busy
        disk, twice per index built. A write that would go back to a lower seq or to another generation
        (a wipe, a recreated index) is fsynced: losing it would leave a state claiming docs the index no
        longer holds.
        """
        previous = self._read_state()
        durable = previous is not None and (
            previous.generation != state.generation or previous.applied_seq > state.applied_seq
        )
        payload = {
            "schema_version": SCHEMA_VERSION,
            "applied_seq": state.applied_seq,
            "generation": state.generation,
        }
        tmp = self._state_file.with_name(f"state.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w") as handle:
            json.dump(payload, handle)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, self._state_file)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive across threads (a mutex) and processes (flock), waiting at most ``lock_wait``.

        flock itself has no timeout, so the lock is polled without blocking; raises IndexBusy when the
        wait runs out.
        """
        with self._gated() as deadline, self._flocked(deadline):
            yield

    @contextlib.contextmanager
    def _gated(self) -> Iterator[float]:
        """Exclusive across this process's threads, waiting at most ``lock_wait``; yields the deadline."""
        deadline = time.monotonic() + self.lock_wait
        if not self._writer_gate.acquire(timeout=self.lock_wait):
            raise IndexBusy("the search index is busy; retry shortly")
        try:
            yield deadline
        finally:
            self._writer_gate.release()

    @contextlib.contextmanager
    def _flocked(self, deadline: float) -> Iterator[None]:
        """Exclusive across processes (the caller holds the gate)."""
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self._lock_file, "a+") as handle:
            _flock_until(handle.fileno(), deadline)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    # -- opening and recovery ----------------------------------------------------------------

    def _open(self) -> tantivy.Index:
        state = self._read_state()
        if state is not None:
            index = self._try_open_existing()
            if index is not None:
                # The reader was reloaded after the state was read, so it reflects at least this.
                self._generation = state.generation
                self._reader_seq = state.applied_seq
                self._delta = Delta(base_seq=state.applied_seq, seq=state.applied_seq)
                return index
        with self._locked():
            return self._open_or_recreate_locked()

    def _try_open_existing(self) -> tantivy.Index | None:
        try:
            if not tantivy.Index.exists(str(self._index_dir)):
                return None
            index = tantivy.Index.open(str(self._index_dir))
            if index.schema != self._schema:
                return None
            self._configure(index)
            return index
        except (ValueError, OSError):
            return None

    def _configure(self, index: tantivy.Index) -> None:
        # Tokenizers are not persisted with the index: every opener registers the same analyzer.
        index.register_tokenizer(TOKENIZER_NAME, self._analyzer)
        index.config_reader("manual")
        index.reload()
        self._reader_moved(index.searcher())

    def _open_or_recreate_locked(self) -> tantivy.Index:
        """Under the lock: open a sound index with its state, else recreate it empty at seq 0."""
        state = self._read_state()
        index = self._try_open_existing() if state is not None else None
        if index is None or state is None:
            shutil.rmtree(self._index_dir, ignore_errors=True)
            self._index_dir.mkdir(parents=True)
            index = tantivy.Index(self._schema, path=str(self._index_dir), reuse=False)
            self._configure(index)
            state = _State(applied_seq=0, generation=uuid.uuid4().hex)
            self._write_state(state)
        self._generation = state.generation
        self._reader_seq = 0
        self._delta = Delta(base_seq=0, seq=0)
        return index

    def _ensure_current_locked(self) -> _State:
        """Under the lock: reopen if the directory was replaced, deleted or damaged (holding the mutex too:
        searches take the reader and its doc id memo together)."""
        state = self._read_state()
        if state is None or state.generation != self._generation or not tantivy.Index.exists(str(self._index_dir)):
            with self._mutex:
                self._index = self._open_or_recreate_locked()
            state = self._read_state()
            assert state is not None
        return state

    # -- writing -----------------------------------------------------------------------------

    def apply(self, changes: Iterable[DocChange], *, upto_seq: int) -> int:
        """Apply changes (those at or below the applied seq are skipped) and record ``upto_seq``
        in one commit. Returns the new applied seq."""
        with self._locked():
            state = self._ensure_current_locked()
            applied = self._apply_locked(state, changes, upto_seq=upto_seq, wipe=False)
            self._refresh_reader(applied)
        return applied

    def _apply_locked(self, state: _State, changes: Iterable[DocChange], *, upto_seq: int, wipe: bool) -> int:
        # Only the last change of each doc matters; keeping it also makes a batch order-proof.
        latest: dict[str, DocChange] = {}
        for change in changes:
            if change.seq <= state.applied_seq and not wipe:
                continue
            if change.doc_kind not in DOC_KINDS:
                raise ValueError(f"unknown doc_kind {change.doc_kind!r} for {change.doc_id!r}")
            previous = latest.get(change.doc_id)
            if previous is None or change.seq >= previous.seq:
                latest[change.doc_id] = change
        new_seq = max(state.applied_seq, upto_seq) if not wipe else upto_seq
        if wipe and not latest and new_seq == state.applied_seq == 0:
            # Rebuilding an empty tenant into an empty index: skip the commit if it is empty already.
            self._refresh_reader(self._reader_seq)
            if self._index.searcher().num_docs == 0:
                return 0
        if not latest and not wipe:
            # Nothing to index (e.g. changes to rows this index does not cover): just move the seq.
            if new_seq != state.applied_seq:
                self._write_state(_State(applied_seq=new_seq, generation=state.generation))
            return new_seq
        writer = self._index.writer(heap_size=WRITER_HEAP_BYTES, num_threads=1)
        try:
            if wipe:
                writer.delete_all_documents()
            for change in latest.values():
                if not wipe:
                    writer.delete_documents_by_term("doc_id", change.doc_id)
                if not change.deleted:
                    writer.add_document(
                        tantivy.Document(doc_id=change.doc_id, doc_kind=change.doc_kind, text=change.text or "")
                    )
            writer.commit()
            # Let the merges this commit triggered finish; a dropped writer would abandon them and
            # segments would pile up, one per catch-up.
            writer.wait_merging_threads()
        except BaseException:
            with contextlib.suppress(Exception):
                writer.rollback()
            raise
        finally:
            del writer
        self._write_state(_State(applied_seq=new_seq, generation=state.generation))
        return new_seq

    def catch_up(self, fetch_changes: FetchChanges, *, current_seq: int | None = None) -> int:
        """Bring the index up to the database and the reader up to the index.

        ``current_seq`` is the database's change seq when the caller knows it: if the index already
        reflects it, no lock is taken and nothing is fetched. Otherwise, under the lock, call
        ``fetch_changes(seq)`` -> (changes after it, the high-water seq they bring the index to). A large
        enough index keeps them in memory (core.search.delta) and commits them once they are many;
        otherwise they are committed at once. From seq 0 the index is wiped first, so ``fetch_changes(0)``
        must return the full current snapshot. Returns the seq reflected.
        """
        if current_seq is not None:
            if current_seq <= self.seq:
                return self.seq
            self._adopt_committed()
            if current_seq <= self.seq:
                return self.seq
        # Searches keep reading the current reader and delta while this fetches, applies and commits:
        # only moving them takes the mutex.
        with self._gated() as deadline:
            if current_seq is not None:
                self._adopt_committed()
                if current_seq <= self.seq:
                    # Another thread or process caught up while this one waited: nothing to fetch.
                    return self.seq
            if self._holds_delta():
                try:
                    changes, high_water = fetch_changes(self.seq)
                except SnapshotRequired:
                    pass  # a full rebuild, committed below
                else:
                    changes = list(changes)
                    held = self._delta
                    if self._hold(changes, high_water):
                        return self.seq
                    with self._flocked(deadline):
                        state = self._ensure_current_locked()
                        if state.generation == self._generation and state.applied_seq >= held.base_seq:
                            applied = self._apply_locked(
                                state,
                                [*held.changes(), *changes],
                                upto_seq=max(held.seq, high_water),
                                wipe=False,
                            )
                            self._refresh_reader(applied)
                            return self.seq
            with self._flocked(deadline):
                state = self._ensure_current_locked()
                since = state.applied_seq
                if current_seq is not None and since >= current_seq:
                    if since > self._reader_seq:
                        self._refresh_reader(since)
                    return self.seq
                try:
                    changes, high_water = fetch_changes(since)
                except SnapshotRequired:
                    since = 0
                    changes, high_water = fetch_changes(0)
                applied = self._apply_locked(state, changes, upto_seq=high_water, wipe=since == 0)
                self._refresh_reader(applied)
        return self.seq

    def catch_up_in_memory(self, fetch_changes: FetchChanges, *, current_seq: int) -> bool:
        """Catch up to ``current_seq`` without waiting for anything: only when no other thread of this
        process is catching up and the changes stay in memory (no commit, whose lock may have to be
        waited for). True when the index reflects ``current_seq``; False leaves it to :meth:`catch_up`.

        For a caller inside a transaction: it may neither wait on a lock nor take a second connection,
        so ``fetch_changes`` reads in that transaction. The one wait it makes is short and bounded: when
        the thread ahead of it is catching up in memory too (a read in its own transaction, no lock, no
        connection to wait for), it waits up to IN_MEMORY_WAIT_SECONDS for it instead of giving up (under
        concurrent searches and saves a quarter of the searches gave up so, and started again)."""
        if current_seq <= self.seq:
            return True
        self._adopt_committed()
        if current_seq <= self.seq:
            return True
        if not self._writer_gate.acquire(blocking=False) and not (
            self._in_memory_catch_up and self._writer_gate.acquire(timeout=IN_MEMORY_WAIT_SECONDS)
        ):
            return False
        self._in_memory_catch_up = True
        try:
            self._adopt_committed()
            if current_seq <= self.seq:
                return True
            if not self._holds_delta():
                return False
            try:
                changes, high_water = fetch_changes(self.seq)
            except SnapshotRequired:
                return False
            changes = list(changes)
            return max(self._delta.seq, high_water) >= current_seq and self._hold(changes, high_water)
        finally:
            self._in_memory_catch_up = False
            self._writer_gate.release()

    def refresh(self, current_seq: int) -> int:
        """Move the reader to the newest committed catch-up when that reaches ``current_seq``; never
        takes the lock and never fetches. Returns the seq reflected (it may stay behind)."""
        if current_seq > self.seq:
            self._adopt_committed()
        return self.seq

    def reset(self) -> None:
        """Wipe every doc and set the applied seq to 0; the next catch_up rebuilds from scratch."""
        with self._locked():
            state = self._ensure_current_locked()
            self._apply_locked(state, [], upto_seq=0, wipe=True)
            self._refresh_reader(0)

    @property
    def seq(self) -> int:
        """The change seq this process reflects: its reader and the changes it holds in memory."""
        return max(self._reader_seq, self._delta.seq)

    def _adopt_committed(self) -> None:
        """Move the reader to what is committed on disk when that is newer (a commit of another process, or
        of this one's other thread); never locks."""
        state = self._glance_state()
        if state is not None and state.generation == self._generation and state.applied_seq > self._reader_seq:
            with self._mutex:
                if state.applied_seq > self._reader_seq:
                    self._refresh_reader_locked(state.applied_seq)

    @property
    def may_hold(self) -> bool:
        """Whether the reader is large enough for changes to stay in memory (:meth:`catch_up_in_memory`)."""
        return self._reader_docs >= self.delta_min_docs

    def _holds_delta(self) -> bool:
        """Whether changes may stay in memory: the reader is large enough and reflects the committed index."""
        if not self.may_hold:
            return False
        state = self._glance_state()
        return state is not None and state.generation == self._generation and state.applied_seq == self._reader_seq

    def _hold(self, changes: list[DocChange], high_water: int) -> bool:
        """Under the gate: keep ``changes`` in memory on top of the reader, when they and what is held already
        stay within the fold threshold. Changes too many to hold are not analysed at all (they are committed
        as they are); False then."""
        if self._delta.held_after(changes) > self._fold_at():
            return False
        analyze = self._analyzer.analyze
        delta = self._delta.merged(changes, upto_seq=high_water, analyze=analyze, in_reader=self._in_reader)
        with self._mutex:
            # (A commit by another process may have moved the reader meanwhile.)
            self._delta = delta.after(self._reader_seq, in_reader=self._in_reader)
        return True

    def _fold_at(self) -> int:
        """How many changed docs the delta may hold before they are committed."""
        return min(DELTA_MAX_DOCS, max(DELTA_MIN_FOLD, self._reader_docs // 16))

    def _in_reader(self, doc_id: str) -> bool:
        """Whether the current reader holds a version of ``doc_id``."""
        return self._index.searcher().doc_freq("doc_id", doc_id) > 0

    def _refresh_reader(self, seq: int) -> None:
        with self._mutex:
            self._refresh_reader_locked(seq)

    def _refresh_reader_locked(self, seq: int) -> None:
        # Reloading is cheap (reads meta.json, opens only new segments), so it is done after every
        # write path unconditionally: a wipe-and-rebuild can end at the seq the reader already had.
        self._index.reload()
        searcher = self._index.searcher()
        self._reader_moved(searcher)
        went_back = seq < self._reader_seq
        self._reader_seq = seq
        if went_back:
            self._delta = Delta(base_seq=seq, seq=seq)
        else:
            self._delta = self._delta.after(seq, in_reader=lambda doc_id: searcher.doc_freq("doc_id", doc_id) > 0)

    def _reader_moved(self, searcher: tantivy.Searcher) -> None:
        """Forget what belonged to the previous reader: its doc addresses, doc count and BM25 statistics."""
        self._doc_ids = {}
        self._shares = {}
        self._one_segment = searcher.num_segments == 1
        self._reader_docs = searcher.num_docs
        self._stats = None
        self._reader_moves += 1

    # -- reading -----------------------------------------------------------------------------

    def query_terms(self, text: str) -> list[str]:
        """The distinct analysed terms of user text, in order of first appearance."""
        return list(dict.fromkeys(self._analyzer.analyze(text)))

    def search(
        self, text: str, *, limit: int, doc_kinds: set[str] | frozenset[str] | None = None
    ) -> list[tuple[str, float]]:
        """[(doc_id, score)] best first (ties by doc id), at most ``limit``; [] for text with no terms."""
        terms = self.query_terms(text)
        if not terms or limit <= 0 or (doc_kinds is not None and not doc_kinds):
            return []
        clauses = [(tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "text", term)) for term in terms]
        literal = text.strip()
        exact_literal = len(literal) <= MAX_EXACT_ID_CHARS and not any(ch.isspace() for ch in literal)
        if exact_literal:
            exact = tantivy.Query.term_query(self._schema, "doc_id", literal)
            clauses.append((tantivy.Occur.Should, tantivy.Query.boost_query(exact, EXACT_ID_BOOST)))
        query = tantivy.Query.boolean_query(clauses)
        with self._mutex:  # the searcher, the doc ids of its reader and the changes on top of it, together
            searcher, doc_ids, delta, shares = self._index.searcher(), self._doc_ids, self._delta, self._shares
            one_segment = self._one_segment
            stats, moves = self._stats, self._reader_moves
        want = limit + delta.shadowed  # (as many more asked for as the delta may drop)
        share = 0.0
        if doc_kinds is not None and not exact_literal:  # (an exact id clause is no term query: no skipping)
            asked = frozenset(doc_kinds)
            known_share = shares.get(asked)
            if known_share is None:
                docs = sum(searcher.doc_freq("doc_kind", kind) for kind in asked)
                known_share = shares[asked] = docs / max(searcher.num_docs, 1)
            share = known_share
        dominant = doc_kinds is not None and 0 < share and DOMINANT_SHARE <= share
        if doc_kinds is not None and not dominant:
            query = self._of_kinds(query, doc_kinds)

        def entry(address: Any) -> tuple[str, str]:
            """(doc id, kind) of a hit of the reader, remembered per reader."""
            key = address.doc if one_segment else (address.segment_ord, address.doc)
            found = doc_ids.get(key)
            if found is None:
                doc = searcher.doc(address)
                found = (doc["doc_id"][0], sys.intern(doc["doc_kind"][0]))  # (a handful of kinds, shared)
                if len(doc_ids) < DOC_ID_CACHE_MAX:
                    doc_ids[key] = found
            return found

        # The reader's first ``want`` hits of the kinds asked, without the docs the delta changed. A dominant
        # kind's are those of an unfiltered ranking deep enough to hold ``want`` of them: the same docs in the
        # same order, since the kind filter adds nothing to a score (it is boosted by 0).
        if not dominant:
            picked = [
                (entry(address)[0], hit_score) for hit_score, address in searcher.search(query, want, count=False).hits
            ]
        else:
            assert doc_kinds is not None
            depth = math.ceil(want / min(share, 1.0) * DEPTH_MARGIN) + 8
            while True:
                ranked = searcher.search(query, depth, count=False).hits
                picked = []
                for hit_score, address in ranked:
                    doc_id, kind = entry(address)
                    if kind in doc_kinds:
                        picked.append((doc_id, hit_score))
                        if len(picked) == want:
                            break
                if len(picked) == want or len(ranked) < depth:
                    break
                depth *= 4
        changed = delta.docs
        hits = [(doc_id, float(score)) for doc_id, score in picked if not changed or doc_id not in changed]
        exact_match = exact_literal and literal in delta.docs
        if any(term in delta.postings for term in terms) or exact_match:
            if stats is None:
                stats = self._bm25_stats(searcher, terms, moves, delta)
            hits += delta.search(
                terms,
                doc_freq=lambda term: searcher.doc_freq("text", term),
                stats=stats,
                doc_kinds=doc_kinds,
                exact_id=(literal, EXACT_ID_BOOST, searcher.doc_freq("doc_id", literal)) if exact_match else None,
                reader=moves,
                limit=limit,
            )
        # Best first, ties by doc id: by id, then stably by score (two sorts in C instead of a key per hit).
        hits.sort(key=_doc_id_of)
        hits.sort(key=_score_of, reverse=True)
        return hits[:limit]

    def _bm25_stats(self, searcher: tantivy.Searcher, terms: list[str], moves: int, delta: Delta) -> Bm25Stats:
        """The reader's BM25 statistics of the text field, as tantivy explains them for a doc of a term the
        reader holds (kept until the reader moves). A question none of whose words the reader holds ranks
        only delta docs: their statistics then stand in (the same for every hit, so the order holds)."""
        for term in terms:
            if searcher.doc_freq("text", term) > 0:
                query = tantivy.Query.term_query(self._schema, "text", term)
                found = searcher.search(query, 1, count=False).hits
                if found:
                    stats = Bm25Stats.from_explanation(query.explain(searcher, found[0][1]).to_json())
                    if stats is not None:
                        with self._mutex:
                            if self._reader_moves == moves:
                                self._stats = stats
                        return stats
        lengths = [doc.length for doc in delta.docs.values() if not doc.change.deleted]
        average = sum(lengths) / len(lengths) if lengths else 1.0
        return Bm25Stats(docs=max(searcher.num_docs, 1), average_length=max(average, 1.0))

    def _of_kinds(self, query: tantivy.Query, doc_kinds: set[str] | frozenset[str]) -> tantivy.Query:
        """``query`` restricted to docs of ``doc_kinds``, its scores unchanged.

        Boost 0: the kind filter restricts the hits without shifting their scores. Term queries, not a term set
        query: tantivy builds a term set's automaton afresh at every search (an FST builder each time), which
        cost 2-6 times the rest of the query here; the hits and scores are the same."""
        kind_terms = [tantivy.Query.term_query(self._schema, "doc_kind", kind) for kind in sorted(doc_kinds)]
        kinds = (
            kind_terms[0]
            if len(kind_terms) == 1
            else tantivy.Query.boolean_query([(tantivy.Occur.Should, term) for term in kind_terms])
        )
        return tantivy.Query.boolean_query(
            [(tantivy.Occur.Must, query), (tantivy.Occur.Must, tantivy.Query.boost_query(kinds, 0.0))]
        )

    @property
    def num_docs(self) -> int:
        return self._index.searcher().num_docs


_doc_id_of, _score_of = operator.itemgetter(0), operator.itemgetter(1)


def _flock_until(fd: int, deadline: float) -> None:
    """Take an exclusive flock on ``fd`` before ``deadline`` (monotonic), else raise IndexBusy."""
    pause = _FLOCK_POLL_MIN
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise IndexBusy("the search index is busy; retry shortly") from None
        time.sleep(pause)
        pause = min(pause * 2, _FLOCK_POLL_MAX)
