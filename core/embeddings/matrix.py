"""The process's one matrix of a tenant's stored vectors, per model: search and linking share it.

A tenant's vectors of one model are kept in numpy, split by side (memories, catalog entities), each row
a unit vector, so an exact cosine ranking (core.search.dense) and a near-duplicate check
(core.embeddings.similarity) are one matrix product. The matrix names the embeddings ``version`` it
reflects: the counter of the tenant's ``search_embedding_stats`` row, moved by every statement that
writes the tenant's embeddings. Every written row is stamped with the version its statement produces
(migration 0013), so bringing a matrix from version V to a newer one reads exactly the rows stamped above
V: under a steady write load a search reads the few vectors saved since the last one, not the corpus.

Vectors travel in pgvector's binary form (``vector_send``) on a binary cursor: no float parsing. They come
with the stats row of the same snapshot, so a matrix is labelled with exactly the version it holds, and
concurrent writes never make a refresh look like a deletion.

A matrix is never changed once published (searches in other threads may be reading it). Rows added by a
refresh are written past the end of the rows an older matrix uses, in a buffer the two share, when the
older one is the last that grew it; replacing a row's vector (a re-embedded memory) copies. A deleted
vector is noticed by the count of stored vectors, and the matrix is read whole again.

Matrices are cached per (tenant, model, dims) in a cache bounded by tenants and bytes (core.caches).

A buffer stores its vectors column by column (``dims`` x rows, each vector one column): a search's product
with one query vector then streams the buffer once in order (BLAS gemv on the transposed view), where the
row-by-row layout took 2-2.5x as long once the matrix had left the CPU cache, as it has by the next search.
``Side.matrix`` is the (rows, dims) view of it, as before.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from core.caches import BoundedCache
from core.config import get_settings
from core.embeddings.wire import decode_vectors, driver_connection
from core.refs import MEMORY_PREFIX

MEMORY_KIND = "memory"
# Headroom a grown buffer gets (a quarter of its rows, at least this many), so a stream of saves appends
# in place and copies the matrix only every so often.
_MIN_HEADROOM = 64

# The rows come with the stats row of the same snapshot (one statement): the version they make up to and
# the count of stored vectors, so a matrix is labelled with exactly the version it holds and a vector
# deleted since the base shows as a count that does not add up, whatever commits meanwhile.
_ROWS = """
SELECT e.canonical_id, e.doc_kind, vector_send(e.embedding), s.docs, s.version
FROM search_embedding_stats AS s
LEFT JOIN embeddings AS e ON e.tenant_id = s.tenant_id AND e.model = s.model AND e.dims = %(dims)s{since}
WHERE s.tenant_id = %(tenant)s AND s.model = %(model)s
"""
_ROWS_ALL = _ROWS.format(since="")
_ROWS_SINCE = _ROWS.format(since=" AND e.stamp > %(since)s")


class VectorStats(NamedTuple):
    """The tenant's stored vectors of a model (``docs``), their ``version``, and the tenant's change seq."""

    docs: int
    version: int
    change_seq: int


def vector_stats(session: Session, *, tenant_id: int, model: str) -> VectorStats:
    """Read in one query (zeros for a tenant that is gone)."""
    row = session.execute(
        text(
            "SELECT t.change_seq, s.docs, s.version FROM tenants AS t LEFT JOIN search_embedding_stats AS s "
            "ON s.tenant_id = t.id AND s.model = :m WHERE t.id = :t"
        ),
        {"t": tenant_id, "m": model},
    ).first()
    if row is None:
        return VectorStats(0, 0, 0)
    return VectorStats(docs=int(row[1] or 0), version=int(row[2] or 0), change_seq=int(row[0] or 0))


@dataclass
class _Buffer:
    """Rows shared by the matrices of one lineage; ``used`` rows of ``data`` are claimed. A lineage starts
    with a matrix read whole; a refresh keeps every row where it was (appending, or copying in order), so
    within one lineage row ``r`` is the same doc in every matrix that has it."""

    data: np.ndarray  # (dims, capacity): vector of row r in column r (see the module docstring)
    rows: dict[str, int]
    used: int
    lineage: int
    lock: threading.Lock = field(default_factory=threading.Lock)


_lineages = itertools.count(1)


class Side:
    """One side of a matrix: ``ids`` and their unit vectors (``matrix``), row for row."""

    __slots__ = ("ids", "memory_ids", "n", "_buffer")

    def __init__(self, ids: list[str], memory_ids: list[str], buffer: _Buffer) -> None:
        self.ids = ids
        # The ids without their ``memory:`` prefix (memory ids, as the memory buckets rank them).
        self.memory_ids = memory_ids
        self.n = len(ids)
        self._buffer = buffer

    @property
    def rows(self) -> dict[str, int]:
        """Row by doc id, shared with the other sides of the lineage: a row at or past ``n`` is not this side's."""
        return self._buffer.rows

    @property
    def lineage(self) -> int:
        """Sides of one lineage agree on the doc of every row they both have (see _Buffer)."""
        return self._buffer.lineage

    @property
    def matrix(self) -> np.ndarray:
        """(n, dims), a view of the buffer's first ``n`` columns (use whole or by ``matrix[rows]``)."""
        return self._buffer.data[:, : self.n].T

    def row(self, doc_id: str) -> int | None:
        """The row of ``doc_id``, None when this side does not hold it."""
        row = self._buffer.rows.get(doc_id)
        return row if row is not None and row < self.n else None

    def __contains__(self, doc_id: object) -> bool:
        return isinstance(doc_id, str) and self.row(doc_id) is not None

    @property
    def nbytes(self) -> int:
        return int(self._buffer.data.nbytes) + 100 * self.n


@dataclass(frozen=True)
class TenantMatrix:
    version: int
    memories: Side
    entities: Side


def _stripped(ids: Sequence[str]) -> list[str]:
    return [doc_id[len(MEMORY_PREFIX) :] if doc_id.startswith(MEMORY_PREFIX) else doc_id for doc_id in ids]


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero), as float32."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)


def side_of(ids: list[str], vectors: np.ndarray, *, dims: int, headroom: int = 0) -> Side:
    """A new side holding ``ids`` (distinct) and their vectors, normalised."""
    data = np.zeros((dims, len(ids) + headroom), dtype=np.float32)
    if ids:
        data[:, : len(ids)] = unit_rows(vectors).T
    rows = {d: n for n, d in enumerate(ids)}
    return Side(list(ids), _stripped(ids), _Buffer(data=data, rows=rows, used=len(ids), lineage=next(_lineages)))


def merged(side: Side, ids: list[str], vectors: np.ndarray) -> Side:
    """``side`` with these rows replaced or added (the last of a repeated id wins); ``side`` is unchanged."""
    if not ids:
        return side
    last = {doc_id: n for n, doc_id in enumerate(ids)}
    fresh = unit_rows(vectors[list(last.values())])
    new_ids = list(last)
    added = [doc_id for doc_id in new_ids if side.row(doc_id) is None]
    if len(added) == len(new_ids):
        buffer = side._buffer
        with buffer.lock:
            if buffer.used == side.n and side.n + len(new_ids) <= buffer.data.shape[1]:
                buffer.data[:, side.n : side.n + len(new_ids)] = fresh.T
                for n, doc_id in enumerate(new_ids, start=side.n):
                    buffer.rows[doc_id] = n
                buffer.used = side.n + len(new_ids)
                return Side([*side.ids, *new_ids], [*side.memory_ids, *_stripped(new_ids)], buffer)
    all_ids = [*side.ids, *added]
    data = np.zeros((fresh.shape[1], len(all_ids) + max(_MIN_HEADROOM, len(all_ids) // 4)), dtype=np.float32)
    data[:, : side.n] = side._buffer.data[:, : side.n]
    rows = {doc_id: n for n, doc_id in enumerate(all_ids)}
    data[:, [rows[doc_id] for doc_id in new_ids]] = fresh.T
    buffer = _Buffer(data=data, rows=rows, used=len(all_ids), lineage=side.lineage)
    return Side(all_ids, [*side.memory_ids, *_stripped(added)], buffer)


def _matrix_bytes(matrix: TenantMatrix) -> int:
    return matrix.memories.nbytes + matrix.entities.nbytes


_cache: BoundedCache[TenantMatrix] = BoundedCache(
    "dense_matrices",
    max_entries=lambda: get_settings().dense_cache_max_tenants,
    max_bytes=lambda: get_settings().dense_cache_max_mb * 2**20,
    weigh=_matrix_bytes,
)


class _Read(NamedTuple):
    sides: dict[bool, tuple[list[str], np.ndarray]]  # by side (True: memories), ids and vectors
    docs: int
    version: int


def _read(session: Session, sql: str, params: dict[str, Any], dims: int) -> _Read:
    with driver_connection(session).cursor(binary=True) as cursor:
        rows = cursor.execute(sql, params).fetchall()
    docs, version = (int(rows[0][3]), int(rows[0][4])) if rows else (0, 0)
    rows = [row for row in rows if row[0] is not None]
    sides: dict[bool, tuple[list[str], np.ndarray]] = {}
    for memory_side in (True, False):
        picked = [row for row in rows if (row[1] == MEMORY_KIND) is memory_side]
        sides[memory_side] = ([row[0] for row in picked], decode_vectors([row[2] for row in picked], dims))
    return _Read(sides=sides, docs=docs, version=version)


def load_matrix(session: Session, *, tenant_id: int, model: str, dims: int) -> TenantMatrix:
    """The tenant's vectors of ``model`` and ``dims`` read whole, at the version of the same snapshot."""
    read = _read(session, _ROWS_ALL, {"tenant": tenant_id, "model": model, "dims": dims}, dims)
    return TenantMatrix(
        version=read.version,
        memories=side_of(*read.sides[True], dims=dims),
        entities=side_of(*read.sides[False], dims=dims),
    )


def refreshed_matrix(
    session: Session, base: TenantMatrix, *, tenant_id: int, model: str, dims: int
) -> TenantMatrix | None:
    """``base`` brought up to the current version from the rows stamped after its own, or None when the result
    would not hold exactly the tenant's stored vectors (one was deleted since): then it is read whole again."""
    params = {"tenant": tenant_id, "model": model, "dims": dims, "since": base.version}
    read = _read(session, _ROWS_SINCE, params, dims)
    memories = merged(base.memories, *read.sides[True])
    entities = merged(base.entities, *read.sides[False])
    if memories.n + entities.n != read.docs:
        return None
    return TenantMatrix(version=read.version, memories=memories, entities=entities)


# One refresh of a tenant's matrix at a time (locks striped by key): a search that finds one running uses the
# matrix before it instead of waiting, or of copying the same rows into a fork of its own.
_REFRESHING = [threading.Lock() for _ in range(64)]


def tenant_matrix(session: Session, *, tenant_id: int, model: str, dims: int, version: int) -> TenantMatrix:
    """The tenant's matrix at embeddings ``version`` (the caller's read of it) or newer: cached, else refreshed
    from an older cached one with the rows written since, else read whole.

    While another thread of this process refreshes the tenant's matrix, the cached one before it is returned
    as it is (never waited for): it lacks at most the vectors written meanwhile, and a doc without a vector
    is a blind spot of the dense channel, never held against it (core.search.fusion), as for a search
    started a moment earlier.
    """
    key = (tenant_id, model, dims)
    hit = _cache.get(key)
    if hit is not None and hit.version >= version:
        return hit
    lock = _REFRESHING[hash(key) % len(_REFRESHING)]
    if not lock.acquire(blocking=False):
        if hit is not None:
            return hit
        return load_matrix(session, tenant_id=tenant_id, model=model, dims=dims)  # cold and busy: no waiting
    try:
        latest = _cache.get(key)
        if latest is not None and latest.version >= version:
            return latest
        matrix = None
        if latest is not None:
            matrix = refreshed_matrix(session, latest, tenant_id=tenant_id, model=model, dims=dims)
        if matrix is None:
            matrix = load_matrix(session, tenant_id=tenant_id, model=model, dims=dims)
        _cache.put(key, matrix)
        return matrix
    finally:
        lock.release()


def cached_keys() -> list[Any]:
    return _cache.keys()


def cached(key: Any) -> TenantMatrix | None:
    return _cache.get(key)


def clear_cache() -> None:
    _cache.clear()
