"""Converge the embeddings table for a set of docs: render, hash, skip unchanged, embed the rest, upsert.

Idempotent: running it twice for the same docs makes no embedding call the second time.

The upsert is one statement for the whole job: the vectors travel as one binary vector[] parameter (no
float formatting and parsing as text), and the statement-level triggers on `embeddings` (migration 0003)
fire once. It runs last in the transaction, pipelined with the similarity links' writes: those triggers
update the tenant's `search_embedding_stats` row, whose lock concurrent jobs of the same tenant wait for
until commit, so everything that can be computed (embedding, linking) is done before the first write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
from psycopg.rows import class_row
from sqlalchemy import String, any_, bindparam, delete, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from core.config import get_settings
from core.embeddings import catalog_docs
from core.embeddings.docs import Doc as Doc
from core.embeddings.providers import Embedder, metered_tokens
from core.embeddings.similarity import plan_links
from core.embeddings.wire import VectorArray, driver_connection, vector_cursor
from core.entities.render import content_hash, render_memory
from core.memories.models import Memory
from core.metrics import EMBEDDED_TEXTS, EMBEDDING_CALLS, EMBEDDING_FAILURES
from core.refs import MEMORY_PREFIX
from core.tenancy.usage import embedding_allowance, next_day_start, record_embedding
from core.vectors import Embedding

if TYPE_CHECKING:
    from core.embeddings.similarity import LinkPlan


# The vectors go as one binary vector[] (core.embeddings.wire); the text arrays go binary too (no quoting).
_UPSERT = """
INSERT INTO embeddings AS e (tenant_id, canonical_id, model, doc_kind, dims, content_hash, embedding, updated_at)
SELECT %(tenant)s::bigint, d.canonical_id, %(model)s::text, d.doc_kind, %(dims)s::int, d.content_hash, d.embedding,
       clock_timestamp()
FROM unnest(%(ids)b::text[], %(kinds)b::text[], %(hashes)b::text[], %(vectors)b::vector[])
     AS d(canonical_id, doc_kind, content_hash, embedding)
ORDER BY d.canonical_id
ON CONFLICT (tenant_id, canonical_id, model) DO UPDATE SET
    doc_kind = excluded.doc_kind, dims = excluded.dims, content_hash = excluded.content_hash,
    embedding = excluded.embedding, updated_at = excluded.updated_at
"""
# Two single-table queries, not a join: right after a bulk load the planner's statistics are stale, and a
# join between memories and embeddings can then go quadratic.
_MEMORY_TEXTS = (
    "SELECT id, content FROM memories"
    " WHERE tenant_id = %(tenant)s AND id = ANY(%(ids)b::text[]) AND status <> 'forgotten'"
)
_CURRENT_HASHES = (
    "SELECT canonical_id, content_hash FROM embeddings"
    " WHERE tenant_id = %(tenant)s AND model = %(model)s AND canonical_id = ANY(%(ids)b::text[])"
)


class _MemoryRow(NamedTuple):
    id: str
    content: str


def load_docs(session: Session, *, tenant_id: int, model: str, doc_ids: list[str]) -> tuple[list[Doc], dict[str, str]]:
    """The docs that exist (and should be embedded) among `doc_ids`, once each, and the content hash of each
    one's current embedding for `model` (absent: none yet)."""
    memory_ids = list(dict.fromkeys(d[len(MEMORY_PREFIX) :] for d in doc_ids if d.startswith(MEMORY_PREFIX)))
    docs: dict[str, Doc] = {}
    current: dict[str, str] = {}
    if memory_ids:
        # Plain rows on a binary cursor, not ORM objects: the renderer reads only the content, and a row
        # lacking a column it starts to read fails loudly rather than hashing something else.
        with driver_connection(session).cursor(row_factory=class_row(_MemoryRow), binary=True) as cursor:
            rows = cursor.execute(_MEMORY_TEXTS, {"tenant": tenant_id, "ids": memory_ids}).fetchall()
        for row in rows:
            docs[MEMORY_PREFIX + row.id] = Doc(MEMORY_PREFIX + row.id, "memory", render_memory(cast(Memory, row)))
        if docs:
            with driver_connection(session).cursor(binary=True) as cursor:
                params = {"tenant": tenant_id, "model": model, "ids": list(docs)}
                current.update(cursor.execute(_CURRENT_HASHES, params).fetchall())

    others = list(dict.fromkeys(d for d in doc_ids if not d.startswith(MEMORY_PREFIX)))
    catalog = catalog_docs.load(session, doc_ids=others) if others else []
    if catalog:
        for doc in catalog:
            docs[doc.canonical_id] = doc
        current.update(
            session.execute(
                select(Embedding.canonical_id, Embedding.content_hash).where(
                    Embedding.model == model,
                    Embedding.canonical_id == any_(bindparam("ids", [d.canonical_id for d in catalog], ARRAY(String))),
                )
            ).all()
        )
    return list(docs.values()), current


def write_embeddings(
    session: Session,
    *,
    tenant_id: int,
    model: str,
    docs: list[Doc],
    hashes: dict[str, str],
    vectors: np.ndarray,
    links: LinkPlan | None = None,
) -> None:
    """Write `docs`' vectors (row i of `vectors` is docs[i]'s) in one INSERT ... ON CONFLICT statement, and
    the similarity links, pipelined: one round trip, so the row locks they take (the memories superseded,
    the tenant's embedding stats) are held only from here to the commit."""
    if not docs:
        return
    cursor, vector_oid = vector_cursor(session)
    with cursor:
        statements = links.statements(tenant_id=tenant_id) if links is not None else []
        statements.append(
            (
                _UPSERT,
                {
                    "tenant": tenant_id,
                    "model": model,
                    "dims": int(vectors.shape[1]),
                    "vectors": VectorArray(vectors, vector_oid=vector_oid),
                    "ids": [d.canonical_id for d in docs],
                    "kinds": [d.doc_kind for d in docs],
                    "hashes": [hashes[d.canonical_id] for d in docs],
                },
            )
        )
        with cursor.connection.pipeline():
            for statement, params in statements:
                cursor.execute(statement, params)


def embed_docs(
    session: Session,
    *,
    tenant_id: int,
    doc_ids: list[str],
    embedder: Embedder,
    batch_size: int = 64,
    link_similar: bool = True,
    suggestions: bool = True,
) -> dict[str, Any]:
    """Bring the embeddings of `doc_ids` up to date for `embedder`'s model.

    Memories whose vector was (re)computed are then linked to near-duplicates (core.embeddings.similarity);
    with `suggestions` the result carries the suggestions under "similar" for the synchronous save path.
    """
    docs, current = load_docs(session, tenant_id=tenant_id, model=embedder.name, doc_ids=doc_ids)
    if not docs:
        return {"embedded": 0, "unchanged": 0}
    hashes = {d.canonical_id: content_hash(d.text) for d in docs}
    todo = [d for d in docs if current.get(d.canonical_id) != hashes[d.canonical_id]]
    unchanged = len(docs) - len(todo)
    todo, waiting = _within_daily_quota(session, tenant_id=tenant_id, todo=todo)
    blocks: list[np.ndarray] = []
    with metered_tokens() as tokens:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            EMBEDDING_CALLS.labels(embedder.name).inc()
            try:
                blocks.append(np.asarray(embedder.embed_documents([d.text for d in chunk]), dtype=np.float32))
            except Exception:
                EMBEDDING_FAILURES.labels(embedder.name).inc()
                raise
            EMBEDDED_TEXTS.labels(embedder.name).inc(len(chunk))
    record_embedding(session, tenant_id=tenant_id, texts=len(todo), tokens=tokens[0])
    result: dict[str, Any] = {"embedded": len(todo), "unchanged": unchanged, **waiting}
    if not todo:
        return result
    vectors = np.concatenate(blocks)
    new_memory_vectors = {
        d.canonical_id[len(MEMORY_PREFIX) :]: vectors[i] for i, d in enumerate(todo) if d.doc_kind == "memory"
    }
    plan = None
    if link_similar and new_memory_vectors:
        settings = get_settings()
        plan = plan_links(
            session,
            tenant_id=tenant_id,
            model=embedder.name,
            new_vectors=new_memory_vectors,
            update_threshold=settings.similarity_update_threshold,
            suggest_threshold=settings.similarity_suggest_threshold,
            suggestions=suggestions,
        )
        if plan.suggestions:
            result["similar"] = plan.suggestions
    write_embeddings(
        session, tenant_id=tenant_id, model=embedder.name, docs=todo, hashes=hashes, vectors=vectors, links=plan
    )
    return result


def _within_daily_quota(session: Session, *, tenant_id: int, todo: list[Doc]) -> tuple[list[Doc], dict[str, Any]]:
    """The docs the tenant's embedding_texts_per_day still allows today, and what waits past it. The rest
    are left without a vector: reconcile finds them again once the quota allows (tomorrow, UTC)."""
    limit, used = embedding_allowance(session, tenant_id=tenant_id)
    if limit is None or len(todo) <= limit - used:
        return todo, {}
    allowed = max(0, limit - used)
    resumes = next_day_start().isoformat()
    return todo[:allowed], {
        "deferred": len(todo) - allowed,
        "waiting": f"quota embedding_texts_per_day of {limit} reached; embedding resumes {resumes}",
    }


def delete_embeddings(session: Session, *, canonical_ids: list[str]) -> None:
    if canonical_ids:
        session.execute(delete(Embedding).where(Embedding.canonical_id.in_(canonical_ids)))
