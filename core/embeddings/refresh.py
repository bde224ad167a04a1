"""Converge the embeddings table for a set of docs: render, hash, skip unchanged, embed the rest, upsert.

Idempotent: running it twice for the same docs makes no embedding call the second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from core.embeddings.providers import Embedder
from core.embeddings.store_models import Embedding
from core.memories.models import Memory
from core.search.render import content_hash, render_memory

MEMORY_PREFIX = "memory:"


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
        rows = session.scalars(
            select(Memory).where(Memory.id.in_(memory_ids), Memory.status != "forgotten")
        ).all()
        docs.extend(Doc(MEMORY_PREFIX + m.id, "memory", render_memory(m)) for m in rows)
    from core.embeddings import catalog_docs

    docs.extend(catalog_docs.load(session, doc_ids=[d for d in doc_ids if not d.startswith(MEMORY_PREFIX)]))
    found = {d.canonical_id for d in docs}
    return docs, [d for d in doc_ids if d not in found]


def embed_docs(
    session: Session, *, tenant_id: int, doc_ids: list[str], embedder: Embedder, batch_size: int = 64
) -> dict[str, Any]:
    """Bring the embeddings of `doc_ids` up to date for `embedder`'s model."""
    docs, _gone = load_docs(session, doc_ids=doc_ids)
    if not docs:
        return {"embedded": 0, "unchanged": 0}
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
        vectors = embedder.embed_documents([d.text for d in chunk])
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
        stmt = pg_insert(Embedding).values(rows)
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=["tenant_id", "canonical_id", "model"],
                set_={
                    c: stmt.excluded[c]
                    for c in ("doc_kind", "dims", "content_hash", "embedding", "updated_at")
                },
            )
        )
    return {"embedded": len(todo), "unchanged": len(docs) - len(todo)}


def delete_embeddings(session: Session, *, canonical_ids: list[str]) -> None:
    if canonical_ids:
        session.execute(delete(Embedding).where(Embedding.canonical_id.in_(canonical_ids)))
