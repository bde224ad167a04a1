"""Persistent per-tenant full-text index (tantivy), kept in step with PostgreSQL by a change feed.

Layout of one tenant directory::

    <path>/index/       tantivy files
    <path>/state.json   {"schema_version", "applied_seq", "generation"}, replaced atomically
    <path>/lock         fcntl.flock target that serialises writers across processes

The index is a cache: it knows the change sequence it reflects (``applied_seq``) and catches up
from the database before answering. A missing, corrupt or incompatible directory is recreated
empty with ``applied_seq`` 0, and a catch-up from 0 is a full rebuild.

Writers: tantivy allows one IndexWriter per directory, across processes (a second one fails with
LockBusy). Opening a writer costs about a millisecond, so no writer is kept open: ``catch_up``
takes the flock, opens a writer, applies, commits, waits for merges and drops it. Commit dominates
the cost of an incremental apply (fsyncs), not the writer.

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
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import tantivy

from core.errors import Unavailable

# 3: a memory with run context indexes its own text twice (core.search.index.memory_fulltext_text).
SCHEMA_VERSION = 3
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
    builder.add_text_field("doc_kind", tokenizer_name="raw")
    # No phrase queries are issued, so term frequencies are enough and positions are not stored.
    builder.add_text_field("text", tokenizer_name=TOKENIZER_NAME, index_option="freq")
    return builder.build()


@dataclass(frozen=True)
class _State:
    applied_seq: int
    generation: str


# Doc ids remembered per reader (about 100 bytes each).
DOC_ID_CACHE_MAX = 200_000


class FulltextIndex:
    """One tenant's full-text index in ``path``; safe to use from many threads and processes."""

    def __init__(self, path: Path, *, lock_wait: float = LOCK_WAIT_SECONDS) -> None:
        self.path = Path(path)
        self.lock_wait = lock_wait
        # Threads of this process queue here first (a bounded wait without polling), so at most one of
        # them polls the cross-process flock.
        self._writer_gate = threading.Lock()
        self._index_dir = self.path / "index"
        self._state_file = self.path / "state.json"
        self._lock_file = self.path / "lock"
        self._schema = build_schema()
        self._analyzer = build_analyzer()
        self._mutex = threading.Lock()
        # The seq the in-process reader is known to reflect, and the generation it was opened at.
        self._reader_seq = 0
        self._generation = ""
        # Doc id by doc address for the current reader (addresses change only when it reloads): reading a
        # stored doc for every hit cost more than the search itself.
        self._doc_ids: dict[tuple[int, int], str] = {}
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
        deadline = time.monotonic() + self.lock_wait
        if not self._writer_gate.acquire(timeout=self.lock_wait):
            raise IndexBusy("the search index is busy; retry shortly")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with open(self._lock_file, "a+") as handle:
                _flock_until(handle.fileno(), deadline)
                try:
                    yield
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        finally:
            self._writer_gate.release()

    # -- opening and recovery ----------------------------------------------------------------

    def _open(self) -> tantivy.Index:
        state = self._read_state()
        if state is not None:
            index = self._try_open_existing()
            if index is not None:
                # The reader was reloaded after the state was read, so it reflects at least this.
                self._generation = state.generation
                self._reader_seq = state.applied_seq
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
        self._doc_ids = {}

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
        reflects it, no lock is taken and no writer is opened. Otherwise, under the exclusive lock,
        re-read the applied seq, call ``fetch_changes(applied_seq)`` -> (changes after it, the
        high-water seq they bring the index to), apply and commit. From seq 0 the index is wiped
        first, so ``fetch_changes(0)`` must return the full current snapshot. Returns the seq.
        """
        if current_seq is not None:
            if current_seq <= self._reader_seq:
                return self._reader_seq
            state = self._read_state()
            fresh = state is not None and state.generation == self._generation
            if state is not None and fresh and state.applied_seq >= current_seq:
                with self._mutex:
                    if state.applied_seq > self._reader_seq:
                        self._refresh_reader_locked(state.applied_seq)
                return state.applied_seq
        # Searches keep reading the current reader while this fetches, applies and commits: only moving
        # the reader takes the mutex.
        with self._locked():
            state = self._ensure_current_locked()
            since = state.applied_seq
            if current_seq is not None and since >= current_seq:
                # Another writer caught up while this one waited for the lock: nothing to fetch.
                if since > self._reader_seq:
                    self._refresh_reader(since)
                return since
            try:
                changes, high_water = fetch_changes(since)
            except SnapshotRequired:
                since = 0
                changes, high_water = fetch_changes(0)
            applied = self._apply_locked(state, changes, upto_seq=high_water, wipe=since == 0)
            self._refresh_reader(applied)
        return applied

    def refresh(self, current_seq: int) -> int:
        """Move the reader to the newest committed catch-up when that reaches ``current_seq``; never
        takes the lock and never fetches. Returns the seq the reader reflects (it may stay behind)."""
        if current_seq <= self._reader_seq:
            return self._reader_seq
        state = self._read_state()
        if state is not None and state.generation == self._generation and state.applied_seq > self._reader_seq:
            with self._mutex:
                if state.applied_seq > self._reader_seq:
                    self._refresh_reader_locked(state.applied_seq)
        return self._reader_seq

    def reset(self) -> None:
        """Wipe every doc and set the applied seq to 0; the next catch_up rebuilds from scratch."""
        with self._locked():
            state = self._ensure_current_locked()
            self._apply_locked(state, [], upto_seq=0, wipe=True)
            self._refresh_reader(0)

    def _refresh_reader(self, seq: int) -> None:
        with self._mutex:
            self._refresh_reader_locked(seq)

    def _refresh_reader_locked(self, seq: int) -> None:
        # Reloading is cheap (reads meta.json, opens only new segments), so it is done after every
        # write path unconditionally: a wipe-and-rebuild can end at the seq the reader already had.
        self._index.reload()
        self._doc_ids = {}
        self._reader_seq = seq

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
        if len(literal) <= MAX_EXACT_ID_CHARS and not any(ch.isspace() for ch in literal):
            exact = tantivy.Query.term_query(self._schema, "doc_id", literal)
            clauses.append((tantivy.Occur.Should, tantivy.Query.boost_query(exact, EXACT_ID_BOOST)))
        query = tantivy.Query.boolean_query(clauses)
        if doc_kinds is not None:
            # Boost 0: the kind filter restricts the hits without shifting their scores.
            kinds = tantivy.Query.term_set_query(self._schema, "doc_kind", sorted(doc_kinds))
            query = tantivy.Query.boolean_query(
                [
                    (tantivy.Occur.Must, query),
                    (tantivy.Occur.Must, tantivy.Query.boost_query(kinds, 0.0)),
                ]
            )
        with self._mutex:  # the searcher and the doc ids of its reader, together
            searcher, doc_ids = self._index.searcher(), self._doc_ids
        hits = []
        for hit_score, address in searcher.search(query, limit, count=False).hits:
            key = (address.segment_ord, address.doc)
            doc_id = doc_ids.get(key)
            if doc_id is None:
                doc_id = searcher.doc(address)["doc_id"][0]
                if len(doc_ids) < DOC_ID_CACHE_MAX:
                    doc_ids[key] = doc_id
            hits.append((doc_id, float(hit_score)))
        return sorted(hits, key=lambda hit: (-hit[1], hit[0]))

    @property
    def reader_seq(self) -> int:
        """The change seq the in-process reader is known to reflect."""
        return self._reader_seq

    @property
    def num_docs(self) -> int:
        return self._index.searcher().num_docs


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
