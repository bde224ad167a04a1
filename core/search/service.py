"""Search (CONTRACT section 6, reference search.md): channels, per-bucket fusion, modes, warnings.

Three buckets are ranked independently: ``memories`` (no attached query), ``example_queries``
(query-bearing memories) and ``entities`` (catalog docs). For each bucket every active channel yields
its own ranking of that bucket's eligible docs, to a depth that depends only on the bucket's cap
(``max(2 * cap, 30)``); the rankings are fused into a relevance in [0, 1] (core.search.fusion.relevance:
RRF with k = 60, normalised, lexical channels weighted by their share of the top score, dense blind to
memories without a vector); graph hops lift it (``with_hops``); ``min_score`` then filters and the cap
slices. Graph seeds are a bucket's own fused top hits. So a bucket depends on the corpus, the inputs and
its own cap, never on the other caps.

Channels: 1 entity BM25Plus (when ``entities`` or ``query`` is given), 2 full-text and 3 dense (when a
``question`` is given; dense ranks a memory bucket with the bucket's first ``FEEDBACK_DOCS`` eligible
full-text hits as relevance feedback), 4 graph (when a question is given). Dense failing with a
question present is a warning plus ``degraded``, never an error. Hybrid with no input falls back to
recency with a warning; ``recent`` / ``important`` / ``typed`` are orderings (see core.search.modes).

Channels look past ineligible docs (other agents', filtered out, the other bucket) at most
``MAX_SCAN`` deep each, so a rare bucket cannot make a query scan a whole large corpus.

Round trips: the head (tenant change seq, catalog version, embedding statistics) is one query, sent with
the entity channel's query when there is one (inputs are then resolved with the tenant's last catalog
snapshot and the search starts again if the head shows the catalog moved); the approximate dense query
runs in PostgreSQL while full-text ranks in this process (``DenseSearch.overlapped``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from core.config import get_settings
from core.entities.canonical import CatalogSnapshot, is_memory_ref, memory_id_of, rooted_in
from core.entities.resolver import extract_query_entities, resolve_entities
from core.errors import BadRequest
from core.memories.models import Memory
from core.memories.visibility import visible_clause
from core.refs import MEMORY_PREFIX
from core.search import entity_channel, facts, graph, hits, sql
from core.search.catalog import last_snapshot, load_snapshot, snapshot_memo
from core.search.clock import ChannelClock
from core.search.dense import ENTITIES, DenseSearch, DenseUnavailable, EmbeddingStats, dense_model
from core.search.filters import EXAMPLE_QUERIES, MEMORIES, Eligibility, MemoryFilter, any_of
from core.search.fulltext import ENTITY_KINDS, FulltextIndex
from core.search.fusion import relevance, with_hops
from core.search.index import catch_up, catch_up_before_search, memory_doc_kind
from core.search.modes import ordered_buckets
from core.search.schemas import SearchRequest, SearchResponse
from core.tenancy.context import Caller

DEPTH_FLOOR = 30
FIRST_LOOK = 3  # a channel first looks this many times a bucket's depth down its ranking
MAX_SCAN = 1000
# The dense channel ranks a bucket with feedback from the first eligible full-text hits of that bucket.
FEEDBACK_DOCS = 3
FEEDBACK_FROM, FEEDBACK_TO = "fulltext", "dense"
# Run the approximate dense query in PostgreSQL while full-text ranks here (False: one after the other).
OVERLAP_DENSE = True
FALLBACK_WARNING = "no entities, query or question given; returning the most recent memories"

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


class _Memo:
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


def filtered_ranking(fetch: Fetch, *, keep: Keep, depth: int) -> Ranking:
    """The first ``depth`` docs of a channel's ranking that ``keep`` accepts, at most MAX_SCAN deep."""
    if depth <= 0:
        return []
    limit = min(FIRST_LOOK * depth, MAX_SCAN)
    while True:
        ranking = fetch(limit)
        accept = keep([doc_id for doc_id, _ in ranking])
        picked = [(doc_id, score) for doc_id, score in ranking if accept(doc_id)][:depth]
        if len(picked) >= depth or len(ranking) < limit or limit >= MAX_SCAN:
            return picked
        limit = min(limit * 4, MAX_SCAN)


def above(ranking: Ranking, min_score: float) -> Ranking:
    """The hits scoring at least ``min_score`` (in order)."""
    return [hit for hit in ranking if hit[1] >= min_score] if min_score > 0 else ranking


@dataclass(frozen=True)
class _Head:
    """What every search reads first, in one query: the tenant's change seq and catalog version, and
    the statistics of its embeddings of the active model."""

    change_seq: int
    catalog_version: int
    embeddings: EmbeddingStats
    memories: int  # active and stale


_HEAD_SQL = text(
    "SELECT t.change_seq, (SELECT c.version FROM catalog_state AS c WHERE c.tenant_id = t.id), s.docs, s.version, "
    "(SELECT sum(x.docs) FROM search_corpus_stats AS x WHERE x.tenant_id = t.id AND x.scope = '' "
    "AND x.status IN ('active', 'stale')) "
    "FROM tenants AS t LEFT JOIN search_embedding_stats AS s ON s.tenant_id = t.id AND s.model = :model "
    "WHERE t.id = :tenant"
)


def head_query(*, tenant_id: int, model: str | None) -> sql.Query:
    return "head", lambda: _HEAD_SQL, {"tenant": tenant_id, "model": model or ""}


def head_from_rows(rows: Sequence[Any], *, model: str | None) -> _Head:
    change_seq, catalog_version, docs, version, memories = rows[0] if rows else (0, 0, 0, 0, 0)
    return _Head(
        change_seq=int(change_seq or 0),
        catalog_version=int(catalog_version or 0),
        embeddings=EmbeddingStats(model=model, docs=int(docs or 0), version=int(version or 0)),
        memories=int(memories or 0),
    )


def read_head(session: Session, *, tenant_id: int, model: str | None) -> _Head:
    key, build, values = head_query(tenant_id=tenant_id, model=model)
    return head_from_rows(sql.run(session, key, build, **values), model=model)


# The head this process read last per tenant: what full-text may start from before the head comes back.
_last_heads: dict[int, _Head] = {}
# Run full-text while the head and entity queries are out (False: after them, as the head requires).
EARLY_FULLTEXT = True


class _FulltextRankings:
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
        self._seq = self.index.reader_seq
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
                self.bucket(bucket, min(FIRST_LOOK * bucket_depth(cap), MAX_SCAN))
        if entity_depth:
            self.kinds(ENTITY_KINDS, min(FIRST_LOOK * entity_depth, MAX_SCAN))


class _CatalogMoved(Exception):
    """The catalog snapshot a search guessed is not the one its transaction sees; ``head`` is what it sees."""

    def __init__(self, head: _Head) -> None:
        super().__init__("catalog moved")
        self.head = head


@dataclass
class _Inputs:
    resolved: list[str] = field(default_factory=list)
    bm25_tokens: list[str] = field(default_factory=list)
    entity_refs: list[str] = field(default_factory=list)


class _Search:
    def __init__(self, session: Session, *, caller: Caller, request: SearchRequest, head: _Head | None = None) -> None:
        self.session = session
        self.caller = caller
        self.request = request
        self.response = SearchResponse()
        self.memory_filter = MemoryFilter(
            caller=caller,
            include_stale=request.include_stale,
            kind=request.kind,
            category=request.category,
            occurred_after=request.occurred_after,
            occurred_before=request.occurred_before,
            datasource=request.datasource,
            tags=tuple(sorted(set(request.tags or ()))),
        )
        self.eligibility = Eligibility(session=session, memory_filter=self.memory_filter, facts_source=self._facts)
        self.caps = {MEMORIES: request.max_memories, EXAMPLE_QUERIES: request.max_example_queries}
        # Per memory bucket: the memory ids the dense channel takes as relevant (see _memory_buckets).
        self.feedback: dict[str, list[str]] = {}
        # Memories already read for the hits (with the graph's query), by id.
        self.loaded: dict[str, Memory] = {}
        self.model = dense_model()
        if head is not None:
            self.__dict__["head"] = head
        # The catalog version of a snapshot taken on trust (see _guess_snapshot), until the head confirms it.
        self.guessed_version: int | None = None
        self._ft: _FulltextRankings | None = None
        self._dense: DenseSearch | None = None
        self.clock = ChannelClock()

    @cached_property
    def head(self) -> _Head:
        head = read_head(self.session, tenant_id=self.caller.tenant_id, model=self.model)
        _last_heads[self.caller.tenant_id] = head
        return head

    def _guess_snapshot(self) -> None:
        """Resolve the inputs with the tenant's last snapshot before the head has confirmed its version.

        The head (tenant change seq, catalog version) is then read with the entity channel's query, in
        its round trip; when the version differs (a catalog write since), the search starts again with
        the head it read, so its result is the same as with the head read first.
        """
        if "head" in self.__dict__ or "snapshot" in self.__dict__:
            return
        guess = last_snapshot(self.caller.tenant_id)
        if guess is not None:
            self.guessed_version, self.__dict__["snapshot"] = guess

    def _facts(self) -> facts.TenantFacts | None:
        head = self.head
        return facts.tenant_facts(
            self.session, tenant_id=self.caller.tenant_id, current_seq=head.change_seq, memories=head.memories
        )

    @cached_property
    def snapshot(self) -> CatalogSnapshot:
        return load_snapshot(self.session, tenant_id=self.caller.tenant_id, version=self.head.catalog_version)

    def warn(self, message: str) -> None:
        if message not in self.response.warnings:
            self.response.warnings.append(message)

    def run(self) -> SearchResponse:
        request = self.request
        if request.datasource is not None and request.datasource not in self.snapshot.datasources:
            raise BadRequest(f"unknown datasource '{request.datasource}'", field="datasource")
        if request.mode != "hybrid":
            if request.has_entity_input or request.question_text:
                self.warn(f"mode '{request.mode}' ignores entities, query and question")
            return self._ordered(request.mode)
        if request.has_entity_input:
            # The entity channel's query runs first and always: it confirms the guess (see _guess_snapshot).
            self._guess_snapshot()
        inputs = self._resolve()
        if not request.has_entity_input and not request.question_text:
            self.warn(FALLBACK_WARNING)
            return self._ordered("recent")
        try:
            self._hybrid(inputs)
        except _CatalogMoved as moved:
            return _Search(self.session, caller=self.caller, request=request, head=moved.head).run()
        self.clock.record()
        return self.response

    # -- inputs ---------------------------------------------------------------------------

    def _resolve(self) -> _Inputs:
        request, inputs = self.request, _Inputs()
        raw = list(request.entities or [])
        refs = [memory_id_of(e) for e in raw if isinstance(e, str) and is_memory_ref(e)]
        named = self._named_memories(refs)
        needs_catalog = request.query is not None or any(not (isinstance(e, str) and is_memory_ref(e)) for e in raw)
        snapshot = self.snapshot if needs_catalog else CatalogSnapshot()
        resolution = resolve_entities(snapshot, raw, strict=False, memory_exists=named.__contains__)
        for warning in resolution.warnings:
            self.warn(warning)
        inputs.resolved = list(resolution.entities)
        if request.query:
            extracted = extract_query_entities(snapshot, request.query)
            inputs.resolved += [e for e in extracted.entities if e not in inputs.resolved]
            for warning in extracted.warnings:
                self.warn(warning)
        # A query's fields may name memories too (extract_query_entities keeps memory: refs as they are).
        unseen = [memory_id_of(e) for e in inputs.resolved if is_memory_ref(e) and memory_id_of(e) not in named]
        if unseen:
            named.update(self._named_memories(unseen))
            missing = {e for e in inputs.resolved if is_memory_ref(e) and memory_id_of(e) not in named}
            for entity in sorted(missing):
                self.warn(f"{entity} does not exist; dropped.")
            inputs.resolved = [e for e in inputs.resolved if e not in missing]
        self.response.resolved_input_entities = list(inputs.resolved)
        ds: str | None = request.datasource
        for entity in inputs.resolved:
            if is_memory_ref(entity):
                memory = named[memory_id_of(entity)]
                if ds is not None and not any(rooted_in(entity=e, datasource=ds) for e in memory.entities):
                    self.warn(f"{entity} is not rooted at datasource '{ds}'; dropped.")
                    continue
                stale_warning = hits.stale_query_warning(memory, snapshot=self.snapshot)
                if stale_warning:
                    self.warn(stale_warning)
            elif ds is not None and not rooted_in(entity=entity, datasource=ds):
                self.warn(f"entity '{entity}' is not rooted at datasource '{ds}'; dropped from entities bucket.")
            elif self.snapshot.is_hidden(entity):
                self.warn(f"entity '{entity}' is on a hidden model/column; dropped from entities bucket.")
            else:
                inputs.entity_refs.append(entity)
            inputs.bm25_tokens.append(entity)
        return inputs

    def _named_memories(self, memory_ids: list[str]) -> dict[str, Memory]:
        """Memories named by ``memory:<id>`` refs that exist for this caller (visible, not forgotten)."""
        if not memory_ids:
            return {}
        rows = self.session.scalars(
            select(Memory).where(
                any_of(Memory.id, memory_ids), Memory.status != "forgotten", visible_clause(self.caller)
            )
        ).all()
        return {m.id: m for m in rows}

    # -- hybrid ---------------------------------------------------------------------------

    def _hybrid(self, inputs: _Inputs) -> None:
        request, channels, clock = self.request, self.response.channels, self.clock
        question = request.question_text
        memory_fetch: dict[str, BucketFetch] = {}
        entity_rankings: dict[str, Ranking] = {}
        entity_depth = bucket_depth(request.max_entities)
        if request.has_entity_input:
            channels.entity_bm25 = True
            meanwhile = None
            if question and "head" not in self.__dict__:
                early = self._early_fulltext(question)
                if early is not None:
                    meanwhile = clock.wrap("fulltext", lambda: early.first_looks(self.caps, entity_depth))
            with clock.timing("entity_bm25"):
                bm25, _ = self._entity_bm25(inputs.bm25_tokens, meanwhile=meanwhile)
            # BM25 saw every candidate with its verdict, so its bucket rankings need no deeper look.
            memory_fetch["entity_bm25"] = clock.wrap(
                "entity_bm25", lambda bucket, limit: self.eligibility.pick(bm25, bucket, limit)
            )
            # The named refs in the order given, each fully named (score 1: no share of a top score to lose).
            entity_rankings["entity_bm25"] = [(e, 1.0) for e in inputs.entity_refs][:entity_depth]
        dense: DenseSearch | None = None
        if question:
            channels.fulltext = channels.graph = True
            # The tenant's change seq and the embedding statistics come with the search's first query.
            head = self.head
            try:
                with clock.timing("dense"):
                    dense = DenseSearch(
                        self.session,
                        tenant_id=self.caller.tenant_id,
                        question=question,
                        change_seq=head.change_seq,
                        feedback=self.feedback,
                        stats=head.embeddings,
                    )
            except DenseUnavailable as exc:
                self.warn(str(exc))
                self.response.degraded = True
            ft = self._fulltext(question)
            with clock.timing("fulltext"):
                ft.follow(head.change_seq)
            # While PostgreSQL runs the approximate dense query, full-text runs the first look of every
            # ranking the buckets will ask it for (the same calls they would make, answered from its memo).
            with dense.overlapped() if dense is not None and OVERLAP_DENSE else contextlib.nullcontext():
                with clock.timing("fulltext"):
                    ft.first_looks(self.caps, entity_depth)
            fulltext, search_kinds = clock.wrap("fulltext", ft.bucket), clock.wrap("fulltext", ft.kinds)
            memory_fetch["fulltext"] = fulltext
            if dense is not None:
                channels.dense = True
                dense_rank = clock.wrap("dense", dense.rank)
                memory_fetch["dense"] = dense_rank
            if entity_depth:
                keep = self._entity_keep
                entity_rankings["fulltext"] = filtered_ranking(
                    _Memo(lambda limit: search_kinds(ENTITY_KINDS, limit)), keep=keep, depth=entity_depth
                )
                if dense is not None:
                    entity_rankings["dense"] = filtered_ranking(
                        _Memo(lambda limit: dense_rank(ENTITIES, limit)), keep=keep, depth=entity_depth
                    )
        self._dense = dense
        buckets = self._memory_buckets(memory_fetch)
        blind = {}
        if dense is not None and "dense" in entity_rankings:
            blind["dense"] = dense.blind(ENTITIES, [])
        entities = above(relevance(entity_rankings, blind=blind), request.min_score)[: request.max_entities]
        self._hydrate(buckets, tokens=inputs.bm25_tokens)
        if entities:
            self.response.entities = hits.entity_hits(
                self.session,
                ranked=entities,
                snapshot=self.snapshot,
                tenant_id=self.caller.tenant_id,
                version=self.head.catalog_version,
            )

    def _fulltext(self, question: str) -> _FulltextRankings:
        if self._ft is None:
            self._ft = _FulltextRankings(tenant_id=self.caller.tenant_id, question=question)
        return self._ft

    def _early_fulltext(self, question: str) -> _FulltextRankings | None:
        """Full-text to run while the first round trip is out, when this process saw the tenant's head
        before and the dense channel then took the exact path (the approximate one overlaps full-text with
        its own query instead). The index is caught up to the change seq seen last; :meth:`_FulltextRankings.follow`
        redoes the work if the head shows a newer one."""
        last = _last_heads.get(self.caller.tenant_id)
        if last is None or not EARLY_FULLTEXT:
            return None
        if last.embeddings.docs > get_settings().dense_exact_max_docs:
            return None
        ft = self._fulltext(question)
        ft.follow(last.change_seq)
        return ft

    def _entity_bm25(
        self, tokens: list[str], *, meanwhile: Callable[[], None] | None = None
    ) -> tuple[Ranking, dict[str, list[str]]]:
        """Channel 1's ranking; the head, when not read yet, comes in the same round trip (and ``meanwhile``
        runs while that round trip is out)."""
        tenant_id, eligibility = self.caller.tenant_id, self.eligibility
        queries: list[sql.Query] = []
        if "head" not in self.__dict__:
            queries.append(head_query(tenant_id=tenant_id, model=self.model))
        if tokens:
            queries.append(entity_channel.query(tenant_id=tenant_id, query_entities=tokens, eligibility=eligibility))
        results = sql.run_many(self.session, queries, meanwhile=meanwhile) if queries else []
        if "head" not in self.__dict__:
            head = self.__dict__["head"] = head_from_rows(results.pop(0), model=self.model)
            _last_heads[tenant_id] = head
            if self.guessed_version is not None and head.catalog_version != self.guessed_version:
                raise _CatalogMoved(head)
        return entity_channel.from_rows(results[0] if results else [], query_entities=tokens, eligibility=eligibility)

    def _memory_buckets(self, memory_fetch: dict[str, BucketFetch]) -> dict[str, Ranking]:
        """Each memory bucket fused from every channel's ranking of that bucket's eligible docs.

        Channels rank each bucket on its own (full-text and dense know which memories carry a query).
        A channel's bucket ranking is its first ``depth`` eligible docs among its top MAX_SCAN for that
        bucket; looking ``FIRST_LOOK * depth`` deep first and at MAX_SCAN only when visibility or the
        filters left a bucket short gives the same list. The graph's hops come with their verdicts, so a
        search usually makes one eligibility query (at most two more: a wrong feedback guess, a short
        bucket).
        """
        depths = {bucket: bucket_depth(cap) for bucket, cap in self.caps.items()}
        live = [bucket for bucket, depth in depths.items() if depth]
        out: dict[str, Ranking] = {bucket: [] for bucket in self.caps}
        if not live or not memory_fetch:
            return out
        firsts = {bucket: min(FIRST_LOOK * depths[bucket], MAX_SCAN) for bucket in live}
        # Dense takes feedback from full-text's first eligible hits of the bucket. Their verdicts are not
        # known yet, so dense first ranks with a guess (the first hits not known to be ineligible) and
        # all rankings are checked in one query; only when the guess was wrong does dense rank again
        # with the true feedback (and its new docs are checked), so the result is the same either way.
        deferred = [FEEDBACK_TO] if FEEDBACK_TO in memory_fetch and FEEDBACK_FROM in memory_fetch else []
        rankings = {
            (name, bucket): fetch(bucket, firsts[bucket])
            for name, fetch in memory_fetch.items()
            if name not in deferred
            for bucket in live
        }
        if deferred:
            self.feedback.update({bucket: self._feedback(rankings[FEEDBACK_FROM, bucket], bucket) for bucket in live})
            rankings.update(
                {(name, bucket): memory_fetch[name](bucket, firsts[bucket]) for name in deferred for bucket in live}
            )
        self.eligibility.check(d for ranking in rankings.values() for d, _ in ranking)
        if deferred:
            guessed = dict(self.feedback)
            self.feedback.update({bucket: self._feedback(rankings[FEEDBACK_FROM, bucket], bucket) for bucket in live})
            if self.feedback != guessed:
                rankings.update(
                    {(name, bucket): memory_fetch[name](bucket, firsts[bucket]) for name in deferred for bucket in live}
                )
                self.eligibility.check(d for name in deferred for bucket in live for d, _ in rankings[name, bucket])
        short = [
            (name, bucket)
            for (name, bucket), ranking in rankings.items()
            if len(ranking) == firsts[bucket] < MAX_SCAN
            and len(self._pick(ranking, bucket, depths[bucket])) < depths[bucket]
        ]
        if short:
            rankings.update({key: memory_fetch[key[0]](key[1], MAX_SCAN) for key in short})
            self.eligibility.check(d for key in short for d, _ in rankings[key])
        per_bucket: dict[str, dict[str, Ranking]] = {bucket: {} for bucket in live}
        for (name, bucket), ranking in rankings.items():
            per_bucket[bucket][name] = self._pick(ranking, bucket, depths[bucket])
        fused = {bucket: self._fused(per_bucket[bucket], bucket) for bucket in live}
        min_score = self.request.min_score
        if self.response.channels.graph:
            # Every channel ranked every live bucket, so the seeds are the fused ranking's first.
            seeds = {bucket: [d for d, _ in fused[bucket][: graph.SEEDS]] for bucket in live}
            seed_scores = {bucket: dict(fused[bucket][: graph.SEEDS]) for bucket in live}
            # A new ranking only raises the fused score of the docs it holds, so a bucket's final hits are
            # among its top hits without the graph and the graph's hops: the former are loaded with the
            # graph's query, in the same round trip (the latter, rarely needed, when hydrating).
            likely = [d for bucket in live for d, _ in fused[bucket][: self.caps[bucket]]]
            with self.clock.timing("graph"):
                edges, rows = sql.run_many(
                    self.session,
                    [
                        graph.query(seeds=seeds, eligibility=self.eligibility),
                        hits.memories_query(tenant_id=self.caller.tenant_id, memory_ids=likely),
                    ],
                )
                hops = graph.from_rows(edges, seeds=seeds, eligibility=self.eligibility, seed_scores=seed_scores)
            self.loaded.update(hits.memories_from_rows(rows))
            self.eligibility.check(d for ranking in hops.values() for d, _ in ranking)
            for bucket in live:
                fused[bucket] = with_hops(fused[bucket], self._pick(hops[bucket], bucket, depths[bucket]))
        for bucket in live:
            out[bucket] = above(fused[bucket], min_score)[: self.caps[bucket]]
        return out

    def _fused(self, rankings: dict[str, Ranking], bucket: str) -> Ranking:
        """A bucket's direct channels fused into relevance; dense does not count against a memory it has no
        vector of (a fresh save is first for its own words before its embedding lands)."""
        blind = {}
        if "dense" in rankings and self._dense is not None:
            candidates = sorted({d for ranking in rankings.values() for d, _ in ranking})
            blind["dense"] = self._dense.blind(bucket, candidates)
        return relevance(rankings, blind=blind)

    def _feedback(self, ranking: Ranking, bucket: str) -> list[str]:
        """The first FEEDBACK_DOCS docs of a ranking that are in the bucket or not yet checked."""
        known, verdict, picked = self.eligibility.known, self.eligibility.bucket, []
        for d, _ in ranking:
            if not known(d) or verdict(d) == bucket:
                picked.append(d)
                if len(picked) == FEEDBACK_DOCS:
                    break
        return picked

    def _pick(self, ranking: Ranking, bucket: str, depth: int) -> Ranking:
        return self.eligibility.pick(ranking, bucket, depth)

    def _entity_keep(self, doc_ids: list[str]) -> Callable[[str], bool]:
        ds, snapshot = self.request.datasource, self.snapshot
        # Whether a catalog doc exists and is not hidden is a function of the snapshot: memoised on it.
        shown: dict[str, bool] = snapshot_memo(snapshot).setdefault("shown", {})

        def accept(doc_id: str) -> bool:
            if ds is not None and not rooted_in(entity=doc_id, datasource=ds):
                return False
            verdict = shown.get(doc_id)
            if verdict is None:
                verdict = shown[doc_id] = snapshot.contains(doc_id) and not snapshot.is_hidden(doc_id)
            return verdict

        return accept

    # -- output ---------------------------------------------------------------------------

    def _ordered(self, mode: str) -> SearchResponse:
        buckets = ordered_buckets(self.session, memory_filter=self.memory_filter, mode=mode, caps=self.caps)
        buckets = {bucket: above(ranking, self.request.min_score) for bucket, ranking in buckets.items()}
        self._hydrate(buckets, tokens=[])
        return self.response

    def _hydrate(self, buckets: dict[str, Ranking], *, tokens: list[str]) -> None:
        ids = [doc_id for ranking in buckets.values() for doc_id, _ in ranking]
        memories = {memory_id: self.loaded[memory_id] for memory_id in ids if memory_id in self.loaded}
        missing = [memory_id for memory_id in ids if memory_id not in memories]
        memories.update(hits.load_memories(self.session, tenant_id=self.caller.tenant_id, memory_ids=missing))
        matched = {
            memory_id: [t for t in tokens if t in (memory.entities or []) or t == MEMORY_PREFIX + memory_id]
            for memory_id, memory in memories.items()
        }
        self.response.memories = hits.memory_hits(  # type: ignore[assignment]
            ranked=buckets.get(MEMORIES, []), memories=memories, bucket=MEMORIES, matched=matched
        )
        self.response.example_queries = hits.memory_hits(  # type: ignore[assignment]
            ranked=buckets.get(EXAMPLE_QUERIES, []),
            memories=memories,
            bucket=EXAMPLE_QUERIES,
            matched=matched,
        )
        for hit in self.response.example_queries:
            warning = hits.stale_query_warning(memories[hit.id], snapshot=self.snapshot)
            if warning:
                self.warn(warning)


def search(session: Session, *, caller: Caller, request: SearchRequest) -> SearchResponse:
    """Run one search for ``caller`` in the caller's session (read-only)."""
    request.check()
    if request.mode == "hybrid" and request.question_text:
        # Full-text catches up before the session takes its connection: waiting for the index lock then
        # holds no connection or transaction, and the catch-up's own connection is the only one in use.
        catch_up_before_search(caller.tenant_id)
    session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    return _Search(session, caller=caller, request=request).run()
