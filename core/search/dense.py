"""Channel 3: cosine similarity between the question and the tenant's stored embeddings.

Only rows of the active embedding model count (rows of an older model are inert). Two strategies,
chosen by the number of stored vectors of the tenant and model (``search_embedding_stats``):

* up to ``dense_exact_max_docs``: exact cosine in numpy over the tenant's matrix, which is cached
  in-process keyed by (tenant, model) and validated by the stats row's ``version`` (moved by every
  write to the tenant's embeddings), so a query does not reload the vectors;
* above: pgvector's HNSW index on ``embedding::vector(dims)`` (migration 0003), filtered by tenant,
  model and doc kind in the query, with ``hnsw.ef_search`` set for the depth asked and iterative
  scans so filtering does not starve the result.

Either way each doc kind side (memories, catalog entities) is ranked on its own, so one side never
takes the other's depth. Any reason the channel cannot run raises :class:`DenseUnavailable`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from core.config import get_settings
from core.embeddings.providers import EmbeddingProviderError, get_embedder
from core.embeddings.store_models import Embedding
from core.memories.models import Memory
from core.search.filters import EXAMPLE_QUERIES, HAS_QUERY_SQL, MEMORIES, has_query

MEMORY_KIND = "memory"
ENTITIES = "entities"
MEMORY_PREFIX = "memory:"
HNSW_DIMS = frozenset({256, 384, 512, 768, 1024, 1536})
CACHE_ENTRIES = 16
# Depth of the single approximate query above dense_exact_max_docs (see DenseSearch._hnsw_pool).
HNSW_POOL = 200


class DenseUnavailable(Exception):
    """The dense channel cannot run; the message is the warning shown to the caller."""


@dataclass(frozen=True)
class _Side:
    ids: list[str]
    matrix: np.ndarray


@dataclass(frozen=True)
class _Matrix:
    version: int
    memories: _Side
    entities: _Side


_cache: OrderedDict[tuple[int, str], _Matrix] = OrderedDict()
_cache_lock = threading.Lock()


def _stats(session: Session, *, tenant_id: int, model: str) -> tuple[int, int]:
    row = session.execute(
        text("SELECT docs, version FROM search_embedding_stats WHERE tenant_id = :t AND model = :m"),
        {"t": tenant_id, "m": model},
    ).first()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _load_matrix(session: Session, *, model: str, dims: int, version: int) -> _Matrix:
    rows = session.execute(
        select(Embedding.canonical_id, Embedding.doc_kind, Embedding.embedding).where(
            Embedding.model == model, Embedding.dims == dims
        )
    ).all()
    sides: dict[bool, tuple[list[str], list[np.ndarray]]] = {True: ([], []), False: ([], [])}
    for canonical_id, doc_kind, vector in rows:
        ids, vectors = sides[doc_kind == MEMORY_KIND]
        ids.append(canonical_id)
        vectors.append(np.asarray(vector, dtype=np.float32))

    def side(is_memory: bool) -> _Side:
        ids, vectors = sides[is_memory]
        matrix = np.vstack(vectors) if vectors else np.zeros((0, dims), dtype=np.float32)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        np.maximum(norms, 1e-12, out=norms)
        return _Side(ids=ids, matrix=np.ascontiguousarray(matrix / norms, dtype=np.float32))

    return _Matrix(version=version, memories=side(True), entities=side(False))


def _cached_matrix(session: Session, *, tenant_id: int, model: str, dims: int, version: int) -> _Matrix:
    key = (tenant_id, model)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit.version == version:
            _cache.move_to_end(key)
            return hit
    matrix = _load_matrix(session, model=model, dims=dims, version=version)
    with _cache_lock:
        _cache[key] = matrix
        _cache.move_to_end(key)
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return matrix


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


_masks: OrderedDict[tuple[int, str], tuple[int, int, np.ndarray]] = OrderedDict()


def _example_mask(session: Session, *, tenant_id: int, model: str, matrix: _Matrix, change_seq: int) -> np.ndarray:
    """Which memory rows of the matrix carry a query (the example_queries bucket), cached per version."""
    key = (tenant_id, model)
    with _cache_lock:
        hit = _masks.get(key)
        if hit is not None and hit[0] == matrix.version and hit[1] == change_seq:
            return hit[2]
    example_ids = {
        MEMORY_PREFIX + memory_id
        for memory_id in session.scalars(select(Memory.id).where(has_query(), Memory.status != "forgotten"))
    }
    ids = matrix.memories.ids
    mask = np.fromiter((doc_id in example_ids for doc_id in ids), dtype=bool, count=len(ids))
    with _cache_lock:
        _masks[key] = (matrix.version, change_seq, mask)
        while len(_masks) > CACHE_ENTRIES:
            _masks.popitem(last=False)
    return mask


class DenseSearch:
    """One question against one tenant's vectors, ranked per search bucket (see ``rank``)."""

    def __init__(self, session: Session, *, tenant_id: int, question: str, change_seq: int) -> None:
        model_name = get_settings().embedding_model
        try:
            embedder = get_embedder(model_name)
            self._query = np.asarray(embedder.embed_query(question), dtype=np.float32)
        except EmbeddingProviderError as exc:
            raise DenseUnavailable(f"dense channel skipped: embedding model unavailable ({exc})") from None
        self._session = session
        self._tenant_id = tenant_id
        self._model = embedder.name
        self._dims = int(self._query.shape[0])
        docs, version = _stats(session, tenant_id=tenant_id, model=self._model)
        if docs <= 0:
            raise DenseUnavailable(f"dense channel skipped: no embeddings stored for model '{self._model}'")
        self._exact = docs <= get_settings().dense_exact_max_docs or self._dims not in HNSW_DIMS
        self._change_seq = change_seq
        self._scores: dict[bool, np.ndarray] = {}
        self._pool: dict[str, list[tuple[str, float]]] | None = None
        if self._exact:
            self._matrix = _cached_matrix(
                session, tenant_id=tenant_id, model=self._model, dims=self._dims, version=version
            )
            if not self._matrix.memories.ids and not self._matrix.entities.ids:
                raise DenseUnavailable(
                    f"dense channel skipped: stored embeddings of '{self._model}' do not have "
                    f"the question's {self._dims} dimensions"
                )

    def rank(self, bucket: str, limit: int) -> list[tuple[str, float]]:
        """[(id, cosine)] best first, at most ``limit``, of one bucket: ``memories`` and
        ``example_queries`` give memory ids, ``entities`` canonical ids of catalog docs."""
        if limit <= 0:
            return []
        hits = self._exact_rank(bucket, limit) if self._exact else self._hnsw_rank(bucket, limit)
        if bucket == ENTITIES:
            return hits
        return [(doc_id[len(MEMORY_PREFIX) :], score) for doc_id, score in hits]

    def _exact_rank(self, bucket: str, limit: int) -> list[tuple[str, float]]:
        is_entity = bucket == ENTITIES
        side = self._matrix.entities if is_entity else self._matrix.memories
        if not side.ids:
            return []
        if is_entity not in self._scores:
            # One product per side and search; buckets and deeper looks reuse it.
            self._scores[is_entity] = side.matrix @ self._query
        scores = self._scores[is_entity]
        if is_entity:
            rows = np.arange(len(scores))
        else:
            mask = _example_mask(
                self._session,
                tenant_id=self._tenant_id,
                model=self._model,
                matrix=self._matrix,
                change_seq=self._change_seq,
            )
            rows = np.flatnonzero(mask if bucket == EXAMPLE_QUERIES else ~mask)
        sub = scores[rows]
        k = min(limit, len(sub))
        if k == 0:
            return []
        top = np.argpartition(-sub, k - 1)[:k] if k < len(sub) else np.arange(len(sub))
        top = top[np.argsort(-sub[top], kind="stable")]
        return [(side.ids[rows[i]], float(sub[i])) for i in top.tolist()]

    def _hnsw_rank(self, bucket: str, limit: int) -> list[tuple[str, float]]:
        if self._pool is None:
            self._pool = self._hnsw_pool()
        return self._pool.get(bucket, [])[:limit]

    def _hnsw_pool(self) -> dict[str, list[tuple[str, float]]]:
        """One approximate nearest-neighbour query of fixed depth, split into the three buckets.

        A fixed pool (not one filtered query per bucket) keeps the index scan short: filtering a rare
        bucket inside HNSW makes pgvector walk far down the graph. Each bucket's ranking is its part of
        the pool, the same whatever the caps.
        """
        dims = self._dims
        self._session.execute(text(f"SET LOCAL hnsw.ef_search = {HNSW_POOL}"))
        # Every value is written into the SQL text: a prepared, generic plan (psycopg prepares repeated
        # statements) cannot see the query vector and would sort the whole table instead of using HNSW.
        vector = "[" + ",".join(f"{x:.7g}" for x in self._query.tolist()) + "]"
        distance = f"(e.embedding::vector({dims})) <=> '{vector}'::vector({dims})"
        model = self._model.replace("'", "''")
        rows = self._session.execute(
            text(
                f"SELECT n.canonical_id, n.doc_kind, n.dist, {HAS_QUERY_SQL} FROM ("
                f"SELECT e.tenant_id, e.canonical_id, e.doc_kind, {distance} AS dist FROM embeddings AS e "
                f"WHERE e.tenant_id = {int(self._tenant_id)} AND e.model = '{model}' AND e.dims = {dims} "
                f"ORDER BY {distance} LIMIT {HNSW_POOL}) AS n "
                f"LEFT JOIN memories ON memories.tenant_id = n.tenant_id AND n.doc_kind = '{MEMORY_KIND}' "
                f"AND memories.id = substr(n.canonical_id, {len(MEMORY_PREFIX) + 1})"
            )
        ).all()
        pool: dict[str, list[tuple[str, float]]] = {ENTITIES: [], MEMORIES: [], EXAMPLE_QUERIES: []}
        for canonical_id, doc_kind, dist, carries_query in rows:
            if doc_kind != MEMORY_KIND:
                bucket = ENTITIES
            else:
                bucket = EXAMPLE_QUERIES if carries_query else MEMORIES
            pool[bucket].append((canonical_id, 1.0 - float(dist)))
        return {b: sorted(hits, key=lambda hit: (-hit[1], hit[0])) for b, hits in pool.items()}
