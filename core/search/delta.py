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
from dataclasses import dataclass, field, replace
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


# Small integer codes of doc kinds (a handful in all), so a search filters its held hits by kind in numpy.
_KIND_CODES: dict[str, int] = {}


def _kind_code(kind: str) -> int:
    return _KIND_CODES.setdefault(kind, len(_KIND_CODES))


_NO_NORMS = np.zeros(0, dtype=np.float32)
_NO_KINDS = np.zeros(0, dtype=np.int16)


@dataclass(frozen=True)
class Delta:
    """The changes after ``base_seq`` (the reader's seq) up to ``seq``, latest per doc; immutable (a search
    holds the one it started with while catch-ups publish new ones).

    Each doc keeps a slot (its place in ``order``, ``norms`` and ``kinds``) until the delta is folded, and the
    postings name docs by slot: a search scores and filters its matches over arrays, with no Python per doc."""

    base_seq: int
    seq: int
    docs: Mapping[str, DeltaDoc] = field(default_factory=dict)
    # term -> {slot: term frequency}, over the docs that are not deleted.
    postings: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    # How many of the docs the committed reader also holds (an older version): a search asks the reader
    # for that many more hits, since those are dropped from its ranking.
    shadowed: int = 0
    # doc id -> slot; slot -> doc id; per slot, the length BM25 sees and the doc kind's code.
    slots: Mapping[str, int] = field(default_factory=dict)
    order: tuple[str, ...] = ()
    norms: np.ndarray = field(default_factory=lambda: _NO_NORMS, compare=False, repr=False)
    kinds: np.ndarray = field(default_factory=lambda: _NO_KINDS, compare=False, repr=False)
    # The doc kinds among the docs (or once among them): a search of other kinds has nothing to score here.
    kind_names: frozenset[str] = frozenset()
    # Scores per (reader, terms, statistics, exact id), the last few searches' (see search): the slots of the
    # matched docs and every slot's score.
    _scored: dict[Hashable, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, compare=False, repr=False)

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
            return replace(self, seq=max(self.seq, upto_seq), _scored={})
        docs = dict(self.docs)
        slots = dict(self.slots)
        order = list(self.order)
        added = sum(1 for doc_id in latest if doc_id not in slots)
        norms = np.concatenate((self.norms, np.zeros(added, dtype=np.float32)))
        kinds = np.concatenate((self.kinds, np.zeros(added, dtype=np.int16)))
        # Copy on write: the postings of the terms these changes touch are copied, the rest shared.
        postings = dict(self.postings)
        copied: dict[str, dict[int, int]] = {}

        def writable(term: str) -> dict[int, int]:
            found = copied.get(term)
            if found is None:
                found = copied[term] = dict(postings.get(term, {}))
                postings[term] = found
            return found

        shadowed = self.shadowed
        for doc_id, change in latest.items():
            old = docs.get(doc_id)
            slot = slots.get(doc_id)
            if slot is None:
                slot = slots[doc_id] = len(order)
                order.append(doc_id)
            if old is not None:
                for term in old.terms:
                    writable(term).pop(slot, None)
            else:
                shadowed += 1 if in_reader(doc_id) else 0
            tokens = [] if change.deleted else analyze(change.text or "")
            counts: dict[str, int] = {}
            for term in tokens:
                counts[term] = counts.get(term, 0) + 1
            doc = docs[doc_id] = DeltaDoc(
                change=change, length=len(tokens), terms=frozenset(counts), norm=fieldnorm(len(tokens))
            )
            norms[slot] = doc.norm
            kinds[slot] = _kind_code(change.doc_kind)
            for term, tf in counts.items():
                writable(term)[slot] = tf
        for term, found in copied.items():
            if not found:
                del postings[term]
        return Delta(
            self.base_seq,
            max(self.seq, upto_seq),
            docs,
            postings,
            shadowed,
            slots,
            tuple(order),
            norms,
            kinds,
            self.kind_names.union(change.doc_kind for change in latest.values()),
        )

    def after(self, seq: int, *, in_reader: Callable[[str], bool]) -> Delta:
        """What is left once the reader reflects ``seq`` (a commit, here or by another process): the docs
        changed after it."""
        if seq <= self.base_seq:
            return self
        order = tuple(doc_id for doc_id in self.order if self.docs[doc_id].change.seq > seq)
        slots = {doc_id: slot for slot, doc_id in enumerate(order)}
        kept = {doc_id: self.docs[doc_id] for doc_id in order}
        moved = {self.slots[doc_id]: slot for doc_id, slot in slots.items()}
        postings: dict[str, dict[int, int]] = {}
        for term, found in self.postings.items():
            still = {moved[old]: tf for old, tf in found.items() if old in moved}
            if still:
                postings[term] = still
        old_slots = np.array([self.slots[doc_id] for doc_id in order], dtype=np.intp)
        shadowed = sum(1 for doc_id in kept if in_reader(doc_id))
        return Delta(
            seq,
            max(self.seq, seq),
            kept,
            postings,
            shadowed,
            slots,
            order,
            self.norms[old_slots],
            self.kinds[old_slots],
            frozenset(doc.change.doc_kind for doc in kept.values()),
        )

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
        limit: int | None = None,
    ) -> list[tuple[str, float]]:
        """The delta's docs of ``doc_kinds`` matching any of ``terms`` (or whose id is ``exact_id``'s: the id, its
        boost and its document frequency in the reader), scored as tantivy scores a boolean OR of term queries:
        the sum of each matching term's BM25 in float32, plus the exact id clause (its boost times the id's idf).
        ``doc_freq`` is a term's document frequency in the reader. In no particular order; with ``limit``, docs
        scoring below the ``limit``-th best are left out (they cannot be among the best ``limit``).

        ``reader`` names the reader ``doc_freq`` and ``stats`` come from: the scores of every kind are then kept
        with the delta, so the searches of one question for each doc kind score its docs once."""
        if doc_kinds is not None and self.kind_names.isdisjoint(doc_kinds):
            return []
        key = None if reader is None else (reader, tuple(terms), stats, exact_id)
        scored = None if key is None else self._scored.get(key)
        if scored is None:
            scored = self._scores(terms, doc_freq=doc_freq, stats=stats, exact_id=exact_id)
            if key is not None:
                if len(self._scored) >= _SCORED_KEPT:
                    self._scored.clear()
                self._scored[key] = scored
        matched, scores = scored
        if doc_kinds is not None and not self.kind_names <= doc_kinds:
            wanted = np.zeros(len(_KIND_CODES), dtype=bool)
            wanted[[_KIND_CODES[kind] for kind in doc_kinds if kind in _KIND_CODES]] = True
            matched = matched[wanted[self.kinds[matched]]]
        found = scores[matched]
        if limit is not None and len(found) > limit:
            kept = found >= np.partition(found, len(found) - limit)[len(found) - limit]
            matched, found = matched[kept], found[kept]
        return list(zip(map(self.order.__getitem__, matched.tolist()), found.tolist(), strict=True))

    def _scores(
        self,
        terms: list[str],
        *,
        doc_freq: Callable[[str], int],
        stats: Bm25Stats,
        exact_id: tuple[str, float, int] | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The slots of the docs matched (ascending) and every slot's score (0 where none matched)."""
        # Every (term, doc) pair matched, term by term, scored in float32 arrays: each operation rounds to
        # float32 as tantivy's own arithmetic does, and each doc's terms are summed in the query's order.
        scores = np.zeros(len(self.order), dtype=np.float32)
        hit = np.zeros(len(self.order), dtype=bool)
        slots: list[np.ndarray] = []
        freqs: list[np.ndarray] = []
        weights: list[np.float32] = []
        counts: list[int] = []
        for term in terms:
            found = self.postings.get(term)
            if not found:
                continue
            weights.append(idf(doc_freq(term), stats.docs) * (_ONE + K1))
            counts.append(len(found))
            slots.append(np.fromiter(found.keys(), dtype=np.intp, count=len(found)))
            freqs.append(np.fromiter(found.values(), dtype=np.float32, count=len(found)))
        if counts:
            where = np.concatenate(slots)
            freq = np.concatenate(freqs)
            norm = K1 * ((_ONE - B) + (B * self.norms[where]) / np.float32(stats.average_length))
            matched = np.repeat(np.array(weights, dtype=np.float32), counts) * (freq / (freq + norm))
            start = 0
            for term_slots in slots:  # term by term (a doc once per term): a doc's first term lands on 0, exactly
                end = start + len(term_slots)
                scores[term_slots] += matched[start:end]
                start = end
            hit[where] = True
        if exact_id is not None:
            doc_id, boost, id_freq = exact_id
            named = self.docs.get(doc_id)
            if named is not None and not named.change.deleted:
                # One doc_id token per doc: its length factor is exactly 1, its score idf x (1 + K1) x
                # 1 / (1 + K1), boosted.
                weight = idf(id_freq, stats.docs) * (_ONE + K1) * np.float32(boost)
                slot = self.slots[doc_id]
                scores[slot] += weight * (_ONE / (_ONE + K1))
                hit[slot] = True
        return np.flatnonzero(hit), scores
