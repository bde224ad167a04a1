"""Entity BM25Plus equals rank_bm25.BM25Plus on the docs that share an entity with the query,
also after incremental adds, updates and removes, and returns no doc without overlap."""

from __future__ import annotations

import random

import pytest
from rank_bm25 import BM25Plus

from core.search.entity_bm25 import EntityStats, StatsSnapshot, memory_tokens, ranked, score


def _oracle(docs: dict[str, list[str]], query: list[str]) -> dict[str, float]:
    ids = list(docs)
    scores = BM25Plus([docs[doc_id] for doc_id in ids]).get_scores(query)
    return {doc_id: float(s) for doc_id, s in zip(ids, scores, strict=True)}


def _check(stats: EntityStats, docs: dict[str, list[str]], query: list[str]) -> None:
    got = score(stats, query_entities=query, candidate_postings=stats.postings(query))
    oracle = _oracle(docs, query)
    overlapping = {doc_id for doc_id, tokens in docs.items() if set(tokens) & set(query)}
    assert set(got) == overlapping
    for doc_id, value in got.items():
        assert value == pytest.approx(oracle[doc_id], abs=1e-9)
    # Ordering: every returned doc outranks every doc without overlap in the oracle too.
    if got and len(overlapping) < len(docs):
        floor = max(oracle[d] for d in docs if d not in overlapping)
        assert min(got.values()) > floor


def _random_docs(rng: random.Random, *, n: int, vocab: list[str], start: int = 0) -> dict[str, list[str]]:
    docs = {}
    for i in range(start, start + n):
        entities = rng.sample(vocab, rng.randint(0, 4))
        if rng.random() < 0.1 and entities:
            entities.append(entities[0])  # a repeated tag counts twice, as in rank_bm25
        docs[str(i)] = memory_tokens(str(i), entities)
    return docs


@pytest.mark.parametrize("seed", range(20))
def test_matches_rank_bm25_after_incremental_changes(seed: int) -> None:
    rng = random.Random(seed)
    vocab = [f"ds{rng.randint(0, 2)}.m{j}.c{rng.randint(0, 3)}" for j in range(15)] + ["ds0", "ds1.m1"]
    docs = _random_docs(rng, n=rng.randint(1, 40), vocab=vocab)
    stats = EntityStats()
    for doc_id, tokens in docs.items():
        stats.add_doc(doc_id, tokens)
    for step in range(30):
        action = rng.random()
        if action < 0.35:
            new = _random_docs(rng, n=1, vocab=vocab, start=1000 + step)
            docs.update(new)
            for doc_id, tokens in new.items():
                stats.add_doc(doc_id, tokens)
        elif action < 0.6 and len(docs) > 1:
            victim = rng.choice(sorted(docs))
            del docs[victim]
            stats.remove_doc(victim)
        else:
            target = rng.choice(sorted(docs))
            docs[target] = memory_tokens(target, rng.sample(vocab, rng.randint(0, 5)))
            stats.update_doc(target, docs[target])
        query = rng.choices(vocab + ["unknown.entity"], k=rng.randint(1, 4))
        if rng.random() < 0.3:
            query.append(f"memory:{rng.choice(sorted(docs))}")
        _check(stats, docs, query)


def test_stats_equal_a_fresh_build_after_changes() -> None:
    stats = EntityStats()
    stats.add_doc("1", ["a", "b"])
    stats.add_doc("2", ["b"])
    stats.update_doc("1", ["c"])
    stats.remove_doc("2")
    stats.remove_doc("missing")
    fresh = EntityStats()
    fresh.add_doc("1", ["c"])
    assert (stats.corpus_size, stats.total_len, stats.doc_freq, stats.doc_len) == (
        fresh.corpus_size,
        fresh.total_len,
        fresh.doc_freq,
        fresh.doc_len,
    )


@pytest.mark.parametrize(
    ("query", "expected_ids"),
    [
        ([], set()),
        (["nobody.has.this"], set()),
        (["memory:2"], {"2"}),  # the implicit self reference surfaces the named memory
        (["db.orders"], {"1", "2"}),
        (["db.orders", "db.orders"], {"1", "2"}),
    ],
)
def test_only_overlapping_docs_are_hits(query: list[str], expected_ids: set[str]) -> None:
    stats = EntityStats()
    stats.add_doc("1", memory_tokens("1", ["db.orders", "db.orders.amount"]))
    stats.add_doc("2", memory_tokens("2", ["db.orders"]))
    stats.add_doc("3", memory_tokens("3", ["db.customers"]))
    assert set(score(stats, query_entities=query, candidate_postings=stats.postings(query))) == expected_ids


def test_repeated_query_entity_counts_twice() -> None:
    docs = {"1": ["a", "b"], "2": ["b"], "3": ["c"]}
    stats = EntityStats()
    for doc_id, tokens in docs.items():
        stats.add_doc(doc_id, tokens)
    twice = score(stats, query_entities=["a", "a"], candidate_postings=stats.postings(["a"]))
    assert twice["1"] == pytest.approx(_oracle(docs, ["a", "a"])["1"], abs=1e-12)


def test_snapshot_from_storage_needs_only_query_rows() -> None:
    """Scoring from a partial snapshot (as read from indexed tables) equals the full stats."""
    stats = EntityStats()
    for doc_id, tokens in {"1": ["a", "b"], "2": ["b", "c", "d"], "3": ["e"]}.items():
        stats.add_doc(doc_id, tokens)
    query = ["b"]
    postings = stats.postings(query)
    snapshot = StatsSnapshot(
        corpus_size=stats.corpus_size,
        total_len=stats.total_len,
        doc_freq={"b": stats.doc_freq["b"]},
        doc_len={doc_id: stats.doc_len[doc_id] for doc_id in postings["b"]},
    )
    assert score(snapshot, query_entities=query, candidate_postings=postings) == score(
        stats, query_entities=query, candidate_postings=postings
    )


def test_ranked_breaks_ties_by_id() -> None:
    assert ranked({"b": 1.0, "a": 1.0, "c": 2.0}) == [("c", 2.0), ("a", 1.0), ("b", 1.0)]


def test_empty_corpus_scores_nothing() -> None:
    assert score(EntityStats(), query_entities=["a"], candidate_postings={}) == {}
