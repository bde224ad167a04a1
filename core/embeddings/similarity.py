"""Similarity linking when a memory's embedding lands (CONTRACT section 4).

Cosine above `similarity_update_threshold` with an existing memory of the same owner and agent: the newer
memory gets an `updates` association to the older, and the older's `superseded_by` names the newer (both
stay active). Between the suggest and update thresholds the match is only reported (`similar_existing`).

Comparing every new vector with the tenant's corpus in SQL costs a scan per memory; instead each process
keeps the tenant's memory vectors in a numpy matrix, refreshed incrementally by `updated_at`, and only
the few best candidates are checked against the database (owner, agent, status, still existing).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import numpy as np
from sqlalchemy import Table, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from core.embeddings.store_models import Embedding
from core.memories.models import Association, Memory

MEMORY_PREFIX = "memory:"
_CANDIDATES = 8


@dataclass
class _Matrix:
    dims: int
    ids: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), dtype=np.float32))
    watermark: datetime | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def upsert(self, memory_id: str, vector: np.ndarray) -> None:
        row = self.index.get(memory_id)
        if row is None:
            if len(self.ids) == self.vectors.shape[0]:
                grown = np.zeros((max(64, 2 * len(self.ids)), self.dims), dtype=np.float32)
                grown[: len(self.ids)] = self.vectors[: len(self.ids)]
                self.vectors = grown
            row = len(self.ids)
            self.ids.append(memory_id)
            self.index[memory_id] = row
        self.vectors[row] = vector


_matrices: dict[tuple[int, str], _Matrix] = {}
_matrices_lock = threading.Lock()


def _matrix(session: Session, *, tenant_id: int, model: str, dims: int) -> _Matrix:
    with _matrices_lock:
        matrix = _matrices.get((tenant_id, model))
        if matrix is None or matrix.dims != dims:
            matrix = _Matrix(dims=dims, vectors=np.zeros((0, dims), dtype=np.float32))
            _matrices[(tenant_id, model)] = matrix
    with matrix.lock:
        stmt = select(Embedding.canonical_id, Embedding.embedding, Embedding.updated_at).where(
            Embedding.model == model, Embedding.doc_kind == "memory"
        )
        if matrix.watermark is not None:
            stmt = stmt.where(Embedding.updated_at >= matrix.watermark)
        for canonical_id, vector, updated_at in session.execute(stmt):
            matrix.upsert(canonical_id[len(MEMORY_PREFIX) :], np.asarray(vector, dtype=np.float32))
            if matrix.watermark is None or updated_at > matrix.watermark:
                matrix.watermark = updated_at
    return matrix


def _nearest(matrix: _Matrix, memory_ids: list[str], block: np.ndarray) -> dict[str, list[tuple[str, float]]]:
    """The best candidates of each new vector against the whole matrix, in one matrix product."""
    with matrix.lock:
        n = len(matrix.ids)
        if n == 0:
            return {mid: [] for mid in memory_ids}
        scores = matrix.vectors[:n] @ block.T  # (corpus, new)
        k = min(_CANDIDATES + 1, n)
        top = np.argpartition(-scores, k - 1, axis=0)[:k]
        ids = matrix.ids
    out: dict[str, list[tuple[str, float]]] = {}
    for col, memory_id in enumerate(memory_ids):
        pairs = sorted(((ids[i], float(scores[i, col])) for i in top[:, col]), key=lambda x: -x[1])
        out[memory_id] = [(mid, score) for mid, score in pairs if mid != memory_id]
    return out


def link_similar(
    session: Session,
    *,
    tenant_id: int,
    model: str,
    new_vectors: dict[str, np.ndarray],
    update_threshold: float,
    suggest_threshold: float,
) -> dict[str, list[dict[str, Any]]]:
    """Link each newly embedded memory to near-duplicates; return the suggestions per memory id."""
    if not new_vectors:
        return {}
    memory_ids = list(new_vectors)
    block = np.stack([np.asarray(new_vectors[m], dtype=np.float32) for m in memory_ids])
    matrix = _matrix(session, tenant_id=tenant_id, model=model, dims=int(block.shape[1]))
    with matrix.lock:
        for memory_id, vector in zip(memory_ids, block, strict=True):
            matrix.upsert(memory_id, vector)
    nearest = _nearest(matrix, memory_ids, block)
    wanted = set(memory_ids) | {cid for pairs in nearest.values() for cid, s in pairs if s >= suggest_threshold}
    rows = {
        m.id: m
        for m in session.scalars(select(Memory).where(Memory.id.in_(wanted), Memory.status != "forgotten"))
    }
    suggestions: dict[str, list[dict[str, Any]]] = {}
    edges: dict[tuple[str, str], float] = {}
    for memory_id, pairs in nearest.items():
        me = rows.get(memory_id)
        if me is None:
            continue
        for other_id, score in pairs:
            other = rows.get(other_id)
            if other is None or score < suggest_threshold or other.status != "active":
                continue
            if other.created_by != me.created_by or other.agent_id != me.agent_id:
                continue
            if score > update_threshold:
                newer, older = (me, other) if (me.created_at, me.id) >= (other.created_at, other.id) else (other, me)
                edges[(newer.id, older.id)] = round(min(max(score, 0.0), 1.0), 4)
                older.superseded_by = newer.id
            else:
                suggestions.setdefault(memory_id, []).append(
                    {"memory_id": other_id, "score": round(score, 4), "content": other.content[:200]}
                )
    if edges:
        table = cast(Table, Association.__table__)
        session.connection().execute(
            pg_insert(table).on_conflict_do_nothing(),
            [
                {"tenant_id": tenant_id, "source_id": s, "target_id": t, "relation_type": "updates", "weight": w}
                for (s, t), w in edges.items()
            ],
        )
    return suggestions


def forget_matrices() -> None:
    with _matrices_lock:
        _matrices.clear()
