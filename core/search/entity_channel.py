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

from sqlalchemy import BigInteger, Executable, Text, any_, bindparam, cast, column, func, or_, select, table

from core import sql
from core.entities.canonical import is_memory_ref, memory_id_of
from core.memories.models import Memory
from core.search import entity_bm25
from core.search.filters import EXAMPLE_QUERIES, MEMORIES, Eligibility, MemoryFilter, has_query, tenant_param

_STATS = table(
    "search_corpus_stats", column("tenant_id"), column("scope"), column("status"), column("docs"), column("tokens")
)


def _corpus_columns(*, memory_filter: MemoryFilter) -> tuple[Any, Any]:
    """(N, total tokens) of the searched corpus as scalar subqueries, to ride along the candidates query: as
    bigint (a sum of bigint is numeric, which the driver reads as a Decimal, on every candidate row). The
    tenant and the scope are parameters (``tenant``, ``stats_scope``)."""
    where = (
        _STATS.c.tenant_id == tenant_param(),
        _STATS.c.scope == bindparam("stats_scope", value=None, type_=Text),
        _STATS.c.status.in_(memory_filter.statuses),
    )
    return tuple(  # type: ignore[return-value]
        select(cast(func.coalesce(func.sum(_STATS.c[name]), 0), BigInteger)).where(*where).scalar_subquery()
        for name in ("docs", "tokens")
    )


def query(*, query_entities: list[str], eligibility: Eligibility) -> sql.Query:
    """The candidates of the entity channel (``query_entities`` not empty), for :func:`sql.run_many`: per memory
    sharing an entity with the query, its id, its tag count, whether it carries a query, whether the caller sees it,
    the corpus statistics, then the frequency of each distinct query entity among its tags. Frequencies and counts
    rather than the tags themselves: a candidate's whole tag array cost more to read than its score."""
    memory_filter = eligibility.memory_filter
    self_ids = [memory_id_of(e) for e in query_entities if is_memory_ref(e)]
    wanted = list(dict.fromkeys(query_entities))
    # One statement per power of two of distinct entities; the unused columns count NULL, which no tag is.
    width = 1 << (len(wanted) - 1).bit_length()

    def build() -> Executable:
        overlap = Memory.entities.overlap(sql.text_array("entities"))
        docs_column, tokens_column = _corpus_columns(memory_filter=memory_filter)
        frequencies = [
            func.cardinality(func.array_positions(Memory.entities, bindparam(f"e{i}", value=None, type_=Text)))
            for i in range(width)
        ]
        return select(
            Memory.id,
            func.cardinality(Memory.entities),
            has_query(),
            memory_filter.caller_predicate(),
            docs_column,
            tokens_column,
            *frequencies,
        ).where(
            Memory.tenant_id == tenant_param(),
            *memory_filter.corpus_clauses(),
            or_(overlap, Memory.id == any_(sql.text_array("self_ids"))) if self_ids else overlap,
        )

    # Compiled once per shape of the filter: the tenant, caller and filter values are parameters.
    key = ("entity_bm25", memory_filter.shape(), bool(self_ids), width)
    values: dict[str, Any] = {"entities": wanted, "self_ids": self_ids, **memory_filter.values()}
    values["stats_scope"] = memory_filter.datasource or ""
    values.update({f"e{i}": wanted[i] if i < len(wanted) else None for i in range(width)})
    # Planned for its entities (a GIN look-up whose cost follows how common each entity is): not generic.
    return sql.Query(key, build, values)


def from_rows(found: Sequence[Any], *, query_entities: list[str], eligibility: Eligibility) -> list[tuple[str, float]]:
    """The channel's ranking, [(memory id, BM25Plus score)] best first, from the rows of :func:`query`, over every
    memory sharing an entity with the query (eligible or not: the buckets filter later); teaches ``eligibility``
    the verdicts."""
    if not query_entities or not found:
        return []
    # The corpus statistics come with every candidate row.
    size, total = int(found[0][4]), int(found[0][5])
    wanted = list(dict.fromkeys(query_entities))
    postings: dict[str, dict[str, int]] = {entity: {} for entity in wanted}
    # A memory's tokens are its tags and its self reference (entity_bm25.memory_tokens).
    selves = {memory_id_of(entity): entity for entity in wanted if is_memory_ref(entity)}
    doc_len: dict[str, int] = {}
    verdicts: dict[str, str | None] = {}
    for row in found:
        memory_id = row[0]
        doc_len[memory_id] = row[1] + 1
        for entity, frequency in zip(wanted, row[6:], strict=False):
            if frequency:
                postings[entity][memory_id] = frequency
        if memory_id in selves:
            entity = selves[memory_id]
            postings[entity][memory_id] = postings[entity].get(memory_id, 0) + 1
        verdicts[memory_id] = (EXAMPLE_QUERIES if row[2] else MEMORIES) if row[3] else None
    eligibility.learn(verdicts)
    stats = entity_bm25.StatsSnapshot(
        corpus_size=max(size, len(found)),
        total_len=max(total, sum(doc_len.values())),
        doc_freq={entity: len(docs) for entity, docs in postings.items() if docs},
        doc_len=doc_len,
    )
    return entity_bm25.ranked(entity_bm25.score(stats, query_entities=query_entities, candidate_postings=postings))
