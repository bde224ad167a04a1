"""Changes a large full-text index holds in memory (core.search.delta): they rank exactly as they will once
committed, hide what they replace, fold into one commit when many, and never outlive the reader they sit
on. Real tantivy indexes in temporary directories."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import numpy as np
import pytest

from core.search import fulltext
from core.search.delta import K1, B, Bm25Stats, Delta, fieldnorm, idf
from core.search.fulltext import DocChange, FulltextIndex

WORDS = (
    "orders revenue refunds customer region churn weekly monthly fiscal quarter margin warehouse shipment "
    "delay status paid pending cancelled timezone dashboard metric filter join invoice supplier ledger"
).split()


def _upsert(doc_id: str, text: str, *, seq: int, kind: str = "memory") -> DocChange:
    return DocChange(doc_id=doc_id, doc_kind=kind, text=text, deleted=False, seq=seq)


def _delete(doc_id: str, *, seq: int) -> DocChange:
    return DocChange(doc_id=doc_id, doc_kind="memory", text=None, deleted=True, seq=seq)


def _text(rng: random.Random) -> str:
    # Short and long docs (field lengths on both sides of the exact range), punctuation, a token too long
    # to index, repeated words (term frequencies above 1).
    words = [rng.choice(WORDS) for _ in range(rng.choice([3, 9, 30, 90, 260]))]
    if rng.random() < 0.2:
        words.append("x" * 45)
    return ", ".join(words) + "."


class Log:
    """A change feed in memory: what PostgreSQL's change seq and rows are to the real index."""

    def __init__(self) -> None:
        self.changes: list[DocChange] = []
        self.fetches: list[int] = []

    @property
    def seq(self) -> int:
        return self.changes[-1].seq if self.changes else 0

    def add(self, change: DocChange) -> DocChange:
        self.changes.append(change)
        return change

    def fetch(self, since: int) -> tuple[list[DocChange], int]:
        self.fetches.append(since)
        return [c for c in self.changes if c.seq > since], self.seq


@pytest.fixture
def base(tmp_path: Path) -> tuple[Path, Log, random.Random]:
    """A committed index of 400 docs of all lengths."""
    rng = random.Random(11)
    log = Log()
    for n in range(400):
        log.add(_upsert(f"memory:{n}", _text(rng), seq=n + 1, kind="memory" if n % 5 else "example_query"))
    FulltextIndex(tmp_path / "t").catch_up(log.fetch)
    return tmp_path / "t", log, rng


@pytest.mark.parametrize("length", [0, 1, 5, 23, 24, 25, 40, 41, 100, 255, 256, 1000, 4097, 100_000])
def test_fieldnorm_is_the_one_byte_length_scale(length: int) -> None:
    """Rule: lengths below 24 are exact; above, the length keeps its 4 most significant bits (rounded
    down), so it never exceeds the true length and loses at most an eighth of it."""
    stored = fieldnorm(length)
    assert stored == length if length < 24 else length * 7 / 8 <= stored <= length


def _scalar_scores(delta: Delta, terms: list[str], doc_freq, stats: Bm25Stats) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """BM25 of a boolean OR of terms, one float32 operation at a time, in tantivy's order."""
    one, average, scores = np.float32(1.0), np.float32(stats.average_length), {}
    for term in terms:
        weight = idf(doc_freq(term), stats.docs) * (one + K1)
        for slot, tf in delta.postings.get(term, {}).items():
            doc_id = delta.order[slot]
            norm = K1 * (one - B + B * np.float32(fieldnorm(delta.docs[doc_id].length)) / average)
            freq = np.float32(tf)
            scores[doc_id] = scores.get(doc_id, np.float32(0.0)) + weight * (freq / (freq + norm))
    return {doc_id: float(score) for doc_id, score in scores.items()}


def test_held_docs_are_scored_in_float32_one_operation_at_a_time() -> None:
    """The held docs' scores, computed over arrays, are bit for bit those of float32 arithmetic one operation
    at a time (each doc's terms summed in the query's order), whatever the lengths, frequencies and statistics."""
    rng = random.Random(5)
    for _ in range(60):
        changes = [
            DocChange(doc_id=f"memory:{n}", doc_kind="memory", text=_text(rng), deleted=rng.random() < 0.05, seq=n + 1)
            for n in range(rng.randrange(1, 300))
        ]
        delta = Delta(0, 0).merged(changes, upto_seq=len(changes), analyze=str.split, in_reader=lambda _: False)
        terms = [w + "," for w in rng.sample(WORDS, rng.randrange(1, 6))] + rng.sample(WORDS, 2)
        freqs = {term: rng.randrange(0, 4000) for term in terms}
        stats = Bm25Stats(docs=rng.randrange(300, 90_000), average_length=rng.uniform(2.0, 250.0))
        matched, scores = delta._scores(terms, doc_freq=freqs.__getitem__, stats=stats, exact_id=None)
        scored = {delta.order[slot]: float(scores[slot]) for slot in matched}
        expected = _scalar_scores(delta, terms, freqs.__getitem__, stats)
        assert scored and set(scored) == set(expected)
        assert all(scored[doc_id] == score for doc_id, score in expected.items())


def _ranked(hits: list[tuple[str, float]]) -> list[tuple[str, float]]:
    return sorted(hits, key=lambda hit: (-hit[1], hit[0]))


def test_a_delta_merged_and_folded_in_steps_scores_as_one_built_from_its_latest_changes() -> None:
    """Docs keep their slots through merges (changed again, deleted, written back) and are renumbered by a
    fold: at every step each held doc scores, and is of the kind, it would be in a delta built at once from
    the same latest changes."""
    rng = random.Random(23)
    kinds = ("memory", "example_query", "datasource")
    stats = Bm25Stats(docs=5000, average_length=37.0)
    terms = ["orders,", "refunds,", "margin,", "ledger,"]  # (split on spaces, a text's words keep their commas)
    for _ in range(20):
        delta, seq, latest = Delta(0, 0), 0, {}
        for _ in range(rng.randrange(2, 8)):
            changes = []
            for _ in range(rng.randrange(1, 40)):
                seq += 1
                doc_id = f"memory:{rng.randrange(60)}"
                if rng.random() < 0.15:
                    change = DocChange(doc_id=doc_id, doc_kind="memory", text=None, deleted=True, seq=seq)
                else:
                    change = DocChange(
                        doc_id=doc_id, doc_kind=rng.choice(kinds), text=_text(rng), deleted=False, seq=seq
                    )
                changes.append(change)
            rng.shuffle(changes)  # the latest of a doc wins, whatever the order they come in
            delta = delta.merged(changes, upto_seq=seq, analyze=str.split, in_reader=lambda _: False)
            latest.update({c.doc_id: c for c in sorted(changes, key=lambda c: c.seq)})
            if rng.random() < 0.4:
                folded = rng.randrange(delta.base_seq, seq + 1)
                delta = delta.after(folded, in_reader=lambda _: False)
                latest = {doc_id: c for doc_id, c in latest.items() if c.seq > folded}
            fresh = Delta(0, 0).merged(
                list(latest.values()), upto_seq=seq, analyze=str.split, in_reader=lambda _: False
            )
            assert set(delta.docs) == set(fresh.docs) == set(latest)
            for doc_kinds in (None, frozenset({"memory"}), frozenset({"example_query", "datasource"})):
                exact = (rng.choice(list(latest)), 5.0, 3) if latest else None
                found = delta.search(terms, doc_freq=lambda _: 40, stats=stats, doc_kinds=doc_kinds, exact_id=exact)
                wanted = fresh.search(terms, doc_freq=lambda _: 40, stats=stats, doc_kinds=doc_kinds, exact_id=exact)
                assert _ranked(found) == _ranked(wanted)
                if doc_kinds is not None:
                    assert all(latest[doc_id].doc_kind in doc_kinds for doc_id, _ in found)


def test_a_limited_search_of_a_delta_keeps_every_doc_that_can_rank_in_the_limit() -> None:
    """With ``limit``, what the delta leaves out scores below its ``limit``-th best: the best ``limit`` of the
    held docs (ties by id) are the same as without it, however many tie."""
    rng = random.Random(29)
    stats = Bm25Stats(docs=5000, average_length=37.0)
    for _ in range(40):
        # Few distinct texts, so many docs tie on their score.
        texts = [_text(rng) for _ in range(rng.randrange(1, 6))]
        changes = [_upsert(f"memory:{n}", rng.choice(texts), seq=n + 1) for n in range(rng.randrange(1, 200))]
        delta = Delta(0, 0).merged(changes, upto_seq=len(changes), analyze=str.split, in_reader=lambda _: False)
        terms = [word + "," for word in rng.sample(WORDS, 3)]
        everything = _ranked(delta.search(terms, doc_freq=lambda _: 40, stats=stats, doc_kinds=None))
        for limit in (1, 5, 30, 500):
            limited = delta.search(terms, doc_freq=lambda _: 40, stats=stats, doc_kinds=None, limit=limit)
            assert _ranked(limited)[:limit] == everything[:limit]
            assert len(limited) <= len(everything)
            if len(everything) > limit and everything[limit - 1][1] > everything[-1][1]:
                assert len(limited) < len(everything)  # something was left out


def test_a_held_doc_scores_exactly_as_the_reader_scores_the_same_text(base: tuple[Path, Log, random.Random]) -> None:
    """Rule: a held doc is scored with the reader's statistics as tantivy scores its own docs: a held copy
    of a committed doc's text scores what that doc scores, for every question, kind filter and length."""
    path, log, rng = base
    held = FulltextIndex(path)
    texts = {c.doc_id: c.text for c in log.changes}
    for n in range(0, 400, 13):
        log.add(_upsert(f"memory:copy{n}", texts[f"memory:{n}"] or "", seq=log.seq + 1))
    held.catch_up(log.fetch, current_seq=log.seq)
    assert len(held._delta) == 31 and held.applied_seq == 400  # nothing committed
    for question in ["refunds supplier ledger", "weekly churn margin", "invoice", "orders status paid delay"]:
        hits = dict(held.search(question, limit=500))
        copies = [n for n in range(0, 400, 13) if f"memory:copy{n}" in hits]
        assert copies, question
        for n in copies:
            assert hits[f"memory:copy{n}"] == pytest.approx(hits[f"memory:{n}"], rel=1e-6), (question, n)
    # The exact-id clause too: a held doc named by its id is first, with the committed docs' id boost.
    log.add(_upsert("memory:named", "the ledger of suppliers", seq=log.seq + 1))
    held.catch_up(log.fetch, current_seq=log.seq)
    first, score = held.search("memory:named", limit=5)[0]
    committed_first, committed_score = held.search("memory:13", limit=5)[0]
    assert (first, committed_first) == ("memory:named", "memory:13")


def test_held_changes_rank_close_to_the_committed_index(base: tuple[Path, Log, random.Random]) -> None:
    """Against the index that committed the same changes (whose statistics count them), held changes give
    the same top hits with scores within a few percent; a rewritten doc shows its new text only, a deleted
    one is gone."""
    path, log, rng = base
    held = FulltextIndex(path)
    old_words = set((log.changes[7].text or "").replace(",", " ").replace(".", " ").split())
    for n in range(20):
        log.add(_upsert(f"memory:new{n}", _text(rng), seq=log.seq + 1))
    log.add(_upsert("memory:7", "refunds refunds of the supplier ledger, weekly", seq=log.seq + 1))
    log.add(_delete("memory:8", seq=log.seq + 1))
    held.catch_up(log.fetch, current_seq=log.seq)
    assert len(held._delta) == 22 and held.applied_seq == 400
    questions = [
        ("refunds supplier ledger", None),
        ("weekly churn margin", None),
        ("invoice", frozenset({"memory"})),
        ("orders status paid", frozenset({"example_query"})),
    ]
    before = {q: held.search(q, limit=60, doc_kinds=kinds) for q, kinds in questions}
    committed = FulltextIndex(path, delta_min_docs=10**9)  # commits every catch-up
    committed.catch_up(log.fetch, current_seq=log.seq)
    assert committed.applied_seq == log.seq
    for question, kinds in questions:
        expected = dict(committed.search(question, limit=60, doc_kinds=kinds))
        got = dict(before[question])
        top = sorted(expected, key=lambda d: -expected[d])[:5]
        assert sorted(got, key=lambda d: -got[d])[:5] == top, question
        for doc_id in set(got) & set(expected):
            assert got[doc_id] == pytest.approx(expected[doc_id], rel=0.05), (question, doc_id)
    assert "memory:8" not in {d for hits in before.values() for d, _ in hits}
    assert held.search("memory:7", limit=1)[0][0] == "memory:7"
    gone = sorted(old_words - {"refunds", "supplier", "ledger", "weekly"})[0]
    assert "memory:7" not in dict(held.search(gone, limit=500))
    question = "refunds supplier ledger weekly"
    rewritten = dict(held.search(question, limit=500))["memory:7"]
    assert rewritten == pytest.approx(dict(committed.search(question, limit=500))["memory:7"], rel=0.05)


def test_held_changes_fold_into_one_commit_when_many(base: tuple[Path, Log, random.Random]) -> None:
    """Each catch-up adds to memory until the changes are more than a sixteenth of the reader (32 at least):
    then all of them are committed together, and the reader holds them."""
    path, log, rng = base
    held = FulltextIndex(path)
    for n in range(32):
        log.add(_upsert(f"memory:s{n}", _text(rng), seq=log.seq + 1))
        held.catch_up(log.fetch, current_seq=log.seq)
        assert held.applied_seq == 400 and held.seq == log.seq
    log.add(_upsert("memory:s32", _text(rng), seq=log.seq + 1))
    held.catch_up(log.fetch, current_seq=log.seq)
    assert held.applied_seq == log.seq and len(held._delta) == 0
    assert held.num_docs == 433
    assert held.search("memory:s32", limit=1)[0][0] == "memory:s32"


def test_another_process_commits_and_the_held_changes_it_covers_go(base: tuple[Path, Log, random.Random]) -> None:
    """Changes held by one process are not on disk: another process catches up from the feed itself. When it
    commits, the first adopts the commit on its next catch-up and keeps only what is newer."""
    path, log, rng = base
    first = FulltextIndex(path)
    log.add(_upsert("memory:a", "ledger reconciliation runs weekly", seq=log.seq + 1))
    first.catch_up(log.fetch, current_seq=log.seq)
    second = FulltextIndex(path, delta_min_docs=10**9)
    second.catch_up(log.fetch, current_seq=log.seq)
    assert second.search("reconciliation", limit=5)[0][0] == "memory:a"
    log.add(_upsert("memory:a", "ledger reconciliation moved to monthly", seq=log.seq + 1))
    log.add(_upsert("memory:b", "reconciliation owners are the finance team", seq=log.seq + 1))
    first.catch_up(log.fetch, current_seq=log.seq)
    assert set(first._delta.docs) == {"memory:a", "memory:b"}
    upto = log.seq - 1  # the feed as it stood before memory:b: second commits memory:a's rewrite only
    second.catch_up(lambda since: ([c for c in log.changes if since < c.seq <= upto], upto), current_seq=upto)
    assert second.applied_seq == upto
    log.add(_upsert("memory:c", "reconciliation report template", seq=log.seq + 1))
    first.catch_up(log.fetch, current_seq=log.seq)
    assert set(first._delta.docs) == {"memory:b", "memory:c"}
    hits = dict(first.search("reconciliation", limit=10))
    assert set(hits) >= {"memory:a", "memory:b", "memory:c"}
    assert first.search("monthly reconciliation", limit=1)[0][0] == "memory:a"


def test_a_small_index_commits_every_catch_up(tmp_path: Path) -> None:
    """Below the reader size a delta needs, each catch-up commits (its statistics would move too much)."""
    log = Log()
    idx = FulltextIndex(tmp_path / "t")
    for n in range(5):
        log.add(_upsert(f"memory:{n}", f"note {n} on the orders feed", seq=n + 1))
        idx.catch_up(log.fetch, current_seq=log.seq)
        assert idx.applied_seq == log.seq and len(idx._delta) == 0


def test_reset_drops_held_changes(base: tuple[Path, Log, random.Random]) -> None:
    """A wipe takes the reader back: what was held on top of it goes, and the next catch-up rebuilds."""
    path, log, rng = base
    held = FulltextIndex(path)
    log.add(_upsert("memory:z", "zebra crossing near the warehouse", seq=log.seq + 1))
    held.catch_up(log.fetch, current_seq=log.seq)
    assert len(held._delta) == 1
    held.reset()
    assert held.seq == 0 and len(held._delta) == 0 and held.search("zebra", limit=5) == []
    held.catch_up(log.fetch, current_seq=log.seq)
    assert held.search("zebra", limit=5)[0][0] == "memory:z" and held.num_docs == 401


def test_a_question_only_held_docs_answer_still_ranks_them(base: tuple[Path, Log, random.Random]) -> None:
    """No word of the question is in the reader: the held docs are ranked among themselves, by their words."""
    path, log, rng = base
    held = FulltextIndex(path)
    log.add(_upsert("memory:q1", "quokka quokka habitat", seq=log.seq + 1))
    log.add(_upsert("memory:q2", "a quokka, once, seen near the warehouse on a cold day", seq=log.seq + 1))
    held.catch_up(log.fetch, current_seq=log.seq)
    assert [d for d, _ in held.search("quokka", limit=5)] == ["memory:q1", "memory:q2"]


def test_bm25_statistics_read_off_an_explanation() -> None:
    explanation = (
        '{"value": 1.0, "description": "TermQuery, product of...", "details": ['
        '{"value": 0.4, "description": "idf", "details": [{"value": 2.0, "description": "n, number of docs"},'
        ' {"value": 401.0, "description": "N, total number of docs"}]},'
        ' {"value": 0.5, "description": "freq / ...", "details": [{"value": 12.5, "description": "avgdl, average"}]}]}'
    )
    assert Bm25Stats.from_explanation(explanation) == Bm25Stats(docs=401, average_length=12.5)
    assert Bm25Stats.from_explanation('{"value": 1.0, "description": "Const"}') is None


def test_catching_up_in_memory_never_waits(base: tuple[Path, Log, random.Random]) -> None:
    """Rule: from inside a transaction the index catches up only when that needs no waiting: the gate is
    free (or held by another in-memory catch-up, see the next test) and the changes stay in memory. Otherwise
    it reports False and changes nothing (the search then catches up outside its transaction)."""
    path, log, rng = base
    held = FulltextIndex(path)
    log.add(_upsert("memory:t1", "tern colony count", seq=log.seq + 1))
    assert held.catch_up_in_memory(log.fetch, current_seq=log.seq) is True
    assert held.seq == log.seq and held.applied_seq == 400 and held.search("tern", limit=1)[0][0] == "memory:t1"
    assert held.catch_up_in_memory(log.fetch, current_seq=log.seq) is True  # current: nothing fetched
    fetched = len(log.fetches)
    # Another thread of the process is catching up: no waiting, no fetch.
    log.add(_upsert("memory:t2", "tern migration", seq=log.seq + 1))
    with held._writer_gate:
        assert held.catch_up_in_memory(log.fetch, current_seq=log.seq) is False
    assert len(log.fetches) == fetched and held.seq == log.seq - 1
    # Enough changes to commit: that takes the cross-process lock, so not from a transaction.
    for n in range(40):
        log.add(_upsert(f"memory:f{n}", _text(rng), seq=log.seq + 1))
    assert held.catch_up_in_memory(log.fetch, current_seq=log.seq) is False
    assert held.seq < log.seq and held.applied_seq == 400
    assert held.catch_up(log.fetch, current_seq=log.seq) == log.seq and held.applied_seq == log.seq


def test_an_in_memory_catch_up_waits_briefly_for_another_one(
    base: tuple[Path, Log, random.Random], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule: a catch-up from a transaction that finds another thread catching up in memory (which waits on
    nothing) waits for it, at most IN_MEMORY_WAIT_SECONDS, and then finds the index current; one that finds
    any other holder of the gate (a catch-up that commits) still gives up at once."""
    monkeypatch.setattr(fulltext, "IN_MEMORY_WAIT_SECONDS", 30.0)  # the rule, not the machine's speed
    path, log, rng = base
    held = FulltextIndex(path)
    log.add(_upsert("memory:w1", "skua nest count", seq=log.seq + 1))
    entered, release, first = threading.Event(), threading.Event(), []
    fetched = len(log.fetches)

    def slow_fetch(since: int) -> tuple[list[DocChange], int]:
        entered.set()
        release.wait(30)
        return log.fetch(since)

    ahead = threading.Thread(target=lambda: first.append(held.catch_up_in_memory(slow_fetch, current_seq=log.seq)))
    ahead.start()
    assert entered.wait(30)
    timer = threading.Timer(0.05, release.set)
    timer.start()
    assert held.catch_up_in_memory(log.fetch, current_seq=log.seq) is True
    ahead.join(30)
    assert first == [True] and len(log.fetches) == fetched + 1  # the second found the index current: no fetch
    assert held.search("skua", limit=1)[0][0] == "memory:w1"
    log.add(_upsert("memory:w2", "skua chick count", seq=log.seq + 1))
    with held._writer_gate:
        assert held.catch_up_in_memory(log.fetch, current_seq=log.seq) is False


def test_a_small_index_catches_up_in_memory_only_when_current(tmp_path: Path) -> None:
    log = Log()
    idx = FulltextIndex(tmp_path / "t")
    log.add(_upsert("memory:1", "one note", seq=1))
    assert idx.catch_up_in_memory(log.fetch, current_seq=1) is False and log.fetches == []
    idx.catch_up(log.fetch, current_seq=1)
    assert idx.catch_up_in_memory(log.fetch, current_seq=1) is True


class _CountingAnalyzer:
    """The index's analyzer, counting the texts it analyses for the delta."""

    def __init__(self, inner: object) -> None:
        self.inner, self.texts = inner, 0

    def analyze(self, text: str) -> list[str]:
        self.texts += 1
        return self.inner.analyze(text)  # type: ignore[attr-defined, no-any-return]


def test_a_bulk_of_changes_is_committed_without_being_analysed_for_memory(
    base: tuple[Path, Log, random.Random],
) -> None:
    """Rule: changes that could not all be held (more than the fold threshold with what is held) are never
    analysed for the delta: from a transaction the index says False at once, and the catch-up commits the
    held changes and the bulk together (the latest change of a doc winning)."""
    path, log, rng = base
    held = FulltextIndex(path)
    log.add(_upsert("memory:kept", "puffin burrow survey", seq=log.seq + 1))
    log.add(_upsert("memory:moved", "gannet ledge survey", seq=log.seq + 1))
    held.catch_up(log.fetch, current_seq=log.seq)
    assert len(held._delta) == 2 and held.applied_seq == 400
    counting = _CountingAnalyzer(held._analyzer)
    held._analyzer = counting  # type: ignore[assignment]
    for n in range(1000):
        log.add(_upsert(f"memory:bulk{n}", _text(rng), seq=log.seq + 1))
    log.add(_upsert("memory:moved", "shag colony survey", seq=log.seq + 1))
    assert held.catch_up_in_memory(log.fetch, current_seq=log.seq) is False
    assert counting.texts == 0 and held.seq == 402
    assert held.catch_up(log.fetch, current_seq=log.seq) == log.seq
    assert counting.texts == 0 and len(held._delta) == 0 and held.applied_seq == log.seq
    assert held.num_docs == 1402
    assert [d for d, _ in held.search("puffin", limit=2)] == ["memory:kept"]
    assert [d for d, _ in held.search("shag", limit=2)] == ["memory:moved"] and not held.search("gannet", limit=2)


def test_the_searches_of_one_question_for_each_kind_score_the_held_docs_once(
    base: tuple[Path, Log, random.Random], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule: a question's searches of each doc kind (one per search bucket) answer what they answered when each
    scored the held docs itself, while the held docs are scored once per reader and question."""
    from core.search.delta import Delta

    path, log, rng = base
    held = FulltextIndex(path)
    for n in range(30):
        kind = ("memory", "example_query", "datasource")[n % 3]
        log.add(_upsert(f"memory:held{n}", _text(rng), seq=log.seq + 1, kind=kind))
    held.catch_up(log.fetch, current_seq=log.seq)
    assert len(held._delta) == 30  # held, not committed
    delta, stats = held._delta, Bm25Stats(docs=400, average_length=40.0)
    terms = ["refunds", "supplier", "ledger", "weekly"]

    def doc_freq(term: str) -> int:
        return 17

    kinds: list[frozenset[str] | None] = [frozenset({"memory"}), frozenset({"example_query"}), None]
    alone = [sorted(delta.search(terms, doc_freq=doc_freq, stats=stats, doc_kinds=k)) for k in kinds]
    assert all(alone) and len(alone[2]) > len(alone[0]) + len(alone[1])
    scored: list[int] = []
    real = Delta._scores
    monkeypatch.setattr(Delta, "_scores", lambda self, *a, **kw: (scored.append(1), real(self, *a, **kw))[1])
    together = [sorted(delta.search(terms, doc_freq=doc_freq, stats=stats, doc_kinds=k, reader=1)) for k in kinds]
    assert together == alone and len(scored) == 1
    # Another reader (or other statistics) scores afresh.
    delta.search(terms, doc_freq=doc_freq, stats=stats, doc_kinds=kinds[0], reader=2)
    assert len(scored) == 2
    # Through the index, whose reader names itself: one scoring for a question's searches of each kind.
    scored.clear()
    for k in kinds:
        assert held.search("refunds supplier ledger weekly", limit=500, doc_kinds=k)
    assert len(scored) == 1


def test_a_dominant_kind_ranks_from_the_unfiltered_query_exactly_as_through_its_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind holding most docs is searched without its kind filter (tantivy can then skip blocks of docs that
    cannot reach the top) and its hits picked from a deeper ranking: the same docs, order and scores as the
    filtered query gives, with many tied scores (repeated texts), docs the delta holds, rewrites and deletes,
    at limits past what the first ranking holds."""
    rng = random.Random(5)
    log = Log()
    texts = [_text(rng) for _ in range(40)]  # (few texts: many docs score alike)
    kinds = ["memory"] * 17 + ["example_query", "column", "model"]
    for n in range(1200):
        log.add(_upsert(f"memory:{n}", rng.choice(texts), seq=n + 1, kind=rng.choice(kinds)))
    index = FulltextIndex(tmp_path / "t", delta_min_docs=100)
    index.catch_up(log.fetch)
    for _ in range(30):
        log.add(_upsert(f"memory:{rng.randrange(1300)}", rng.choice(texts), seq=log.seq + 1, kind=rng.choice(kinds)))
    for _ in range(10):
        log.add(_delete(f"memory:{rng.randrange(1200)}", seq=log.seq + 1))
    assert index.catch_up_in_memory(log.fetch, current_seq=log.seq) is True
    assert len(index._delta) > 0
    questions = [" ".join(rng.sample(WORDS, rng.randint(1, 4))) for _ in range(40)]
    asked = [
        (question, limit, kinds)
        for question in questions
        for limit in (1, 7, 40, 400)
        for kinds in (frozenset({"memory"}), frozenset({"memory", "example_query"}), frozenset({"column"}))
    ]
    monkeypatch.setattr(fulltext, "DOMINANT_SHARE", 2.0)  # never: every kind through its filter
    filtered = [index.search(question, limit=limit, doc_kinds=kinds) for question, limit, kinds in asked]
    monkeypatch.setattr(fulltext, "DOMINANT_SHARE", 0.0)  # always: every kind from the unfiltered ranking
    for margin in (fulltext.DEPTH_MARGIN, 0.05):  # (the second too shallow at first: it must ask deeper)
        monkeypatch.setattr(fulltext, "DEPTH_MARGIN", margin)
        index._doc_ids.clear()
        unfiltered = [index.search(question, limit=limit, doc_kinds=kinds) for question, limit, kinds in asked]
        for (question, limit, kinds), one, other in zip(asked, filtered, unfiltered, strict=True):
            assert one == other, (margin, question, limit, kinds)
    assert sum(len(hits) for hits in filtered) > 1000
