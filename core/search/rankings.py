"""The pieces a search's steps rank with (core.search.service): depths, the head every search reads first,
full-text's memoised rankings of one question, and the ranking helpers (filtered look-ups, min_score)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from core import sql
from core.refs import MEMORY_PREFIX
from core.search.dense import EmbeddingStats
from core.search.filters import EXAMPLE_QUERIES
from core.search.fulltext import ENTITY_KINDS, FulltextIndex
from core.search.index import catch_up, memory_doc_kind

DEPTH_FLOOR = 30
FIRST_LOOK = 2  # a channel first looks this many times a bucket's depth down its ranking
MAX_SCAN = 1000
# A look that came up short goes this much deeper than the share of accepted docs it saw asks for.
DEEPER_MARGIN = 1.5

Ranking = list[tuple[str, float]]
Fetch = Callable[[int], Ranking]
BucketFetch = Callable[[str, int], Ranking]


# Function words of questions (and the pieces contractions leave: "what's" -> "what", "s"): they match
# nearly every note, so full-text ignores them when the question has other words.
QUESTION_STOPWORDS = frozenset(
    "a an and are as at be been but by can could did do does for from had has have he her hers him his how i "
    "if in into is it its me my of on or our she so that the their them they this to was we were what when "
    "where which who whom whose why will with would you your s t d ll re ve m".split()
)
_WORD = re.compile(r"[^\W_]+")


def fulltext_query(question: str) -> str:
    """The question's words without its function words, for full-text.

    Words are split as the index's analyzer splits them (on every non-alphanumeric character), so the
    "in" of "in-process" goes like any other "in". A question of one token (a pasted canonical id such
    as ``shop.orders.country``) is kept as it is: the index also matches it against doc ids. A question
    made only of function words is kept too.
    """
    literal = question.strip()
    if not any(ch.isspace() for ch in literal):
        return literal
    kept = [w for w in _WORD.findall(literal) if w.lower() not in QUESTION_STOPWORDS]
    return " ".join(kept) if kept else question


def bucket_depth(cap: int) -> int:
    """How deep each channel ranks a bucket: a function of that bucket's cap only."""
    return 0 if cap <= 0 else max(2 * cap, DEPTH_FLOOR)


class Memo:
    """A channel's ranking fetched once as deep as any bucket needed it."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._ranking: Ranking = []
        self._limit = 0

    def __call__(self, limit: int) -> Ranking:
        if limit > self._limit and len(self._ranking) >= self._limit:
            self._ranking = self._fetch(limit)
            self._limit = limit
        return self._ranking[:limit]


Keep = Callable[[list[str]], Callable[[str], bool]]


def first_look(depth: int) -> int:
    """How deep a channel first looks down its ranking for ``depth`` accepted docs."""
    return min(FIRST_LOOK * depth, MAX_SCAN)


def deeper_look(look: int, found: int, depth: int) -> int:
    """The next look down a ranking whose first ``look`` docs held ``found`` < ``depth`` accepted ones: deep
    enough for ``depth`` at the share of accepted docs seen so far (with a margin), at least twice as deep, at
    most MAX_SCAN.

    Any look that holds ``depth`` accepted docs picks the same ones, in the same order (a ranking's first n
    docs are the first n of any deeper ranking), so how deep a channel looks changes its cost, not its answer.
    One exception: docs of exactly equal full-text score, of which tantivy's collector keeps a different few
    at a look's cut depending on how deep it was asked to look (a look of 1.5 times the depth changed such a
    cut in 16 of 60 generated questions; two and three times agreed on all). The first look is shallow because
    most searches find their docs in it, and one that came up short (a member's search in a tenant of many
    agents, a filter) goes as deep as the share it saw says."""
    wanted = math.ceil(look * depth / max(found, 1) * DEEPER_MARGIN)
    return min(max(wanted, 2 * look), MAX_SCAN)


def short(ranking: Ranking, look: int, found: int, depth: int) -> bool:
    """Whether a look of ``look`` docs that ``ranking`` filled found too few (``found`` < ``depth``) and the
    ranking may go deeper (it was full and not yet MAX_SCAN deep)."""
    return found < depth and len(ranking) == look < MAX_SCAN


def filtered_ranking(fetch: Fetch, *, keep: Keep, depth: int) -> Ranking:
    """The first ``depth`` docs of a channel's ranking that ``keep`` accepts, at most MAX_SCAN deep."""
    if depth <= 0:
        return []
    limit = first_look(depth)
    while True:
        ranking = fetch(limit)
        accept = keep([doc_id for doc_id, _ in ranking])
        accepted = [(doc_id, score) for doc_id, score in ranking if accept(doc_id)]
        if not short(ranking, limit, len(accepted), depth):
            return accepted[:depth]
        limit = deeper_look(limit, len(accepted), depth)


def above(ranking: Ranking, min_score: float) -> Ranking:
    """The hits scoring at least ``min_score`` (in order)."""
    return [hit for hit in ranking if hit[1] >= min_score] if min_score > 0 else ranking


@dataclass(frozen=True)
class Head:
    """What every search reads first, in one query: the tenant's change seq and catalog version, the
    statistics of its embeddings of the active model, and whether it has a catalog (the full-text index's
    catch-up renders catalog docs only then: core.search.index)."""

    change_seq: int
    catalog_version: int
    embeddings: EmbeddingStats
    memories: int  # active and stale
    has_catalog: bool = False


HEAD_SQL = text(
    "SELECT t.change_seq, (SELECT c.version FROM catalog_state AS c WHERE c.tenant_id = t.id), s.docs, s.version, "
    "(SELECT sum(x.docs)::bigint FROM search_corpus_stats AS x WHERE x.tenant_id = t.id AND x.scope = '' "
    "AND x.status IN ('active', 'stale')), "
    "EXISTS (SELECT 1 FROM catalog_datasources AS d WHERE d.tenant_id = t.id) "
    "FROM tenants AS t LEFT JOIN search_embedding_stats AS s ON s.tenant_id = t.id AND s.model = :model "
    "WHERE t.id = :tenant"
)


def head_query(*, tenant_id: int, model: str | None) -> sql.Query:
    # By the tenant's key: planned once per connection (core.sql).
    return sql.Query("head", lambda: HEAD_SQL, {"tenant": tenant_id, "model": model or ""}, generic=True)


def head_from_rows(rows: Sequence[Any], *, model: str | None) -> Head:
    change_seq, catalog_version, docs, version, memories, has_catalog = rows[0] if rows else (0, 0, 0, 0, 0, False)
    return Head(
        change_seq=int(change_seq or 0),
        catalog_version=int(catalog_version or 0),
        embeddings=EmbeddingStats(model=model, docs=int(docs or 0), version=int(version or 0)),
        memories=int(memories or 0),
        has_catalog=bool(has_catalog),
    )


class FulltextRankings:
    """Channel 2 for one search: rankings of a question by doc kinds, memoised per (kinds, limit).

    The rankings read an index caught up to at least the tenant's change seq (read-your-writes), as
    :meth:`follow` ensures: the rankings already made are kept when the index they came from reflected
    that seq, else dropped and made again.
    """

    def __init__(self, *, tenant_id: int, question: str) -> None:
        self.tenant_id = tenant_id
        self.question = fulltext_query(question)
        self.index: FulltextIndex | None = None
        self._seq = -1  # the change seq the index reflected when the memoised rankings were made
        self._found: dict[tuple[frozenset[str], int], Ranking] = {}
        self._buckets: dict[tuple[str, int], Ranking] = {}

    def follow(self, change_seq: int) -> None:
        if self.index is not None and self._seq >= change_seq:
            return
        self.index = catch_up(tenant_id=self.tenant_id, current_seq=change_seq)
        self._seq = self.index.seq
        self._found.clear()
        self._buckets.clear()

    def kinds(self, kinds: frozenset[str], limit: int) -> Ranking:
        assert self.index is not None
        if (kinds, limit) not in self._found:
            self._found[kinds, limit] = self.index.search(self.question, limit=limit, doc_kinds=kinds)
        return self._found[kinds, limit]

    def bucket(self, bucket: str, limit: int) -> Ranking:
        if (bucket, limit) not in self._buckets:
            hits = self.kinds(frozenset({memory_doc_kind(bucket == EXAMPLE_QUERIES)}), limit)
            self._buckets[bucket, limit] = [(doc_id[len(MEMORY_PREFIX) :], s) for doc_id, s in hits]
        return self._buckets[bucket, limit]

    def first_looks(self, caps: dict[str, int], entity_depth: int) -> None:
        """The first look of every ranking the buckets will ask for (the same calls they make later)."""
        for bucket, cap in caps.items():
            if bucket_depth(cap):
                self.bucket(bucket, first_look(bucket_depth(cap)))
        if entity_depth:
            self.kinds(ENTITY_KINDS, first_look(entity_depth))
