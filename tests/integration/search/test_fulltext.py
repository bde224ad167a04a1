"""Full-text index: English stemming, splitting on `_` and `.`, user text never raises, upserts
replace and deletes remove, kind filters, concurrent catch-up from several processes, and
recovery by rebuilding when the directory is deleted or damaged."""

from __future__ import annotations

import fcntl
import multiprocessing
import shutil
import sqlite3
from pathlib import Path

import pytest

from core.search.fulltext import DocChange, FulltextIndex, IndexBusy, SnapshotRequired


def _upsert(doc_id: str, text: str, *, seq: int, kind: str = "memory") -> DocChange:
    return DocChange(doc_id=doc_id, doc_kind=kind, text=text, deleted=False, seq=seq)


def _delete(doc_id: str, *, seq: int, kind: str = "memory") -> DocChange:
    return DocChange(doc_id=doc_id, doc_kind=kind, text=None, deleted=True, seq=seq)


def _ids(hits: list[tuple[str, float]]) -> list[str]:
    return [doc_id for doc_id, _ in hits]


@pytest.fixture
def index(tmp_path: Path) -> FulltextIndex:
    idx = FulltextIndex(tmp_path / "tenant")
    idx.apply(
        [
            _upsert("memory:1", "We run the nightly job before shipping", seq=1),
            _upsert("memory:2", "Customers prefer monthly invoices", seq=2),
            _upsert(
                "mydb.orders.order_amount",
                "Column: mydb.orders.order_amount Type: NUMERIC",
                seq=3,
                kind="column",
            ),
            _upsert("mydb.orders", "Model: mydb.orders. Orders placed online", seq=4, kind="model"),
            _upsert("mydb", "Datasource: mydb", seq=5, kind="datasource"),
        ],
        upto_seq=5,
    )
    return idx


def test_stemming(index: FulltextIndex) -> None:
    assert _ids(index.search("running", limit=10)) == ["memory:1"]
    assert _ids(index.search("shipped", limit=10)) == ["memory:1"]
    assert "memory:2" in _ids(index.search("customer", limit=10))


@pytest.mark.parametrize("text", ["amount", "order_amount", "mydb.orders.amount", "AMOUNT"])
def test_splits_on_underscore_and_dot(index: FulltextIndex, text: str) -> None:
    assert "mydb.orders.order_amount" in _ids(index.search(text, limit=10))


def test_pasted_canonical_id_comes_first(index: FulltextIndex) -> None:
    assert _ids(index.search("mydb.orders", limit=10))[0] == "mydb.orders"


@pytest.mark.parametrize(
    "text",
    [
        '"unbalanced',
        "(orders",
        "orders)",
        "AND OR:",
        "text:orders",
        "NOT",
        "a:b:c",
        "[1 TO",
        "*",
        "~2 ^3",
        'orders AND (customers OR "x',
        "\x00",
        "  ",
        "",
        "...",
        "___",
        "+-!",
        "🙂",
        "x" * 10_000,
    ],
)
def test_user_text_never_raises(index: FulltextIndex, text: str) -> None:
    assert isinstance(index.search(text, limit=5), list)


@pytest.mark.parametrize("text", ["", "   ", "...", "_._", "(!)"])
def test_text_without_terms_finds_nothing(index: FulltextIndex, text: str) -> None:
    assert index.search(text, limit=5) == []


def test_query_syntax_is_plain_words(index: FulltextIndex) -> None:
    assert "memory:2" in _ids(index.search("invoices AND (missing", limit=5))
    assert "memory:2" in _ids(index.search("text:invoices", limit=5))


def test_upsert_replaces(index: FulltextIndex) -> None:
    index.apply([_upsert("memory:2", "Suppliers send quarterly statements", seq=6)], upto_seq=6)
    assert index.search("invoices", limit=5) == []
    assert _ids(index.search("statement", limit=5)) == ["memory:2"]
    assert index.num_docs == 5


def test_delete_removes(index: FulltextIndex) -> None:
    index.apply([_delete("memory:1", seq=6)], upto_seq=6)
    assert index.search("running", limit=5) == []
    assert index.applied_seq == 6


def test_stale_changes_are_skipped(index: FulltextIndex) -> None:
    index.apply([_delete("memory:1", seq=3)], upto_seq=3)
    assert _ids(index.search("running", limit=5)) == ["memory:1"]
    assert index.applied_seq == 5


def test_last_change_of_a_doc_wins_within_a_batch(index: FulltextIndex) -> None:
    batch = [
        _upsert("memory:9", "alpha", seq=7),
        _delete("memory:9", seq=8),
        _upsert("memory:9", "beta", seq=9),
    ]
    index.apply(batch, upto_seq=9)
    assert index.search("alpha", limit=5) == []
    assert _ids(index.search("beta", limit=5)) == ["memory:9"]


def test_doc_kinds_filter(index: FulltextIndex) -> None:
    everything = dict(index.search("orders", limit=10))
    entities = dict(index.search("orders", limit=10, doc_kinds={"model", "column", "datasource"}))
    assert set(entities) == {"mydb.orders", "mydb.orders.order_amount"}
    # The filter restricts hits without changing their scores.
    assert all(entities[d] == pytest.approx(everything[d]) for d in entities)
    assert index.search("orders", limit=10, doc_kinds={"memory"}) == []
    assert index.search("orders", limit=10, doc_kinds=set()) == []


def test_unknown_kind_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        FulltextIndex(tmp_path / "t").apply([_upsert("x", "x", seq=1, kind="table")], upto_seq=1)


def test_persists_across_instances(index: FulltextIndex) -> None:
    reopened = FulltextIndex(index.path)
    assert reopened.applied_seq == 5
    assert _ids(reopened.search("running", limit=5)) == ["memory:1"]


# -- catch-up against a source of truth ------------------------------------------------------------


class ChangeLog:
    """A stand-in for the database change feed (SQLite, so several processes can share it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, doc_id TEXT,"
                " doc_kind TEXT, text TEXT, deleted INTEGER)"
            )

    def write(self, doc_id: str, text: str | None, *, kind: str = "memory") -> int:
        with sqlite3.connect(self.path, timeout=30) as db:
            cursor = db.execute(
                "INSERT INTO changes (doc_id, doc_kind, text, deleted) VALUES (?, ?, ?, ?)",
                (doc_id, kind, text, text is None),
            )
            return int(cursor.lastrowid or 0)

    def current_seq(self) -> int:
        with sqlite3.connect(self.path, timeout=30) as db:
            return int(db.execute("SELECT coalesce(max(seq), 0) FROM changes").fetchone()[0])

    def fetch(self, since: int) -> tuple[list[DocChange], int]:
        with sqlite3.connect(self.path, timeout=30) as db:
            rows = db.execute(
                "SELECT seq, doc_id, doc_kind, text, deleted FROM changes WHERE seq > ? ORDER BY seq",
                (since,),
            ).fetchall()
        changes = [DocChange(doc_id=d, doc_kind=k, text=t, deleted=bool(x), seq=s) for s, d, k, t, x in rows]
        # The high-water mark is the last change read: reading max(seq) separately could skip a change
        # written in between (the database feed reads both in one snapshot).
        return changes, max([since, *(c.seq for c in changes)])


def test_catch_up_fast_path_opens_no_writer(tmp_path: Path) -> None:
    log = ChangeLog(tmp_path / "log.db")
    log.write("memory:1", "hello world")
    idx = FulltextIndex(tmp_path / "t")
    assert idx.catch_up(log.fetch, current_seq=log.current_seq()) == 1

    def must_not_fetch(since: int) -> tuple[list[DocChange], int]:
        raise AssertionError("fast path must not fetch")

    assert idx.catch_up(must_not_fetch, current_seq=1) == 1
    # Another instance (as another process would) sees the committed seq without fetching either.
    assert FulltextIndex(tmp_path / "t").catch_up(must_not_fetch, current_seq=1) == 1


def test_lock_wait_is_bounded_and_a_caught_up_waiter_fetches_nothing(tmp_path: Path) -> None:
    log = ChangeLog(tmp_path / "log.db")
    log.write("memory:1", "hello world")
    idx = FulltextIndex(tmp_path / "t", lock_wait=0.3)
    fetched: list[int] = []

    def fetch(since: int) -> tuple[list[DocChange], int]:
        fetched.append(since)
        return log.fetch(since)

    # Another holder (a separate open file description, as another process would hold it).
    with open(tmp_path / "t" / "lock", "a+") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        with pytest.raises(IndexBusy):
            idx.catch_up(fetch, current_seq=log.current_seq())
        fcntl.flock(holder.fileno(), fcntl.LOCK_UN)
    assert fetched == []
    assert idx.catch_up(fetch, current_seq=log.current_seq()) == 1
    # refresh never locks: with the lock held elsewhere it still moves a reader to the committed seq.
    other = FulltextIndex(tmp_path / "t", lock_wait=0.3)
    log.write("memory:2", "second note")
    idx.catch_up(fetch, current_seq=log.current_seq())
    with open(tmp_path / "t" / "lock", "a+") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        assert other.refresh(2) == 2
        assert _ids(other.search("second", limit=5)) == ["memory:2"]
        assert other.refresh(5) == 2  # behind what is committed: stays, without waiting


def test_a_reader_adopts_every_commit_made_elsewhere_however_quickly_they_follow(tmp_path: Path) -> None:
    """The lock-free paths glance at the state file (one stat) and read it again only when it changed: commits
    a few milliseconds apart, with state files of one size, are each seen at once."""
    log = ChangeLog(tmp_path / "log.db")
    idx, other = FulltextIndex(tmp_path / "t"), FulltextIndex(tmp_path / "t")
    for n in range(1, 31):
        log.write(f"memory:{n}", f"note number{n}")
        assert idx.catch_up(log.fetch, current_seq=log.current_seq()) == n
        assert other.refresh(n) == n
        assert _ids(other.search(f"number{n}", limit=5)) == [f"memory:{n}"]


def _worker(index_path: str, log_path: str, worker: int, count: int) -> None:
    log = ChangeLog(Path(log_path))
    idx = FulltextIndex(Path(index_path))
    for i in range(count):
        log.write(f"memory:w{worker}-{i}", f"note {i} from worker{worker} about shipping")
        idx.catch_up(log.fetch, current_seq=log.current_seq())
        assert idx.search(f"worker{worker}", limit=1000)


def test_concurrent_catch_up_from_processes(tmp_path: Path) -> None:
    log = ChangeLog(tmp_path / "log.db")
    context = multiprocessing.get_context("spawn")
    workers, count = 3, 25
    processes = [
        context.Process(target=_worker, args=(str(tmp_path / "t"), str(tmp_path / "log.db"), w, count))
        for w in range(workers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [process.exitcode for process in processes] == [0] * workers
    idx = FulltextIndex(tmp_path / "t")
    idx.catch_up(log.fetch, current_seq=log.current_seq())
    assert idx.applied_seq == workers * count
    assert len(idx.search("shipping", limit=1000)) == workers * count
    assert idx.num_docs == workers * count


def test_deleted_directory_is_rebuilt_from_zero(tmp_path: Path) -> None:
    log = ChangeLog(tmp_path / "log.db")
    log.write("memory:1", "alpha")
    log.write("memory:2", "beta")
    idx = FulltextIndex(tmp_path / "t")
    idx.catch_up(log.fetch, current_seq=log.current_seq())
    shutil.rmtree(tmp_path / "t")
    log.write("memory:3", "gamma")
    seen: list[int] = []

    def fetch(since: int) -> tuple[list[DocChange], int]:
        seen.append(since)
        return log.fetch(since)

    assert idx.catch_up(fetch, current_seq=log.current_seq()) == 3
    assert seen == [0]
    found = {_ids(idx.search(word, limit=5))[0] for word in ("alpha", "beta", "gamma")}
    assert found == {"memory:1", "memory:2", "memory:3"}
    assert FulltextIndex(tmp_path / "t").applied_seq == 3


def test_new_instance_on_deleted_directory_starts_empty(tmp_path: Path) -> None:
    idx = FulltextIndex(tmp_path / "t")
    idx.apply([_upsert("memory:1", "alpha", seq=1)], upto_seq=1)
    shutil.rmtree(tmp_path / "t")
    fresh = FulltextIndex(tmp_path / "t")
    assert fresh.applied_seq == 0
    assert fresh.search("alpha", limit=5) == []


@pytest.mark.parametrize("damage", ["meta", "state"])
def test_damaged_directory_is_recreated_empty(tmp_path: Path, damage: str) -> None:
    idx = FulltextIndex(tmp_path / "t")
    idx.apply([_upsert("memory:1", "alpha", seq=1)], upto_seq=1)
    target = tmp_path / "t" / ("index/meta.json" if damage == "meta" else "state.json")
    target.write_text("{not json")
    fresh = FulltextIndex(tmp_path / "t")
    assert fresh.applied_seq == 0
    assert fresh.search("alpha", limit=5) == []
    fresh.apply([_upsert("memory:2", "beta", seq=1)], upto_seq=1)
    assert _ids(fresh.search("beta", limit=5)) == ["memory:2"]


def test_catch_up_from_zero_drops_docs_missing_from_the_snapshot(tmp_path: Path) -> None:
    idx = FulltextIndex(tmp_path / "t")
    idx.apply([_upsert("memory:1", "alpha", seq=1), _upsert("memory:2", "beta", seq=2)], upto_seq=2)
    idx.reset()
    assert idx.applied_seq == 0
    assert idx.search("alpha", limit=5) == []
    idx.catch_up(lambda since: ([_upsert("memory:2", "beta", seq=2)], 2))
    assert _ids(idx.search("beta", limit=5)) == ["memory:2"]
    assert idx.num_docs == 1


def test_snapshot_required_rebuilds(tmp_path: Path) -> None:
    idx = FulltextIndex(tmp_path / "t")
    idx.apply([_upsert("memory:1", "alpha", seq=1)], upto_seq=1)

    def fetch(since: int) -> tuple[list[DocChange], int]:
        if since:
            raise SnapshotRequired
        return [_upsert("memory:2", "beta", seq=7)], 7

    assert idx.catch_up(fetch, current_seq=7) == 7
    assert idx.search("alpha", limit=5) == []
    assert _ids(idx.search("beta", limit=5)) == ["memory:2"]


def test_state_is_fsynced_only_when_it_goes_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state moving forward after a (durable) commit may be lost in a crash, costing a replay, so it is not
    fsynced; a state going back (a wipe) or to a new generation over an existing one must not be lost."""
    import os

    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    idx = FulltextIndex(tmp_path / "t")  # a new directory: nothing older to go back to
    idx.catch_up(lambda since: ([_upsert("memory:1", "alpha", seq=1)], 1), current_seq=1)
    idx.apply([_upsert("memory:2", "beta", seq=2)], upto_seq=2)
    assert synced == [] and FulltextIndex(tmp_path / "t").applied_seq == 2
    idx.reset()  # back to 0: a lost write would leave seq 2 over an emptied index
    assert len(synced) == 1 and idx.applied_seq == 0
    (tmp_path / "t" / "index" / "meta.json").write_text("{not json")
    FulltextIndex(tmp_path / "t")  # recreated with a new generation over the old state
    assert len(synced) == 2


# -- benchmark (prints figures; run with -s; no timed assertions) ----------------------------------


def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2]
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"p50 {p50 * 1e3:.2f} ms, p95 {p95 * 1e3:.2f} ms"


@pytest.mark.slow
def test_an_index_of_many_docs_builds_catches_up_and_searches(tmp_path: Path) -> None:
    """Every path of the index at a size (20,000 docs; ENGRAM_BENCH_FULLTEXT_DOCS=100000 for the figures at
    100k): a build, incremental commits, a reader behind another process's commit, changes held in memory;
    prints each one's timings."""
    import os
    import random
    import time

    import tantivy

    size = int(os.environ.get("ENGRAM_BENCH_FULLTEXT_DOCS", "20000"))
    rng = random.Random(7)
    vocab = [
        f"{rng.choice('bcdfgklmnprst')}{rng.choice('aeiou')}{rng.choice('bcdfgklmnprst')}{i}"
        for i in range(5000)
    ]
    weights = [1 / (rank + 1) for rank in range(len(vocab))]  # Zipf-like word frequencies
    kinds = ["memory"] * 6 + ["column", "model", "measure", "datasource"]

    def doc_text() -> str:
        return " ".join(rng.choices(vocab, weights=weights, k=rng.randint(8, 20))) + " order_amount"

    snapshot = [_upsert(f"d{i}", doc_text(), seq=i + 1, kind=rng.choice(kinds)) for i in range(size)]
    # Commits every catch-up (no changes held in memory): the cost of a commit, and of adopting one.
    idx = FulltextIndex(tmp_path / "bench", delta_min_docs=10 * size)
    started = time.perf_counter()
    idx.catch_up(lambda since: (snapshot, size))
    build = time.perf_counter() - started

    queries = [" ".join(rng.choices(vocab, weights=weights, k=rng.randint(1, 4))) for _ in range(400)]
    for query in queries[:20]:
        idx.search(query, limit=50)  # warm up
    plain, filtered = [], []
    for query in queries:
        started = time.perf_counter()
        idx.search(query, limit=50)
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        idx.search(query, limit=50, doc_kinds={"memory"})
        filtered.append(time.perf_counter() - started)

    seq = size
    other = FulltextIndex(tmp_path / "bench", delta_min_docs=10 * size)  # another process's view
    # A third process that keeps what it catches up in memory (core.search.delta).
    held = FulltextIndex(tmp_path / "bench")
    changes: list[DocChange] = []
    incremental, behind, current, in_memory = [], [], [], []
    for i in range(100):
        seq += 1
        change = _upsert(f"new{i}", doc_text(), seq=seq)
        started = time.perf_counter()
        idx.catch_up(lambda since, change=change: ([change], change.seq), current_seq=seq)
        incremental.append(time.perf_counter() - started)
        # Behind by one commit made elsewhere: read state.json, reload the reader; no lock, no writer.
        started = time.perf_counter()
        other.catch_up(lambda since: ([], since), current_seq=seq)
        behind.append(time.perf_counter() - started)
        # Already current: an integer comparison.
        started = time.perf_counter()
        other.catch_up(lambda since: ([], since), current_seq=seq)
        current.append(time.perf_counter() - started)
    assert _ids(other.search(change.text or "", limit=1)) == [change.doc_id]
    for i in range(100):
        seq += 1
        change = _upsert(f"held{i}", doc_text(), seq=seq)
        changes.append(change)
        started = time.perf_counter()
        held.catch_up(lambda since, upto=seq: ([c for c in changes if c.seq > since], upto), current_seq=seq)
        in_memory.append(time.perf_counter() - started)
    assert _ids(held.search(change.text or "", limit=1)) == [change.doc_id]
    with_delta = []
    for query in queries[:200]:
        started = time.perf_counter()
        held.search(query, limit=50)
        with_delta.append(time.perf_counter() - started)

    index = tantivy.Index.open(str(tmp_path / "bench" / "index"))
    started = time.perf_counter()
    writer = index.writer(heap_size=50_000_000, num_threads=1)
    writer_open = time.perf_counter() - started
    del writer
    index.reload()
    print(
        f"\nfulltext bench, {size} docs: build {build:.1f} s; "
        f"query limit 50: {_percentiles(plain)}; with doc_kinds filter: {_percentiles(filtered)}; "
        f"incremental catch_up of 1 doc: {_percentiles(incremental)}; "
        f"catch_up of a reader one commit behind (state.json + reload): {_percentiles(behind)}; "
        f"catch_up when current: {_percentiles(current)}; "
        f"catch_up of 1 doc kept in memory: {_percentiles(in_memory)}; "
        f"query limit 50 over 100 docs in memory: {_percentiles(with_delta)}; "
        f"writer open {writer_open * 1e3:.2f} ms; segments after 100 incremental commits: "
        f"{index.searcher().num_segments}"
    )
    assert idx.num_docs == size + 100


def test_remembered_doc_ids_follow_every_reload(tmp_path: Path) -> None:
    """Doc ids are remembered by doc address per reader: after writes move docs between segments (and
    merges renumber them), every hit still carries its own id."""
    idx = FulltextIndex(tmp_path / "tenant")
    live: dict[str, str] = {}
    seq = 0
    for round_ in range(12):
        changes = []
        for n in range(round_ * 7, round_ * 7 + 9):  # overlapping ranges: upserts of existing docs too
            seq += 1
            live[f"memory:{n}"] = f"ledger entry {n} word{n % 5}"
            changes.append(_upsert(f"memory:{n}", live[f"memory:{n}"], seq=seq))
        for n in range(0, round_ * 7, 3):
            if f"memory:{n}" in live:
                seq += 1
                del live[f"memory:{n}"]
                changes.append(_delete(f"memory:{n}", seq=seq))
        idx.apply(changes, upto_seq=seq)
        for word in range(5):
            found = _ids(idx.search(f"word{word}", limit=1000))
            expected = sorted(d for d, text in live.items() if text.endswith(f"word{word}"))
            assert sorted(found) == expected, (round_, word)
            # A second search of the same reader answers from the remembered ids: the same hits.
            assert _ids(idx.search(f"word{word}", limit=1000)) == found


# A conversation of one run, as core.search.index composes its docs: each turn with up to two neighbours.
_TURNS = [
    "Melanie: How was the weekend, anything fun?",
    "Caroline: We finally went to the aquarium downtown, the kids could not stop talking about it all week",
    "Melanie: That sounds like a great day out!",
    "Caroline: Yes, and the aquarium had a new shark tank",
    "Melanie: Shall we plan a picnic soon?",
]


@pytest.mark.parametrize(
    ("rule", "question", "first"),
    [
        ("the turn that says a word ranks above the shorter turns that only borrow it", "aquarium", "memory:3"),
        ("two own words beat one own word plus one borrowed", "aquarium kids", "memory:1"),
        ("a word no turn says itself still finds the turns around it", "picnic", "memory:4"),
    ],
)
def test_own_words_outweigh_borrowed_ones(tmp_path: Path, rule: str, question: str, first: str) -> None:
    """A memory with run context is indexed with its own text OWN_TEXT_WEIGHT (2) times and each neighbour's
    once (BM25F field weights): a question's word ranks the turn that says it above the turns around it,
    which only borrow it, even when they are shorter."""
    from core.search.index import CONTEXT_TURNS, memory_fulltext_text

    idx = FulltextIndex(tmp_path / "tenant")
    changes = []
    for n, turn in enumerate(_TURNS):
        window = [*range(n - CONTEXT_TURNS, n), *range(n + 1, n + 1 + CONTEXT_TURNS)]
        context = [_TURNS[k] for k in window if 0 <= k < len(_TURNS)]
        text = memory_fulltext_text(content=turn, entities=[], tags=[], context=context)
        changes.append(_upsert(f"memory:{n}", text, seq=n + 1))
    idx.apply(changes, upto_seq=len(_TURNS))
    assert _ids(idx.search(question, limit=5))[0] == first, rule


def test_memory_without_context_is_indexed_once() -> None:
    """Without neighbours a memory's text is its content and tags, once (nothing to weigh it against)."""
    from core.search.index import memory_fulltext_text

    text = memory_fulltext_text(content="plain words", entities=["memory:x", "db.t"], tags=["a"])
    assert text == "plain words\ndb.t a"
