"""Entity-overlap BM25Plus over a tenant's memories, scored from indexed statistics.

Each memory is a document whose tokens are its canonical entity tags plus the implicit self
reference ``memory:<id>`` (see :func:`memory_tokens`). Scores equal ``rank_bm25.BM25Plus``
(k1=1.5, b=0.75, delta=1) over the same token lists, but a query only needs:

* the corpus size N and the total token count (for avgdl),
* the document frequency of each query entity,
* the postings of the query entities (doc id -> term frequency) and those docs' lengths.

All of these are small, indexable numbers, so a query never loads the corpus.

BM25Plus and zero-overlap documents. rank_bm25 adds ``idf(q) * delta`` for every query term to
*every* document, including those with tf = 0. That part is the same constant C for all docs, so

    score(d) = C + sum over q with tf(q, d) > 0 of idf(q) * tf*(k1+1) / (k1*(1-b+b*|d|/avgdl) + tf)

and a doc that shares at least one entity with the query scores strictly above C (idf > 0 always,
as df <= N). We return exactly rank_bm25's score for docs with overlap and omit the others: they
all tie at C, and the entity channel's hits are, by definition, the docs with overlap.
Query entities absent from the corpus have idf 0 (rank_bm25 does ``idf.get(q) or 0``) and add
nothing; a query entity repeated n times counts n times.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from core.refs import memory_ref

K1 = 1.5
B = 0.75
DELTA = 1.0


def memory_tokens(memory_id: str, entities: Iterable[str]) -> list[str]:
    """The BM25 tokens of a memory: its canonical entity tags plus its self reference."""
    return [*entities, memory_ref(memory_id)]


class CorpusStats(Protocol):
    """What scoring reads. Satisfied by :class:`EntityStats` and by :class:`StatsSnapshot`."""

    @property
    def corpus_size(self) -> int: ...

    @property
    def total_len(self) -> int: ...

    @property
    def doc_freq(self) -> Mapping[str, int]: ...

    @property
    def doc_len(self) -> Mapping[str, int]: ...


@dataclass(frozen=True)
class StatsSnapshot:
    """Statistics read from storage for one query: only the query entities' df and the
    candidates' lengths need to be present."""

    corpus_size: int
    total_len: int
    doc_freq: Mapping[str, int]
    doc_len: Mapping[str, int]


@dataclass
class EntityStats:
    """Incrementally maintained BM25 statistics of one corpus (a tenant, or a tenant restricted
    to one datasource scope). Also keeps each doc's term counts so ``remove_doc`` needs only the id,
    and can hand out postings for tests and small in-process corpora."""

    corpus_size: int = 0
    total_len: int = 0
    doc_freq: dict[str, int] = field(default_factory=dict)
    doc_len: dict[str, int] = field(default_factory=dict)
    _doc_terms: dict[str, Counter[str]] = field(default_factory=dict, repr=False)

    def add_doc(self, doc_id: str, entities: Iterable[str]) -> None:
        """Add a doc with these tokens (use :func:`memory_tokens` for memories); re-adding replaces."""
        if doc_id in self._doc_terms:
            self.remove_doc(doc_id)
        terms = Counter(entities)
        length = sum(terms.values())
        self._doc_terms[doc_id] = terms
        self.doc_len[doc_id] = length
        self.corpus_size += 1
        self.total_len += length
        for term in terms:
            self.doc_freq[term] = self.doc_freq.get(term, 0) + 1

    def remove_doc(self, doc_id: str) -> None:
        """Remove a doc; unknown ids are ignored so replayed deletes are harmless."""
        terms = self._doc_terms.pop(doc_id, None)
        if terms is None:
            return
        self.corpus_size -= 1
        self.total_len -= self.doc_len.pop(doc_id)
        for term in terms:
            remaining = self.doc_freq[term] - 1
            if remaining:
                self.doc_freq[term] = remaining
            else:
                del self.doc_freq[term]

    def update_doc(self, doc_id: str, entities: Iterable[str]) -> None:
        """Replace a doc's tokens (an upsert)."""
        self.add_doc(doc_id, entities)

    def postings(self, entities: Iterable[str]) -> dict[str, dict[str, int]]:
        """entity -> {doc_id: tf} for the given entities (a linear scan: tests, small corpora)."""
        wanted = set(entities)
        result: dict[str, dict[str, int]] = {entity: {} for entity in wanted}
        for doc_id, terms in self._doc_terms.items():
            for entity in wanted.intersection(terms):
                result[entity][doc_id] = terms[entity]
        return result


def idf(stats: CorpusStats, entity: str) -> float:
    """rank_bm25's BM25Plus idf, log((N + 1) / df); 0 for an entity no doc carries."""
    df = stats.doc_freq.get(entity, 0)
    return math.log((stats.corpus_size + 1) / df) if df else 0.0


def score(
    stats: CorpusStats,
    *,
    query_entities: list[str],
    candidate_postings: Mapping[str, Mapping[str, int]],
    k1: float = K1,
    b: float = B,
    delta: float = DELTA,
) -> dict[str, float]:
    """BM25Plus scores, equal to rank_bm25's, of every doc sharing at least one query entity.

    ``candidate_postings`` maps each query entity to the docs carrying it and their term
    frequency; entities missing from it have no postings. Docs without overlap are not returned.
    """
    if stats.corpus_size == 0 or not query_entities:
        return {}
    avgdl = stats.total_len / stats.corpus_size
    candidates = {doc_id for entity in query_entities for doc_id in candidate_postings.get(entity, {})}
    idfs = {entity: idf(stats, entity) for entity in set(query_entities)}
    scores: dict[str, float] = {}
    # Each query entity's idf and postings, looked up once per query instead of once per candidate.
    terms = [(idfs[entity], candidate_postings.get(entity, {})) for entity in query_entities]
    doc_len = stats.doc_len
    for doc_id in candidates:
        norm = k1 * (1 - b + b * doc_len[doc_id] / avgdl)
        total = 0.0
        # Same term order and operation order as rank_bm25, so results agree to the last bits.
        for entity_idf, postings in terms:
            tf = postings.get(doc_id, 0)
            total += entity_idf * (delta + (tf * (k1 + 1)) / (norm + tf))
        scores[doc_id] = total
    return scores


def ranked(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """Scores as a ranking: highest first, ties broken by doc id so the order is deterministic."""
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))
