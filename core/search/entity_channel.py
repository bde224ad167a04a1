"""Channel 1 on the memory side: BM25Plus of the input entities against memory entity tags.

The corpus is the tenant's memories of the searched statuses (``active``, plus ``stale`` with
``include_stale``), restricted to the datasource scope when one is given: statistics are taken over
that corpus (pre-filter), while visibility and the field filters (kind, category, event time) only
remove hits from the ranking. Each memory's tokens are its tags plus ``memory:<id>``.

Nothing here reads the corpus: N and the total token count come from ``search_corpus_stats``
(maintained by triggers in the writing transaction, migration 0003; read by the candidates query), and
the rows carrying a query entity come from the GIN index on ``memories.entities``; every such row is a
candidate, so the document frequency of each query entity is counted exactly from them.

Stale tags (naming an entity that no longer exists) never match: every query entity was resolved
against the current catalog and memories, so a stale tag is never equal to one. Until the cleanup
job strips them they still count in their memory's length, as the statistics count stored tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Executable, any_, column, func, or_, select, table, text
from sqlalchemy.orm import Session

from core import sql
from core.entities.canonical import is_memory_ref, memory_id_of
from core.memories.models import Memory
from core.search import entity_bm25
from core.search.filters import EXAMPLE_QUERIES, MEMORIES, Eligibility, MemoryFilter, has_query

_CORPUS_SQL = text(
    "SELECT coalesce(sum(docs), 0), coalesce(sum(tokens), 0) FROM search_corpus_stats "
    "WHERE tenant_id = :tenant_id AND scope = :scope AND status = ANY(:statuses)"
)
_STATS = table(
    "search_corpus_stats", column("tenant_id"), column("scope"), column("status"), column("docs"), column("tokens")
)


def _corpus_columns(*, tenant_id: int, memory_filter: MemoryFilter) -> tuple[Any, Any]:
    """(N, total tokens) of the searched corpus as scalar subqueries, to ride along the candidates query."""
    where = (
        _STATS.c.tenant_id == tenant_id,
        _STATS.c.scope == (memory_filter.datasource or ""),
        _STATS.c.status.in_(memory_filter.statuses),
    )
    return tuple(  # type: ignore[return-value]
        select(func.coalesce(func.sum(_STATS.c[name]), 0)).where(*where).scalar_subquery()
        for name in ("docs", "tokens")
    )


def corpus_size(session: Session, *, tenant_id: int, memory_filter: MemoryFilter) -> tuple[int, int]:
    """(N, total tokens) of the searched corpus."""
    row = session.execute(
        _CORPUS_SQL,
        {
            "tenant_id": tenant_id,
            "scope": memory_filter.datasource or "",
            "statuses": memory_filter.statuses,
        },
    ).one()
    return int(row[0]), int(row[1])


def rank_memories(
    session: Session,
    *,
    tenant_id: int,
    query_entities: list[str],
    eligibility: Eligibility,
) -> tuple[list[tuple[str, float]], dict[str, list[str]]]:
    """[(memory id, BM25Plus score)] best first over every memory sharing an entity with the query
    (eligible or not: the buckets filter later), and memory id -> matched input entities."""
    if not query_entities:
        return [], {}
    scores, postings = _scored(
        sql.run(session, query(tenant_id=tenant_id, query_entities=query_entities, eligibility=eligibility)),
        query_entities=query_entities,
        eligibility=eligibility,
    )
    carried = [(entity, postings.get(entity, {})) for entity in query_entities]
    matched = {memory_id: [e for e, docs in carried if memory_id in docs] for memory_id in scores}
    return entity_bm25.ranked(scores), matched


def query(*, tenant_id: int, query_entities: list[str], eligibility: Eligibility) -> sql.Query:
    """The statement of :func:`rank_memories` (``query_entities`` not empty), for :func:`sql.run_many`."""
    memory_filter = eligibility.memory_filter
    self_ids = [memory_id_of(e) for e in query_entities if is_memory_ref(e)]

    def build() -> Executable:
        overlap = Memory.entities.overlap(sql.text_array("entities"))
        docs_column, tokens_column = _corpus_columns(tenant_id=tenant_id, memory_filter=memory_filter)
        return select(
            Memory.id, Memory.entities, has_query(), memory_filter.caller_predicate(), docs_column, tokens_column
        ).where(
            Memory.tenant_id == tenant_id,
            *memory_filter.corpus_clauses(),
            or_(overlap, Memory.id == any_(sql.text_array("self_ids"))) if self_ids else overlap,
        )

    key = ("entity_bm25", tenant_id, memory_filter, bool(self_ids))
    # Planned for its entities (a GIN look-up whose cost follows how common each entity is): not generic.
    return sql.Query(key, build, {"entities": list(dict.fromkeys(query_entities)), "self_ids": self_ids})


def from_rows(found: Sequence[Any], *, query_entities: list[str], eligibility: Eligibility) -> list[tuple[str, float]]:
    """The ranking of :func:`rank_memories` from the rows of :func:`query`; teaches ``eligibility`` the verdicts."""
    return entity_bm25.ranked(_scored(found, query_entities=query_entities, eligibility=eligibility)[0])


def _scored(
    found: Sequence[Any], *, query_entities: list[str], eligibility: Eligibility
) -> tuple[dict[str, float], dict[str, dict[str, int]]]:
    """Each candidate's score, and the postings of the query entities (entity -> memory id -> frequency)."""
    if not query_entities:
        return {}, {}
    # The corpus statistics come with every candidate row (no candidate: no score needs them).
    size, total = (int(found[0][4]), int(found[0][5])) if found else (0, 0)
    rows = [row[:4] for row in found]
    wanted = set(query_entities)
    postings: dict[str, dict[str, int]] = {entity: {} for entity in wanted}
    doc_len: dict[str, int] = {}
    verdicts: dict[str, str | None] = {}
    for memory_id, entities, carries_query, eligible in rows:
        tokens = entity_bm25.memory_tokens(memory_id, entities)
        doc_len[memory_id] = len(tokens)
        # Term frequencies of the wanted entities only (a Counter of every tag cost more than the scoring).
        for entity in wanted.intersection(tokens):
            postings[entity][memory_id] = tokens.count(entity)
        verdicts[memory_id] = (EXAMPLE_QUERIES if carries_query else MEMORIES) if eligible else None
    eligibility.learn(verdicts)
    stats = entity_bm25.StatsSnapshot(
        corpus_size=max(size, len(rows)),
        total_len=max(total, sum(doc_len.values())),
        doc_freq={entity: len(docs) for entity, docs in postings.items() if docs},
        doc_len=doc_len,
    )
    return entity_bm25.score(stats, query_entities=query_entities, candidate_postings=postings), postings
