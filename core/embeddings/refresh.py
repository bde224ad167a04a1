"""Converge the embeddings table for a set of docs: render, hash, skip unchanged, embed the rest, upsert.

Idempotent: running it twice for the same docs makes no embedding call the second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from core.embeddings.providers import Embedder
from core.embeddings.store_models import Embedding
from core.memories.models import Memory
from core.metrics import EMBEDDED_TEXTS, EMBEDDING_CALLS, EMBEDDING_FAILURES
from core.search.render import content_hash, render_memory

MEMORY_PREFIX = "memory:"
_table = cast(Table, Embedding.__table__)
_upsert = pg_insert(_table)
# Compiled once and run as executemany: cheaper than rendering a VALUES list per chunk.
_UPSERT = _upsert.on_conflict_do_update(
    index_elements=[_table.c.tenant_id, _table.c.canonical_id, _table.c.model],
    set_={c: _upsert.excluded[c] for c in ("doc_kind", "dims", "content_hash", "embedding", "updated_at")},
)


@dataclass(frozen=True)
class Doc:
    canonical_id: str
    doc_kind: str
    text: str


def load_docs(session: Session, *, doc_ids: list[str]) -> tuple[list[Doc], list[str]]:
    """The docs that exist (and should be embedded) among `doc_ids`, and the ids that are gone."""
    memory_ids = [d[len(MEMORY_PREFIX) :] for d in doc_ids if d.startswith(MEMORY_PREFIX)]
    docs: list[Doc] = []
    if memory_ids:
        rows = session.scalars(select(Memory).where(Memory.id.in_(memory_ids), Memory.status != "forgotten")).all()
        docs.extend(Doc(MEMORY_PREFIX + m.id, "memory", render_memory(m)) for m in rows)
    from core.embeddings import catalog_docs

    docs.extend(catalog_docs.load(session, doc_ids=[d for d in doc_ids if not d.startswith(MEMORY_PREFIX)]))
    found = {d.canonical_id for d in docs}
    return docs, [d for d in doc_ids if d not in found]


def embed_docs(
    session: Session,
    *,
    tenant_id: int,
    doc_ids: list[str],
    embedder: Embedder,
    batch_size: int = 64,
    link_similar: bool = True,
) -> dict[str, Any]:
    """Bring the embeddings of `doc_ids` up to date for `embedder`'s model.

    Memories whose vector was (re)computed are then linked to near-duplicates (core.embeddings.similarity);
    the result carries the suggestions under "similar" for the synchronous save path.
    """
    docs, _gone = load_docs(session, doc_ids=doc_ids)
    if not docs:
        return {"embedded": 0, "unchanged": 0}
    new_memory_vectors: dict[str, Any] = {}
    hashes = {d.canonical_id: content_hash(d.text) for d in docs}
    current = dict(
        session.execute(
            select(Embedding.canonical_id, Embedding.content_hash).where(
                Embedding.model == embedder.name, Embedding.canonical_id.in_(list(hashes))
            )
        ).all()
    )
    todo = [d for d in docs if current.get(d.canonical_id) != hashes[d.canonical_id]]
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        EMBEDDING_CALLS.labels(embedder.name).inc()
        try:
            vectors = embedder.embed_documents([d.text for d in chunk])
        except Exception:
            EMBEDDING_FAILURES.labels(embedder.name).inc()
            raise
        EMBEDDED_TEXTS.labels(embedder.name).inc(len(chunk))
        rows = [
            {
                "tenant_id": tenant_id,
                "canonical_id": d.canonical_id,
                "model": embedder.name,
                "doc_kind": d.doc_kind,
                "dims": int(vectors.shape[1]),
                "content_hash": hashes[d.canonical_id],
                "embedding": vector,
                "updated_at": datetime.now(UTC),
            }
            for d, vector in zip(chunk, vectors, strict=True)
        ]
        for d, vector in zip(chunk, vectors, strict=True):
            if d.doc_kind == "memory":
                new_memory_vectors[d.canonical_id[len(MEMORY_PREFIX) :]] = vector
        session.connection().execute(_UPSERT, rows)
    result: dict[str, Any] = {"embedded": len(todo), "unchanged": len(docs) - len(todo)}
    if link_similar and new_memory_vectors:
        from core.config import get_settings
        from core.embeddings.similarity import link_similar as link

        settings = get_settings()
        similar = link(
            session,
            tenant_id=tenant_id,
            model=embedder.name,
            new_vectors=new_memory_vectors,
            update_threshold=settings.similarity_update_threshold,
            suggest_threshold=settings.similarity_suggest_threshold,
        )
        if similar:
            result["similar"] = similar
    return result


def delete_embeddings(session: Session, *, canonical_ids: list[str]) -> None:
    if canonical_ids:
        session.execute(delete(Embedding).where(Embedding.canonical_id.in_(canonical_ids)))
