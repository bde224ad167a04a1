"""Recent changes a full-text index holds in memory, on top of its committed tantivy reader.

A tantivy commit costs ~8 ms of CPU and ~12 ms of wall time whatever it holds (measured: a one-doc commit
with its merges, against ~0.1 ms to search), and a search that found the index behind used to wait for
one. Under a stream of saves that was a commit per handful of searches, each serialised behind the last.
So a large enough index (core.search.fulltext) keeps the changes after its reader here instead, and
commits them to tantivy in one go once they are many (a *fold*).

A search then reads both: the committed reader's hits, without the docs the delta changed or deleted, and
the delta's own docs scored here with the reader's BM25 exactly as tantivy scores its own (the same
statistics, the same one-byte field-length scale, the same float32 arithmetic), so a fresh save ranks
where it will rank once committed. The statistics are the committed reader's: the few docs of the delta
are not counted in them, as a commit would count them. That is the one approximation, and it is bounded
by how many docs a delta may hold before it is folded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.search.fulltext import DocChange

# How many searches' scores a delta keeps (see Delta.search): a question's searches of each doc kind follow
# one another, so a few cover the searches running at once.
_SCORED_KEPT = 8
# tantivy's BM25 constants.
K1 = np.float32(1.2)
B = np.float32(0.75)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
# Field lengths below this are stored exactly; above, on a log scale of 4 significant bits (one byte).
_EXACT_LENGTHS = 24


def _int4_to_long(code: int) -> int:
    mantissa, shift = code & 0x07, (code >> 3) - 1
    return mantissa if shift < 0 else (mantissa | 0x08) << shift


def _long_to_int4(value: int) -> int:
    bits = value.bit_length()
    if bits < 4:
        return value
    shift = bits - 4
    return ((value >> shift) & 0x07) | ((shift + 1) << 3)


def fieldnorm(length: int) -> int:
    """The field length BM25 sees for a doc of ``length`` tokens: tantivy stores it in one byte (exact up
    to 23, then rounded down to 4 significant bits), so scores use that rounded length."""
    if length < _EXACT_LENGTHS:
        return length
    code = min(_EXACT_LENGTHS + _long_to_int4(length - _EXACT_LENGTHS), 255)
    return _EXACT_LENGTHS + _int4_to_long(code - _EXACT_LENGTHS)


@dataclass(frozen=True)
class Bm25Stats:
    """What tantivy's BM25 reads of a reader for one field: its doc count (deleted docs included, as
    tantivy counts them) and its average field length."""

    docs: int
    average_length: float

    @classmethod
    def from_explanation(cls, explanation: str) -> Bm25Stats | None:
        """Read N and avgdl off a tantivy TermQuery explanation (its JSON), None when it has none."""
        docs = average = None
        stack = [json.loads(explanation)]
        while stack:
            node = stack.pop()
            description = str(node.get("description", ""))
            if description.startswith("N,"):
                docs = int(node["value"])
            elif description.startswith("avgdl"):
                average = float(node["value"])
            stack.extend(node.get("details") or [])
        if docs is None or average is None or docs <= 0 or average <= 0:
            return None
        return cls(docs=docs, average_length=average)


def idf(doc_freq: int, docs: int) -> np.float32:
    """tantivy's idf, in float32: ln(1 + (N - n + 0.5) / (n + 0.5))."""
    x = (np.float32(max(docs - doc_freq, 0)) + _HALF) / (np.float32(doc_freq) + _HALF)
    return np.float32(math.log(float(_ONE + x)))


@dataclass(frozen=True)
class DeltaDoc:
    change: DocChange
    length: int  # analysed tokens of its text
    terms: frozenset[str]  # its distinct terms
    norm: int  # the length BM25 sees (fieldnorm)


@dataclass(frozen=True)
class Delta:
    """The changes after ``base_seq`` (the reader's seq) up to ``seq``, latest per doc; immutable (a search
    holds the one it started with while catch-ups publish new ones)."""

    base_seq: int
    seq: int
    docs: Mapping[str, DeltaDoc] = field(default_factory=dict)
    # term -> {doc_id: term frequency}, over the docs that are not deleted.
    postings: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # How many of the docs the committed reader also holds (an older version): a search asks the reader
    # for that many more hits, since those are dropped from its ranking.
    shadowed: int = 0
    # Scores of every kind per (reader, terms, statistics, exact id), the last few searches' (see search).
    _scored: dict[Hashable, dict[str, float]] = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.docs)

    def held_after(self, changes: Iterable[DocChange]) -> int:
        """How many docs this delta would hold with ``changes`` merged, counted without analysing any text."""
        return len(self.docs) + len({c.doc_id for c in changes if c.seq > self.seq and c.doc_id not in self.docs})

    def merged(
        self,
        changes: Iterable[DocChange],
        *,
        upto_seq: int,
        analyze: Callable[[str], list[str]],
        in_reader: Callable[[str], bool],
    ) -> Delta:
        """This delta with ``changes`` applied (those at or below its seq are skipped; the latest change of a
        doc wins) and its seq moved to ``upto_seq``."""
        latest: dict[str, DocChange] = {}
        for change in changes:
            if change.seq <= self.seq:
                continue
            previous = latest.get(change.doc_id)
            if previous is None or change.seq >= previous.seq:
                latest[change.doc_id] = change
        if not latest:
            return Delta(self.base_seq, max(self.seq, upto_seq), self.docs, self.postings, self.shadowed)
        docs = dict(self.docs)
        # Copy on write: the postings of the terms these changes touch are copied, the rest shared.
        postings = dict(self.postings)
        copied: dict[str, dict[str, int]] = {}

        def writable(term: str) -> dict[str, int]:
            found = copied.get(term)
            if found is None:
                found = copied[term] = dict(postings.get(term, {}))
                postings[term] = found
            return found

        shadowed = self.shadowed
        for doc_id, change in latest.items():
            old = docs.get(doc_id)
            if old is not None:
                for term in old.terms:
                    writable(term).pop(doc_id, None)
            else:
                shadowed += 1 if in_reader(doc_id) else 0
            tokens = [] if change.deleted else analyze(change.text or "")
            counts: dict[str, int] = {}
            for term in tokens:
                counts[term] = counts.get(term, 0) + 1
            docs[doc_id] = DeltaDoc(
                change=change, length=len(tokens), terms=frozenset(counts), norm=fieldnorm(len(tokens))
            )
            for term, tf in counts.items():
                writable(term)[doc_id] = tf
        for term, found in copied.items():
            if not found:
                del postings[term]
        return Delta(self.base_seq, max(self.seq, upto_seq), docs, postings, shadowed)

    def after(self, seq: int, *, in_reader: Callable[[str], bool]) -> Delta:
        """What is left once the reader reflects ``seq`` (a commit, here or by another process): the docs
        changed after it."""
        if seq <= self.base_seq:
            return self
        kept = {doc_id: doc for doc_id, doc in self.docs.items() if doc.change.seq > seq}
        postings: dict[str, dict[str, int]] = {}
        for term, found in self.postings.items():
            still = {doc_id: tf for doc_id, tf in found.items() if doc_id in kept}
            if still:
                postings[term] = still
        shadowed = sum(1 for doc_id in kept if in_reader(doc_id))
        return Delta(seq, max(self.seq, seq), kept, postings, shadowed)

    def changes(self) -> list[DocChange]:
        return [doc.change for doc in self.docs.values()]

    def search(
        self,
        terms: list[str],
        *,
        doc_freq: Callable[[str], int],
        stats: Bm25Stats,
        doc_kinds: frozenset[str] | set[str] | None,
        exact_id: tuple[str, float, int] | None = None,
        reader: Hashable | None = None,
    ) -> list[tuple[str, float]]:
        """The delta's docs of ``doc_kinds`` matching any of ``terms`` (or whose id is ``exact_id``'s: the id, its
        boost and its document frequency in the reader), scored as tantivy scores a boolean OR of term queries:
        the sum of each matching term's BM25 in float32, plus the exact id clause (its boost times the id's idf).
        ``doc_freq`` is a term's document frequency in the reader.

        ``reader`` names the reader ``doc_freq`` and ``stats`` come from: the scores of every kind are then kept
        with the delta, so the searches of one question for each doc kind score its docs once."""
        key = None if reader is None else (reader, tuple(terms), stats, exact_id)
        scores = None if key is None else self._scored.get(key)
        if scores is None:
            scores = self._scores(terms, doc_freq=doc_freq, stats=stats, exact_id=exact_id)
            if key is not None:
                if len(self._scored) >= _SCORED_KEPT:
                    self._scored.clear()
                self._scored[key] = scores
        if doc_kinds is None:
            return list(scores.items())
        docs = self.docs
        return [(doc_id, score) for doc_id, score in scores.items() if docs[doc_id].change.doc_kind in doc_kinds]

    def _scores(
        self,
        terms: list[str],
        *,
        doc_freq: Callable[[str], int],
        stats: Bm25Stats,
        exact_id: tuple[str, float, int] | None,
    ) -> dict[str, float]:
        # Every (term, doc) pair matched, term by term, scored in float32 arrays: each operation rounds to
        # float32 as tantivy's own arithmetic does, and each doc's terms are summed in the query's order.
        ids: list[str] = []
        freqs: list[int] = []
        weights: list[np.float32] = []
        counts: list[int] = []
        for term in terms:
            found = self.postings.get(term)
            if not found:
                continue
            weights.append(idf(doc_freq(term), stats.docs) * (_ONE + K1))
            counts.append(len(found))
            ids.extend(found)
            freqs.extend(found.values())
        at: dict[str, int] = {}
        scores = np.zeros(0, dtype=np.float32)
        if ids:
            docs = self.docs
            freq = np.array(freqs, dtype=np.float32)
            lengths = np.array([docs[doc_id].norm for doc_id in ids], dtype=np.float32)
            norm = K1 * ((_ONE - B) + (B * lengths) / np.float32(stats.average_length))
            matched = np.repeat(np.array(weights, dtype=np.float32), counts) * (freq / (freq + norm))
            where = np.array([at.setdefault(doc_id, len(at)) for doc_id in ids], dtype=np.intp)
            scores = np.zeros(len(at), dtype=np.float32)
            start = 0
            for count in counts:  # term by term (a doc once per term): a doc's first term lands on 0, exactly
                end = start + count
                scores[where[start:end]] += matched[start:end]
                start = end
        if exact_id is not None:
            doc_id, boost, id_freq = exact_id
            named = self.docs.get(doc_id)
            if named is not None and not named.change.deleted:
                # One doc_id token per doc: its length factor is exactly 1, its score idf x (1 + K1) x
                # 1 / (1 + K1), boosted.
                weight = idf(id_freq, stats.docs) * (_ONE + K1) * np.float32(boost)
                exact = weight * (_ONE / (_ONE + K1))
                if doc_id in at:
                    scores[at[doc_id]] += exact
                else:
                    at[doc_id] = len(at)
                    scores = np.append(scores, exact)
        return dict(zip(at, scores.tolist(), strict=True))
