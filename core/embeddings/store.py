"""Reads over the embeddings table: coverage, gaps to converge, and which model serves search.

A memory's expected content hash is computed in SQL (`sha256` of its content, exactly what the renderer
hashes), so finding a changed or missing row never loads content into Python.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, func, literal, select
from sqlalchemy.orm import Session

from core.embeddings import catalog_docs
from core.embeddings.coverage import memory_counts as read_memory_counts
from core.entities.render import content_hash
from core.memories.models import Memory
from core.refs import MEMORY_PREFIX
from core.vectors import Embedding


def _memory_hash_sql() -> Any:
    return func.encode(func.sha256(func.convert_to(Memory.content, literal("UTF8"))), literal("hex"))


def _embeddable_memories() -> Any:
    return Memory.status != "forgotten"


@dataclass(frozen=True)
class CoverageRow:
    doc_kind: str
    model: str
    indexed: int
    expected: int

    @property
    def ratio(self) -> float:
        return 1.0 if self.expected == 0 else round(self.indexed / self.expected, 6)


def memory_gaps(session: Session, *, model: str, limit: int) -> list[str]:
    """Doc ids of memories whose embedding for `model` is missing or was made from other content."""
    joined = and_(
        Embedding.tenant_id == Memory.tenant_id,
        Embedding.canonical_id == literal(MEMORY_PREFIX) + Memory.id,
        Embedding.model == model,
    )
    rows = session.scalars(
        select(Memory.id)
        .outerjoin(Embedding, joined)
        .where(_embeddable_memories())
        .where((Embedding.canonical_id.is_(None)) | (Embedding.content_hash != _memory_hash_sql()))
        .order_by(Memory.id)
        .limit(limit)
    ).all()
    return [MEMORY_PREFIX + r for r in rows]


def catalog_gaps(session: Session, *, model: str) -> list[str]:
    """Catalog doc ids (datasources, models, columns, ...) whose embedding is missing or stale."""

    docs = catalog_docs.all_docs(session)
    if not docs:
        return []
    current = dict(
        session.execute(
            select(Embedding.canonical_id, Embedding.content_hash).where(
                Embedding.model == model, Embedding.doc_kind != "memory"
            )
        ).all()
    )
    return [d.canonical_id for d in docs if current.get(d.canonical_id) != content_hash(d.text)]


def coverage(
    session: Session, *, configured_model: str, memory_counts: tuple[int, int] | None = None
) -> list[CoverageRow]:
    """One row per doc kind for the configured model: rows up to date with the docs' current text, over docs
    expected. A retired model's vectors may still serve search while the configured one converges
    (:func:`serving_model`), but they are not what coverage measures; reconcile deletes them once the
    configured model covers the tenant.

    Memories are counted from the counters the writes keep (core.embeddings.coverage); `memory_counts`
    (indexed, expected) passes them in when the caller read many tenants' at once. The catalog, small by
    nature, is rendered and hashed here."""

    if memory_counts is None:
        tenant_id = session.info.get("tenant_id")  # the session's tenant (scope_to_tenant, tenant_session)
        found = read_memory_counts(session, model=configured_model, tenant_ids=[int(tenant_id)] if tenant_id else None)
        memory_counts = found.get(int(tenant_id), (0, 0)) if tenant_id else next(iter(found.values()), (0, 0))
    expected: dict[str, int] = defaultdict(int)
    indexed: dict[tuple[str, str], int] = defaultdict(int)
    indexed[("memory", configured_model)], expected["memory"] = memory_counts
    catalog = catalog_docs.all_docs(session)
    catalog_hashes = {d.canonical_id: content_hash(d.text) for d in catalog}
    for doc in catalog:
        expected[doc.doc_kind] += 1
    if catalog_hashes:
        rows = session.execute(
            select(Embedding.model, Embedding.doc_kind, Embedding.canonical_id, Embedding.content_hash).where(
                Embedding.doc_kind != "memory", Embedding.model == configured_model
            )
        ).all()
        for model, kind, canonical_id, digest in rows:
            if catalog_hashes.get(canonical_id) == digest:
                indexed[(kind, model)] += 1
    kinds = sorted(set(expected) | {k for k, _ in indexed})
    return [
        CoverageRow(
            doc_kind=kind,
            model=configured_model,
            indexed=indexed.get((kind, configured_model), 0),
            expected=expected.get(kind, 0),
        )
        for kind in kinds
    ]


def serving_model(session: Session, *, configured_model: str) -> str | None:
    """The model whose vectors answer dense search for this tenant.

    The configured model once it covers every memory; until then (a model change converging) the model
    that covers the most memories, so search keeps answering with the old vectors meanwhile.
    """
    rows = session.execute(
        select(Embedding.model, func.count()).where(Embedding.doc_kind == "memory").group_by(Embedding.model)
    ).all()
    if not rows:
        return None
    counts = {model: int(n) for model, n in rows}
    total = int(session.scalar(select(func.count()).select_from(Memory).where(_embeddable_memories())) or 0)
    if counts.get(configured_model, 0) >= total:
        return configured_model
    return max(counts.items(), key=lambda item: (item[1], item[0] == configured_model))[0]


def drop_other_models(session: Session, *, tenant_id: int, keep_model: str) -> int:
    """Delete the tenant's rows of every model but `keep_model`: the clean-up after a model change, which
    reconcile runs once `keep_model` covers the tenant (so search never loses its vectors meanwhile)."""
    result = session.execute(delete(Embedding).where(Embedding.tenant_id == tenant_id, Embedding.model != keep_model))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
