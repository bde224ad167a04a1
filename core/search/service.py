"""Search (CONTRACT section 6, reference search.md): channels, per-bucket fusion, modes, warnings.

Three buckets are ranked independently: ``memories`` (no attached query), ``example_queries``
(query-bearing memories) and ``entities`` (catalog docs). For each bucket every active channel yields
its own ranking of that bucket's eligible docs, to a depth that depends only on the bucket's cap
(``max(2 * cap, 30)``); the rankings are fused into a relevance in [0, 1] (core.search.fusion.relevance:
RRF with k = 60, normalised, each vote scaled by the evidence its hit carries, dense blind to
memories without a vector); graph hops lift it (``with_hops``), and so do replies: the memory after a hit
that asks something, in its episode (core.search.replies); a question naming someone re-scores the first
``depth`` hits by the names their own text says (core.search.names); ``min_score`` then filters and the cap
slices.
Graph seeds and the hits whose replies count are a bucket's own fused top hits. So a bucket depends on the
corpus, the inputs and its own cap, never on the other caps.

Channels: 1 entity BM25Plus (when ``entities`` or ``query`` is given), 2 full-text and 3 dense (when a
``question`` is given; dense ranks a memory bucket with the bucket's first ``FEEDBACK_DOCS`` eligible
full-text hits as relevance feedback), 4 graph (when a question is given). Dense failing with a
question present is a warning plus ``degraded``, never an error. Hybrid with no input falls back to
recency with a warning; ``recent`` / ``important`` / ``typed`` are orderings (see core.search.modes).

Channels look past ineligible docs (other agents', filtered out, the other bucket) at most
``MAX_SCAN`` deep each, so a rare bucket cannot make a query scan a whole large corpus.

The search is a short sequence of steps over one explicit ``SearchState`` (``run_search``), each a
function a test can call: ``resolve_inputs`` -> ``open_channels`` -> ``memory_candidates`` (every
channel's first look at every bucket) -> ``eligible_candidates`` -> ``fuse`` (relevance, graph hops,
``min_score``, caps) -> ``hydrate``. To change the ranking, change ``fuse``; to add a channel, record its
ranking function in ``open_channels``.

Round trips: the head (tenant change seq, catalog version, embedding statistics) is one query, sent with
the entity channel's query when there is one (inputs are then resolved with the tenant's last catalog
snapshot, and ``run_search`` starts again with the head it read if that shows the catalog moved; the memories
the entities name come in that round trip too, see ``_named_with_the_head``); the approximate dense query
runs in PostgreSQL while full-text ranks in this process (``DenseSearch.overlapped``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

from sqlalchemy.orm import Session

from core import sql
from core.config import get_settings
from core.db import read_one_snapshot
from core.entities.canonical import CatalogSnapshot, is_memory_ref, memory_id_of, rooted_in
from core.entities.render import render_memory
from core.entities.resolver import extract_query_entities, resolve_entities
from core.errors import BadRequest
from core.memories.models import Memory
from core.refs import MEMORY_PREFIX
from core.search import entity_channel, facts, feeds, graph, hits, replies
from core.search.catalog import last_snapshot, load_snapshot, snapshot_memo
from core.search.clock import ChannelClock
from core.search.dense import (
    ENTITIES,
    DenseSearch,
    DenseUnavailable,
    dense_model,
    held_layout_seq,
)
from core.search.filters import EXAMPLE_QUERIES, MEMORIES, Eligibility, MemoryFilter
from core.search.fulltext import ENTITY_KINDS
from core.search.fusion import relevance, with_hops
from core.search.index import catch_up_before_search, catch_up_in, held_seq, is_open
from core.search.modes import ordered_buckets
from core.search.names import question_names, with_names
from core.search.rankings import (
    BucketFetch,
    FulltextRankings,
    Head,
    Keep,
    Memo,
    Ranking,
    above,
    bucket_depth,
    deeper_look,
    filtered_ranking,
    first_look,
    head_from_rows,
    head_query,
    short,
)
from core.search.schemas import SearchRequest, SearchResponse
from core.tenancy.context import Caller

_doc_id = itemgetter(0)  # of a ranking's (doc id, score)
# The dense channel ranks a bucket with feedback from the first eligible full-text hits of that bucket.
FEEDBACK_DOCS = 3
FEEDBACK_FROM, FEEDBACK_TO = "fulltext", "dense"
# Run the approximate dense query in PostgreSQL while full-text ranks here (False: one after the other).
OVERLAP_DENSE = True
FALLBACK_WARNING = "no entities, query or question given; returning the most recent memories"

# The head this process read last per tenant: what full-text may start from before the head comes back.
_last_heads: dict[int, Head] = {}
# The tenants whose last head read here had moved since the one before (their writes stream in): their next
# search reads its caches' change feeds ahead, in the head's round trip (see _head_queries).
_moving: set[int] = set()
# Read the change feeds ahead with the head while a tenant's writes stream in (False: each in its own round trip),
# for the caches at most AHEAD_SPAN changes behind the last head read.
READ_AHEAD = True
AHEAD_SPAN = 1000
# An entity search naming memories (``memory:<id>``) reads them with the head and the entity channel's query, its
# tokens taken as if every named memory existed (see _named_with_the_head); off: in a round trip before them.
NAMED_AHEAD = True
# Run full-text while the head and entity queries are out (False: after them, as the head requires).
EARLY_FULLTEXT = True


@dataclass
class Inputs:
    resolved: list[str] = field(default_factory=list)
    bm25_tokens: list[str] = field(default_factory=list)
    entity_refs: list[str] = field(default_factory=list)


@dataclass
class SearchState:
    """What one search knows, filled in by the steps in the order ``run_search`` calls them.

    inputs (``resolve_inputs``) -> channels opened (``open_channels``) -> candidates per channel and bucket
    (``memory_candidates``) -> eligible candidates (``eligible_candidates``) -> fused rankings (``fuse``) ->
    hits (``hydrate``). ``head`` and ``snapshot`` are read on first need (``head_of``, ``snapshot_of``) unless
    a step filled them earlier from a round trip it made anyway.
    """

    session: Session
    caller: Caller
    request: SearchRequest
    memory_filter: MemoryFilter
    eligibility: Eligibility
    caps: dict[str, int]
    model: str | None
    response: SearchResponse = field(default_factory=SearchResponse)
    clock: ChannelClock = field(default_factory=ChannelClock)
    head: Head | None = None
    snapshot: CatalogSnapshot | None = None
    # The catalog version of a snapshot taken on trust (see guess_snapshot), until the head confirms it.
    guessed_version: int | None = None
    inputs: Inputs = field(default_factory=Inputs)
    fulltext: FulltextRankings | None = None
    dense: DenseSearch | None = None
    # Channels ranking the memory buckets by the question alone, in fusion order (dense comes after them).
    memory_fetch: dict[str, BucketFetch] = field(default_factory=dict)
    # Dense's ranking of a memory bucket with that bucket's feedback (None: dense did not run).
    dense_fetch: Callable[[str, int, Sequence[str]], Ranking] | None = None
    entity_rankings: dict[str, Ranking] = field(default_factory=dict)
    # Per memory bucket: the memory ids the dense channel takes as relevant (see memory_candidates).
    feedback: dict[str, list[str]] = field(default_factory=dict)
    # Each channel's ranking of each live memory bucket, eligible or not: {(channel, bucket): ranking}.
    candidates: dict[tuple[str, str], Ranking] = field(default_factory=dict)
    # Per live memory bucket, per channel: its first ``bucket_depth`` eligible docs.
    eligible: dict[str, dict[str, Ranking]] = field(default_factory=dict)
    # Final rankings: per memory bucket (min_score and cap applied), and the entities bucket.
    buckets: dict[str, Ranking] = field(default_factory=dict)
    entities: Ranking = field(default_factory=list)
    # Memories already read for the hits (with the graph's query), by id.
    loaded: dict[str, Memory] = field(default_factory=dict)
    # Whether the full-text index is to be caught up to the head's change seq when the head is read (see search).
    catch_up: bool = False
    # Whether the search's transaction has ended (its COMMIT sent with the graph's query; see fuse).
    ended: bool = False
    # The change feeds read ahead with the head (see _head_queries): "fulltext", "facts", "dense".
    fed: dict[str, facts.Fed] = field(default_factory=dict)
    # The feeds the head's statement is sent with: each cache's name and the change seq it stands at.
    ahead: dict[str, int] = field(default_factory=dict)
    # The memory ids an entity search names, read with the head (see _named_with_the_head) and not yet resolved.
    named_ahead: list[str] | None = None

    def warn(self, message: str) -> None:
        if message not in self.response.warnings:
            self.response.warnings.append(message)

    def live(self) -> list[str]:
        """The memory buckets with a nonzero cap."""
        return [bucket for bucket, cap in self.caps.items() if bucket_depth(cap)]


class CatchUpFirst(Exception):
    """The full-text index cannot reach the head's change seq without waiting (see search)."""


def new_state(
    session: Session, *, caller: Caller, request: SearchRequest, head: Head | None = None, catch_up: bool = False
) -> SearchState:
    memory_filter = MemoryFilter(
        caller=caller,
        include_stale=request.include_stale,
        kind=request.kind,
        category=request.category,
        occurred_after=request.occurred_after,
        occurred_before=request.occurred_before,
        datasource=request.datasource,
        tags=tuple(sorted(set(request.tags or ()))),
    )
    state = SearchState(
        session=session,
        caller=caller,
        request=request,
        memory_filter=memory_filter,
        eligibility=Eligibility(session=session, memory_filter=memory_filter),
        caps={MEMORIES: request.max_memories, EXAMPLE_QUERIES: request.max_example_queries},
        model=dense_model(),
        head=head,
        catch_up=catch_up,
    )
    state.eligibility.facts_source = lambda: _facts(state)
    return state


def head_of(state: SearchState) -> Head:
    if state.head is None:
        _head_read(state, sql.run_many(state.session, _head_queries(state)))
    assert state.head is not None
    return state.head


def _head_queries(state: SearchState) -> list[sql.Query]:
    """The head's statement; while the tenant's writes stream in, also the change feeds of the caches the search
    catches up to the head (the full-text index, when this search does, the tenant's facts and its dense
    layout), after where this process's copies stand (core.search.feeds): what their catch-ups would read
    next, in this round trip instead of one each. Each cache checks that the feed covers where it stands
    before it uses it; with no write since, they come back empty.

    Writes stream in when the head moved between this process's last two reads of it, or when a cache still
    stands behind the last head read (a search that read it is catching up: this one may find the cache as it
    was, and would read its own feed)."""
    tenant_id = state.caller.tenant_id
    queries = [head_query(tenant_id=tenant_id, model=state.model)]
    state.ahead = {}
    if READ_AHEAD and (last := _last_heads.get(tenant_id)) is not None:
        model = state.model if state.request.question_text else None  # (dense runs only for a question)
        points = {
            feeds.FULLTEXT: held_seq(tenant_id) if state.catch_up else None,
            feeds.FACTS: facts.held_seq(tenant_id),
            feeds.DENSE: None if model is None else held_layout_seq(tenant_id, model),
        }
        # (A cache far behind, one no search has caught up for long, reads its own feed if it needs it.)
        reach = last.change_seq - AHEAD_SPAN
        ahead = {name: since for name, since in points.items() if since is not None and since >= reach}
        if ahead and (tenant_id in _moving or min(ahead.values()) < last.change_seq):
            state.ahead = ahead
            queries.extend(feeds.queries(tenant_id, ahead))
    return queries


def _head_read(state: SearchState, results: list[Sequence[Any]]) -> None:
    """Record the head the search read (``results``: those of :func:`_head_queries`, in order) and the feeds
    read with it; catch the full-text index up to its change seq when asked to."""
    tenant_id = state.caller.tenant_id
    state.head = head = head_from_rows(results[0], model=state.model)
    if state.ahead:
        state.fed = feeds.split(state.ahead, results[1:], change_seq=head.change_seq, has_catalog=head.has_catalog)
    previous = _last_heads.get(tenant_id)
    _last_heads[tenant_id] = head
    if previous is not None and head.change_seq != previous.change_seq:
        _moving.add(tenant_id)
    else:
        _moving.discard(tenant_id)
    if state.catch_up:
        state.catch_up = False
        if not catch_up_in(state.session, tenant_id, current_seq=head.change_seq, fed=state.fed.get("fulltext")):
            raise CatchUpFirst


def snapshot_of(state: SearchState) -> CatalogSnapshot:
    if state.snapshot is None:
        version = head_of(state).catalog_version
        state.snapshot = load_snapshot(state.session, tenant_id=state.caller.tenant_id, version=version)
    return state.snapshot


def _facts(state: SearchState) -> facts.TenantFacts | None:
    head = head_of(state)
    return facts.tenant_facts(
        state.session,
        tenant_id=state.caller.tenant_id,
        current_seq=head.change_seq,
        memories=head.memories,
        fed=state.fed.get("facts"),
    )


def guess_snapshot(state: SearchState) -> None:
    """Resolve the inputs with the tenant's last snapshot before the head has confirmed its version.

    The head (tenant change seq, catalog version) is then read with the entity channel's query, in its
    round trip; when the version differs (a catalog write since), the search starts again with the head
    it read (``run_search``), so its result is the same as with the head read first.
    """
    if state.head is not None or state.snapshot is not None:
        return
    guess = last_snapshot(state.caller.tenant_id)
    if guess is not None:
        state.guessed_version, state.snapshot = guess


def run_search(session: Session, *, caller: Caller, request: SearchRequest, catch_up: bool = False) -> SearchState:
    """Run the steps of one search; start again with the head it read when the catalog moved under a guess.

    ``catch_up``: bring the full-text index up to the head's change seq as soon as the head is read, in this
    transaction; raises CatchUpFirst when that would have to wait."""
    head: Head | None = None
    while True:
        state = new_state(session, caller=caller, request=request, head=head, catch_up=catch_up)
        catch_up = False  # a restart keeps the head it read, so the index is caught up already
        moved = _run_steps(state)
        if moved is None:
            return state
        head = moved


def _run_steps(state: SearchState) -> Head | None:
    """The search's steps in order; returns the head read when the guessed catalog snapshot was wrong."""
    request = state.request
    if request.datasource is not None and request.datasource not in snapshot_of(state).datasources:
        raise BadRequest(f"unknown datasource '{request.datasource}'", field="datasource")
    if request.mode != "hybrid":
        if request.has_entity_input or request.question_text:
            state.warn(f"mode '{request.mode}' ignores entities, query and question")
        ordered(state, request.mode)
        return None
    if request.has_entity_input:
        # The entity channel's query runs first and always: it confirms the guess (see guess_snapshot).
        guess_snapshot(state)
    if not _named_with_the_head(state):
        resolve_inputs(state)
    if not request.has_entity_input and not request.question_text:
        state.warn(FALLBACK_WARNING)
        ordered(state, "recent")
        return None
    moved = open_channels(state)
    if moved is not None:
        return moved
    memory_candidates(state)
    eligible_candidates(state)
    fuse(state)
    hydrate(state)
    state.clock.record()
    return None


# -- inputs ---------------------------------------------------------------------------


def _named_refs(request: SearchRequest) -> list[str]:
    """The ids of the memories the request's entities name (``memory:<id>``)."""
    return [memory_id_of(e) for e in request.entities or () if isinstance(e, str) and is_memory_ref(e)]


def _needs_catalog(request: SearchRequest) -> bool:
    return request.query is not None or any(
        not (isinstance(e, str) and is_memory_ref(e)) for e in request.entities or ()
    )


def _named_with_the_head(state: SearchState) -> bool:
    """Take the inputs of an entity search naming memories as if every named memory existed, and leave reading
    them to the round trip of the head and the entity channel (:func:`_entity_bm25`, which resolves the inputs
    then and ranks again in the rare case a named memory is not there): one round trip less. Only where the
    named memories decide nothing but whether they exist (no datasource scope to check them against, no query
    whose fields may name more) and the catalog the other entities resolve against is at hand."""
    request = state.request
    refs = _named_refs(request)
    if not (NAMED_AHEAD and refs and state.head is None and request.datasource is None and request.query is None):
        return False
    if state.snapshot is None and _needs_catalog(request):
        return False
    snapshot = state.snapshot if state.snapshot is not None else CatalogSnapshot()
    resolution = resolve_entities(snapshot, list(request.entities or []), strict=False, memory_exists=lambda _: True)
    state.inputs = Inputs(bm25_tokens=list(resolution.entities))
    state.named_ahead = refs
    return True


def resolve_inputs(state: SearchState, named: dict[str, Memory] | None = None) -> Inputs:
    """The request's entities and query resolved against the catalog (and named memories, read here unless
    given), with warnings."""
    request, inputs = state.request, Inputs()
    raw = list(request.entities or [])
    if named is None:
        named = _named_memories(state, _named_refs(request))
    snapshot = snapshot_of(state) if _needs_catalog(request) else CatalogSnapshot()
    resolution = resolve_entities(snapshot, raw, strict=False, memory_exists=named.__contains__)
    for warning in resolution.warnings:
        state.warn(warning)
    inputs.resolved = list(resolution.entities)
    if request.query:
        extracted = extract_query_entities(snapshot, request.query)
        inputs.resolved += [e for e in extracted.entities if e not in inputs.resolved]
        for warning in extracted.warnings:
            state.warn(warning)
    # A query's fields may name memories too (extract_query_entities keeps memory: refs as they are).
    unseen = [memory_id_of(e) for e in inputs.resolved if is_memory_ref(e) and memory_id_of(e) not in named]
    if unseen:
        named.update(_named_memories(state, unseen))
        missing = {e for e in inputs.resolved if is_memory_ref(e) and memory_id_of(e) not in named}
        for entity in sorted(missing):
            state.warn(f"{entity} does not exist; dropped.")
        inputs.resolved = [e for e in inputs.resolved if e not in missing]
    state.response.resolved_input_entities = list(inputs.resolved)
    ds: str | None = request.datasource
    for entity in inputs.resolved:
        if is_memory_ref(entity):
            memory = named[memory_id_of(entity)]
            if ds is not None and not any(rooted_in(entity=e, datasource=ds) for e in memory.entities):
                state.warn(f"{entity} is not rooted at datasource '{ds}'; dropped.")
                continue
            stale_warning = hits.stale_query_warning(memory, snapshot=snapshot_of(state))
            if stale_warning:
                state.warn(stale_warning)
        elif ds is not None and not rooted_in(entity=entity, datasource=ds):
            state.warn(f"entity '{entity}' is not rooted at datasource '{ds}'; dropped from entities bucket.")
        elif snapshot_of(state).is_hidden(entity):
            state.warn(f"entity '{entity}' is on a hidden model/column; dropped from entities bucket.")
        else:
            inputs.entity_refs.append(entity)
        inputs.bm25_tokens.append(entity)
    state.inputs = inputs
    return inputs


def _named_memories(state: SearchState, memory_ids: list[str]) -> dict[str, Memory]:
    """Memories named by ``memory:<id>`` refs that exist for this caller (visible, not forgotten)."""
    if not memory_ids:
        return {}
    query = hits.visible_memories_query(caller=state.caller, memory_ids=memory_ids)
    return hits.memories_from_rows(sql.run(state.session, query))


# -- channels -------------------------------------------------------------------------


def open_channels(state: SearchState) -> Head | None:
    """Run what each active channel needs up front and record how it ranks each bucket: the entity channel's
    query (with the head when not read yet), the dense channel (its approximate query overlapping full-text's
    first looks) and full-text. Entity rankings are made here; memory buckets are ranked by the next steps.

    Returns the head when it shows the guessed catalog snapshot was wrong (the search must start again).
    """
    request, channels, clock = state.request, state.response.channels, state.clock
    question = request.question_text
    entity_depth = bucket_depth(request.max_entities)
    if request.has_entity_input:
        channels.entity_bm25 = True
        meanwhile = None
        if question and state.head is None:
            early = _early_fulltext(state, question)
            if early is not None:
                meanwhile = clock.wrap("fulltext", lambda: early.first_looks(state.caps, entity_depth))
        with clock.timing("entity_bm25"):
            bm25, moved = _entity_bm25(state, state.inputs.bm25_tokens, meanwhile=meanwhile)
        if moved is not None:
            return moved
        eligibility = state.eligibility
        # BM25 saw every candidate with its verdict, so its bucket rankings need no deeper look.
        state.memory_fetch["entity_bm25"] = clock.wrap(
            "entity_bm25", lambda bucket, limit: eligibility.pick(bm25, bucket, limit)
        )
        # The named refs in the order given, each fully named (score 1: no share of a top score to lose).
        state.entity_rankings["entity_bm25"] = [(e, 1.0) for e in state.inputs.entity_refs][:entity_depth]
    if not question:
        return None
    channels.fulltext = channels.graph = True
    # The tenant's change seq and the embedding statistics come with the search's first query.
    head = head_of(state)
    dense: DenseSearch | None = None
    try:
        with clock.timing("dense"):
            dense = DenseSearch(
                state.session,
                tenant_id=state.caller.tenant_id,
                question=question,
                change_seq=head.change_seq,
                stats=head.embeddings,
                fed=state.fed.get("dense"),
            )
    except DenseUnavailable as exc:
        state.warn(str(exc))
        state.response.degraded = True
    ft = _fulltext(state, question)
    with clock.timing("fulltext"):
        ft.follow(head.change_seq)
    # While PostgreSQL runs the approximate dense query, full-text runs the first look of every ranking
    # the buckets will ask it for (the same calls they would make, answered from its memo).
    with dense.overlapped() if dense is not None and OVERLAP_DENSE else contextlib.nullcontext():
        with clock.timing("fulltext"):
            ft.first_looks(state.caps, entity_depth)
    fulltext, search_kinds = clock.wrap("fulltext", ft.bucket), clock.wrap("fulltext", ft.kinds)
    state.memory_fetch["fulltext"] = fulltext
    if dense is not None:
        channels.dense = True
        state.dense = dense
        state.dense_fetch = clock.wrap("dense", dense.rank)
    if entity_depth:
        keep = _entity_keep(state)
        state.entity_rankings["fulltext"] = filtered_ranking(
            Memo(lambda limit: search_kinds(ENTITY_KINDS, limit)), keep=keep, depth=entity_depth
        )
        if dense is not None:
            dense_rank = clock.wrap("dense", dense.rank)
            state.entity_rankings["dense"] = filtered_ranking(
                Memo(lambda limit: dense_rank(ENTITIES, limit)), keep=keep, depth=entity_depth
            )
    return None


def _fulltext(state: SearchState, question: str) -> FulltextRankings:
    if state.fulltext is None:
        state.fulltext = FulltextRankings(tenant_id=state.caller.tenant_id, question=question)
    return state.fulltext


def _early_fulltext(state: SearchState, question: str) -> FulltextRankings | None:
    """Full-text to run while the first round trip is out, when this process saw the tenant's head before
    and the dense channel then took the exact path (the approximate one overlaps full-text with its own
    query instead). The index is caught up to the change seq seen last; :meth:`FulltextRankings.follow`
    redoes the work if the head shows a newer one."""
    last = _last_heads.get(state.caller.tenant_id)
    if last is None or not EARLY_FULLTEXT:
        return None
    if last.embeddings.docs > get_settings().dense_exact_max_docs:
        return None
    ft = _fulltext(state, question)
    ft.follow(last.change_seq)
    return ft


def _entity_bm25(
    state: SearchState, tokens: list[str], *, meanwhile: Callable[[], None] | None = None
) -> tuple[Ranking, Head | None]:
    """Channel 1's ranking; the head, when not read yet, comes in the same round trip (and ``meanwhile`` runs
    while that round trip is out). Second: the head read, when it shows the guessed snapshot was wrong."""
    eligibility, first = state.eligibility, state.head is None
    queries = _head_queries(state) if first else []
    ahead = len(queries)
    if tokens:
        queries.append(entity_channel.query(query_entities=tokens, eligibility=eligibility))
    named_ahead, state.named_ahead = state.named_ahead, None
    if named_ahead:
        queries.append(hits.visible_memories_query(caller=state.caller, memory_ids=named_ahead))
    results = sql.run_many(state.session, queries, meanwhile=meanwhile) if queries else []
    if first:
        _head_read(state, results[:ahead])
        head = head_of(state)
        if state.guessed_version is not None and head.catalog_version != state.guessed_version:
            return [], head
    rows = results[ahead] if tokens else []
    if named_ahead:
        # The inputs resolved with the named memories read (warnings and all, as resolve_inputs gives them); when
        # one is missing its token goes, and the channel ranks again with those that are left.
        resolve_inputs(state, named=hits.memories_from_rows(results[-1]))
        if state.inputs.bm25_tokens != tokens:
            tokens = state.inputs.bm25_tokens
            query = entity_channel.query(query_entities=tokens, eligibility=eligibility)
            rows = sql.run_many(state.session, [query])[0] if tokens else []
    ranking = entity_channel.from_rows(rows, query_entities=tokens, eligibility=eligibility)
    return ranking, None


def _entity_keep(state: SearchState) -> Keep:
    ds, snapshot = state.request.datasource, snapshot_of(state)
    # Whether a catalog doc exists and is not hidden is a function of the snapshot: memoised on it.
    shown: dict[str, bool] = snapshot_memo(snapshot).setdefault("shown", {})

    def keep(doc_ids: list[str]) -> Callable[[str], bool]:
        def accept(doc_id: str) -> bool:
            if ds is not None and not rooted_in(entity=doc_id, datasource=ds):
                return False
            verdict = shown.get(doc_id)
            if verdict is None:
                verdict = shown[doc_id] = snapshot.contains(doc_id) and not snapshot.is_hidden(doc_id)
            return verdict

        return accept

    return keep


# -- candidates, eligibility ----------------------------------------------------------


def _first_look(state: SearchState, bucket: str) -> int:
    return first_look(bucket_depth(state.caps[bucket]))


def _rank(state: SearchState, channel: str, bucket: str, limit: int) -> Ranking:
    """One channel's ranking of a memory bucket; dense ranks with the bucket's current feedback."""
    if channel == FEEDBACK_TO and state.dense_fetch is not None:
        return state.dense_fetch(bucket, limit, state.feedback.get(bucket, ()))
    return state.memory_fetch[channel](bucket, limit)


def _channels(state: SearchState) -> list[str]:
    """The channels ranking memory buckets, in fusion order."""
    return list(state.memory_fetch) + ([FEEDBACK_TO] if state.dense_fetch is not None else [])


def memory_candidates(state: SearchState) -> dict[tuple[str, str], Ranking]:
    """Every channel's first look at every live memory bucket (``FIRST_LOOK * depth`` deep), eligible or not.

    Dense takes feedback from full-text's first eligible hits of the bucket. Their verdicts are not known
    yet, so dense first ranks with a guess (the first hits not known to be ineligible); the next step
    checks the guess and, only when it was wrong, has dense rank again with the true feedback.
    """
    live = state.live()
    if not live or not state.memory_fetch:
        return state.candidates
    candidates = state.candidates
    for channel in state.memory_fetch:
        for bucket in live:
            candidates[channel, bucket] = _rank(state, channel, bucket, _first_look(state, bucket))
    if state.dense_fetch is not None:
        if state.eligibility.in_memory():
            # Verdicts cost no query: full-text's are known before dense ranks, so its feedback is no guess
            # (and dense never ranks a bucket twice). The next step checks these candidates anyway.
            state.eligibility.check(map(_doc_id, chain.from_iterable(candidates[FEEDBACK_FROM, b] for b in live)))
        state.feedback.update({bucket: _feedback(state, candidates[FEEDBACK_FROM, bucket], bucket) for bucket in live})
        for bucket in live:
            candidates[FEEDBACK_TO, bucket] = _rank(state, FEEDBACK_TO, bucket, _first_look(state, bucket))
    return candidates


def eligible_candidates(state: SearchState) -> dict[str, dict[str, Ranking]]:
    """Per live memory bucket and channel: the first ``depth`` eligible docs among the channel's top MAX_SCAN.

    One eligibility query checks every candidate; dense ranks again when its feedback guess was wrong, and a
    channel whose first look left a bucket short (visibility, filters) looks deeper (``deeper_look``) until it
    holds them or reached MAX_SCAN, which gives the same list as looking that deep at once (but for which docs of
    exactly equal full-text score make a cut: see ``deeper_look``). So a search usually makes one eligibility query
    here.
    """
    live, candidates, eligibility = state.live(), state.candidates, state.eligibility
    if not candidates:
        return state.eligible
    eligibility.check(map(_doc_id, chain.from_iterable(candidates.values())))
    if state.dense_fetch is not None:
        guessed = dict(state.feedback)
        state.feedback.update({bucket: _feedback(state, candidates[FEEDBACK_FROM, bucket], bucket) for bucket in live})
        if state.feedback != guessed:
            for bucket in live:
                candidates[FEEDBACK_TO, bucket] = _rank(state, FEEDBACK_TO, bucket, _first_look(state, bucket))
            eligibility.check(d for bucket in live for d, _ in candidates[FEEDBACK_TO, bucket])
    depths = {bucket: bucket_depth(state.caps[bucket]) for bucket in live}
    looks = {key: _first_look(state, key[1]) for key in candidates}
    # (A pick shorter than the depth holds every eligible doc of its look: the share a deeper look goes by.)
    picked = {key: eligibility.pick(ranking, key[1], depths[key[1]]) for key, ranking in candidates.items()}

    def lacking(keys: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        return [key for key in keys if short(candidates[key], looks[key], len(picked[key]), depths[key[1]])]

    deepen = lacking(candidates)
    while deepen:
        for key in deepen:
            looks[key] = deeper_look(looks[key], len(picked[key]), depths[key[1]])
            candidates[key] = _rank(state, key[0], key[1], looks[key])
        eligibility.check(d for key in deepen for d, _ in candidates[key])
        # (Verdicts already known do not change, so only the deeper rankings are picked again.)
        picked.update({key: eligibility.pick(candidates[key], key[1], depths[key[1]]) for key in deepen})
        deepen = lacking(deepen)
    state.eligible = {bucket: {} for bucket in live}
    for channel, bucket in candidates:
        state.eligible[bucket][channel] = picked[channel, bucket]
    return state.eligible


def _feedback(state: SearchState, ranking: Ranking, bucket: str) -> list[str]:
    """The first FEEDBACK_DOCS docs of a ranking that are in the bucket or not yet checked."""
    known, verdict, picked = state.eligibility.known, state.eligibility.bucket, []
    for d, _ in ranking:
        if not known(d) or verdict(d) == bucket:
            picked.append(d)
            if len(picked) == FEEDBACK_DOCS:
                break
    return picked


# -- fusion ---------------------------------------------------------------------------


def fuse(state: SearchState) -> dict[str, Ranking]:
    """Each bucket's eligible rankings fused into relevance, lifted by graph hops from its fused top hits and
    by the replies to the questions among its first ``cap`` hits, its first ``depth`` hits re-scored by the
    question's names (core.search.names), then ``min_score`` and the cap; the entities bucket likewise
    (without hops or names)."""
    request, eligibility = state.request, state.eligibility
    out: dict[str, Ranking] = {bucket: [] for bucket in state.caps}
    live = list(state.eligible)
    fused = _fused_buckets(state, live)
    # The entities bucket owes nothing to the graph: ranked and rendered first, so that the graph's round trip
    # can end the transaction (below).
    blind = {}
    if state.dense is not None and "dense" in state.entity_rankings:
        blind["dense"] = state.dense.blind(ENTITIES, [])
    state.entities = above(relevance(state.entity_rankings, blind=blind), request.min_score)[: request.max_entities]
    _entity_hits(state)
    if EXAMPLE_QUERIES in live:
        snapshot_of(state)  # (the hits' stale-query warnings read it: in the search's snapshot, before its end)
    if live and state.response.channels.graph:
        depths = {bucket: bucket_depth(state.caps[bucket]) for bucket in live}
        # Every channel ranked every live bucket, so the seeds are the fused ranking's first.
        seeds = {bucket: [d for d, _ in fused[bucket][: graph.SEEDS]] for bucket in live}
        seed_scores = {bucket: dict(fused[bucket][: graph.SEEDS]) for bucket in live}
        # A new ranking only raises the fused score of the docs it holds, so a bucket's final hits are among
        # its top hits without the graph and the graph's hops: the former are loaded with the graph's query,
        # in the same round trip (the latter, rarely needed, when hydrating). A question with names re-ranks
        # each bucket's first ``depth`` hits by their text: those are loaded then.
        names = question_names(request.question_text)
        pools = depths if names else {bucket: state.caps[bucket] for bucket in live}
        likely = [d for bucket in live for d, _ in fused[bucket][: pools[bucket]]]
        # The hits a caller would see that ask something lend their relevance to the memory replying to them.
        asking = {bucket: fused[bucket][: state.caps[bucket]] for bucket in live}
        asking_ids = {bucket: [d for d, _ in ranking] for bucket, ranking in asking.items()}
        episodic = _in_episodes(state, asking_ids)
        tenant_id = state.caller.tenant_id
        with state.clock.timing("graph"):
            # The search's last statements, as a rule: its COMMIT goes with them. Hits the graph's hops or the
            # names lift that were not loaded here are read after, in a transaction of their own (_load).
            edges, rows, *rest = sql.run_many(
                state.session,
                [
                    graph.query(seeds=seeds, eligibility=eligibility),
                    hits.memories_query(tenant_id=tenant_id, memory_ids=likely),
                    *([replies.query(tenant_id=tenant_id, seeds=episodic)] if episodic else []),
                ],
                commit=True,
            )
            answered = rest[0] if rest else []
            state.ended = True
            hops = graph.from_rows(edges, seeds=seeds, eligibility=eligibility, seed_scores=seed_scores)
            answers = replies.from_rows(
                answered, seeds=asking_ids, seed_scores={bucket: dict(ranking) for bucket, ranking in asking.items()}
            )
            hops = {bucket: replies.merged(hops[bucket], answers[bucket]) for bucket in live}
        state.loaded.update(hits.memories_from_rows(rows))
        state.loaded.update(replies.loaded(answered))
        eligibility.check(d for ranking in hops.values() for d, _ in ranking)
        for bucket in live:
            fused[bucket] = with_hops(fused[bucket], eligibility.pick(hops[bucket], bucket, depths[bucket]))
        if names:
            _rerank_by_names(state, fused, names=names, depths=depths)
    for bucket in live:
        out[bucket] = above(fused[bucket], request.min_score)[: state.caps[bucket]]
    state.buckets = out
    return out


def _in_episodes(state: SearchState, seeds: dict[str, list[str]]) -> dict[str, list[str]]:
    """The seeds that may have a reply: only a memory of an episode has one (core.search.replies), and the tenant's
    facts, when held, say which are (all the seeds otherwise); buckets left with none are left out."""
    facts = state.eligibility.facts()
    if facts is None:
        return {bucket: ids for bucket, ids in seeds.items() if ids}
    fact_of = facts.get
    kept = {bucket: [d for d in ids if (f := fact_of(d)) is None or f.in_episode] for bucket, ids in seeds.items()}
    return {bucket: ids for bucket, ids in kept.items() if ids}


def _load(state: SearchState, memory_ids: list[str], *, last: bool = False) -> dict[str, Memory]:
    """The hit columns of memories not loaded yet; ``last``: the search reads nothing after them, so its COMMIT
    goes with them. Once the search's transaction has ended (with the graph's query), they are read in a new
    one, which sees only what the caller may see and is not forgotten now (a memory edited or forgotten since
    the search's snapshot is shown as it is now, or dropped)."""
    if not memory_ids:
        return {}
    if state.ended:
        query = hits.visible_memories_query(caller=state.caller, memory_ids=memory_ids)
    else:
        query = hits.memories_query(tenant_id=state.caller.tenant_id, memory_ids=memory_ids)
    rows = sql.run(state.session, query, commit=last)
    state.ended = state.ended or last
    return hits.memories_from_rows(rows)


def _rerank_by_names(
    state: SearchState, fused: dict[str, Ranking], *, names: list[str], depths: dict[str, int]
) -> None:
    """Each bucket's first ``depth`` hits re-scored by the question's names their own text says
    (core.search.names); the texts not loaded yet (graph hops that rose into them) are read in one query."""
    pools = {bucket: fused[bucket][: depths[bucket]] for bucket in fused}
    missing = [d for pool in pools.values() for d, _ in pool if d not in state.loaded]
    state.loaded.update(_load(state, missing))
    loaded = state.loaded

    def text_of(memory_id: str) -> str | None:
        memory = loaded.get(memory_id)
        return None if memory is None else render_memory(memory)

    for bucket, pool in pools.items():
        fused[bucket] = with_names(pool, names=names, text_of=text_of)


def _fused(state: SearchState, rankings: dict[str, Ranking], bucket: str) -> Ranking:
    """A bucket's direct channels fused into relevance (see _fused_buckets)."""
    return _fused_buckets(state, [bucket], {bucket: rankings})[bucket]


def _fused_buckets(
    state: SearchState, buckets: list[str], rankings: dict[str, dict[str, Ranking]] | None = None
) -> dict[str, Ranking]:
    """Each bucket's direct channels (its eligible rankings unless given) fused into relevance; dense does
    not count against a memory it has no vector of (a fresh save is first for its own words before its
    embedding lands)."""
    rankings = state.eligible if rankings is None else rankings
    blinds: dict[str, Callable[[str], bool]] = {}
    if state.dense is not None:
        dense = state.dense
        asked = [bucket for bucket in buckets if "dense" in rankings[bucket]]
        # Only the approximate path asks which candidates it could see (the exact path knows its rows), in
        # one query for every bucket.
        blinds = dense.blinds(
            {
                bucket: [] if dense.exact else sorted({d for ranking in rankings[bucket].values() for d, _ in ranking})
                for bucket in asked
            }
        )
    return {
        bucket: relevance(rankings[bucket], blind={"dense": blinds[bucket]} if bucket in blinds else {})
        for bucket in buckets
    }


# -- output ---------------------------------------------------------------------------


def ordered(state: SearchState, mode: str) -> None:
    """The recent / important / typed orderings, hydrated (no channels, no fusion)."""
    buckets, loaded = ordered_buckets(state.session, memory_filter=state.memory_filter, mode=mode, caps=state.caps)
    state.loaded.update(loaded)
    state.buckets = {bucket: above(ranking, state.request.min_score) for bucket, ranking in buckets.items()}
    _hydrate_memories(state, tokens=[])


def hydrate(state: SearchState) -> SearchResponse:
    """The fused rankings made into the response's hits."""
    _hydrate_memories(state, tokens=state.inputs.bm25_tokens)
    return state.response


def _entity_hits(state: SearchState) -> None:
    """The entities bucket's hits (its catalog docs rendered, in the search's snapshot)."""
    if state.entities:
        state.response.entities = hits.entity_hits(
            state.session,
            ranked=state.entities,
            snapshot=snapshot_of(state),
            tenant_id=state.caller.tenant_id,
            version=head_of(state).catalog_version,
        )


def _hydrate_memories(state: SearchState, *, tokens: list[str]) -> None:
    buckets, response = state.buckets, state.response
    ids = [doc_id for ranking in buckets.values() for doc_id, _ in ranking]
    memories = {memory_id: state.loaded[memory_id] for memory_id in ids if memory_id in state.loaded}
    missing = [memory_id for memory_id in ids if memory_id not in memories]
    if buckets.get(EXAMPLE_QUERIES):
        snapshot_of(state)  # (read in the search's snapshot, before its last statement: the warnings below)
    memories.update(_load(state, missing, last=True))
    matched = {
        memory_id: [t for t in tokens if t in (memory.entities or []) or t == MEMORY_PREFIX + memory_id]
        for memory_id, memory in memories.items()
    }
    response.memories = hits.memory_hits(  # type: ignore[assignment]
        ranked=buckets.get(MEMORIES, []), memories=memories, bucket=MEMORIES, matched=matched
    )
    response.example_queries = hits.memory_hits(  # type: ignore[assignment]
        ranked=buckets.get(EXAMPLE_QUERIES, []), memories=memories, bucket=EXAMPLE_QUERIES, matched=matched
    )
    for hit in response.example_queries:
        warning = hits.stale_query_warning(memories[hit.id], snapshot=snapshot_of(state))
        if warning:
            state.warn(warning)


def search(session: Session, *, caller: Caller, request: SearchRequest) -> SearchResponse:
    """Run one search for ``caller`` in the caller's session (read-only)."""
    request.check()
    read_one_snapshot(session)  # (begun with the search's first statement)
    if request.mode == "hybrid" and request.question_text:
        # The index is caught up to the change seq of the head, the search's first read (no read of its own).
        if is_open(caller.tenant_id):
            try:
                return run_search(session, caller=caller, request=request, catch_up=True).response
            except CatchUpFirst:
                pass
        # Catching up would wait (for another thread's catch-up, a commit's lock, or opening the index): the
        # search gives its transaction and connection back first, so waiting holds neither, and the
        # catch-up's own connection is the only one in use. Then it starts again in a new snapshot.
        session.rollback()
        catch_up_before_search(caller.tenant_id)
    return run_search(session, caller=caller, request=request).response
