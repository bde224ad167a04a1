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

A buffer stores each vector twice, row by row: as float32 (``Side.matrix``, the vectors themselves), and as
int8 codes with a scale per row (``Side.approximate``). A search's scan of every row reads the codes: a quarter
of the bytes, which on this kind of machine is what the scan's time follows (the float32 scan streamed ~15 MB
at 10k memories and 384 dims, and pushed the rest of the search out of the CPU cache). Each approximate score
comes with a bound on its error, so the caller can find the rows whose exact score could rank and compute just
those from the float32 rows (core.search.dense). The codes are packed for numkong's int8 kernel in chunks of
``PACK_ROWS`` rows: a full chunk once per buffer, the rows after the last full chunk as they grow (see Side._packed).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numkong
import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from core.caches import BoundedCache
from core.config import get_settings
from core.embeddings.wire import decode_vectors, driver_connection
from core.refs import MEMORY_PREFIX

MEMORY_KIND = "memory"
# From this many rows, a search scans a side through its int8 codes (core.search.dense); below, the float32 rows (a
# few MB) cost less to scan than the codes and the rescoring of the rows that could rank, and no codes are made.
APPROXIMATE_MIN_ROWS = 4096
# Rows per packed chunk of int8 codes (see the module docstring): a side that ends mid-chunk packs that chunk's
# rows itself, at most this many (~3 µs per 100 rows at 384 dims).
PACK_ROWS = 2048
# Rows past a buffer's packed tail that a scan scores from their float32 vectors before it packs the tail again.
EXACT_TAIL_ROWS = 128
# Dims of a buffer's rows kept in float32 beside the codes (see quantised).
HEAVY_DIMS = 4
# What float32 arithmetic may add to an approximate score's error beyond its bound (see Side.approximate).
_ROUNDING = 1e-5
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

    data: np.ndarray  # (capacity, dims) float32: the vector of row r
    rows: dict[str, int]
    used: int
    lineage: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The rows as int8 codes, made by the first approximate scan (Side.approximate), then kept with the rows.
    codes: Codes | None = None
    # Packed codes of each full chunk of PACK_ROWS rows, by chunk (rows below ``used`` never change), and of the
    # rows from the last full chunk's end up to some row: (that first row, the row past the last, the pack).
    packed: dict[int, Any] = field(default_factory=dict)
    tail: tuple[int, int, Any] | None = None


class Codes(NamedTuple):
    """Rows quantised to int8 (see :func:`quantised`), aligned with a buffer's rows."""

    heavy: np.ndarray  # (h,): the dims kept in float32, those of the largest values over the rows
    codes: np.ndarray  # (capacity, dims) int8, zero at the heavy dims
    scales: np.ndarray  # (capacity,) float32: row r but its heavy dims is about codes[r] * scales[r]
    residuals: np.ndarray  # (capacity,) float32: the length of what that leaves out
    kept: np.ndarray  # (capacity, h) float32: row r at the heavy dims

    def write(self, at: list[int] | slice, vectors: np.ndarray) -> None:
        """Code ``vectors`` into rows ``at``."""
        for column, values in zip(self[1:], quantised(vectors, self.heavy), strict=True):
            column[at] = values

    def copy(self, capacity: int, rows: int) -> Codes:
        """These codes' first ``rows`` rows in arrays of ``capacity`` rows."""
        out = _empty_codes(capacity, self.codes.shape[1], self.heavy)
        for new, kept in zip(out[1:], self[1:], strict=True):
            new[:rows] = kept[:rows]
        return out


def quantised(vectors: np.ndarray, heavy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ``codes``, ``scales``, ``residuals`` and ``kept`` of :class:`Codes` for unit ``vectors``: the ``heavy``
    dims kept as they are, each row's others as int8 codes times a scale of its own (their largest magnitude over
    127), and the length of the rounding that leaves out. Models often put much of a vector's length in a few
    dims, the same for every vector (the bundled model's first dims, say): kept apart, they no longer set the
    scale of every other dim, and the residuals shrink ~2.3x. A zero row gets zero codes, scale and residual."""
    kept = np.ascontiguousarray(vectors[:, heavy])
    rest = np.array(vectors, dtype=np.float32)
    rest[:, heavy] = 0
    peak = np.abs(rest).max(axis=1) if rest.size else np.zeros(len(rest), dtype=np.float32)
    scales = (peak / 127).astype(np.float32)
    # (Each row's peak codes as ±127 exactly: no code needs clipping. numpy casts int8 to float slowly here, so
    # the rounding is undone from the rounded floats.)
    rounded = np.rint(rest / np.where(scales > 0, scales, 1).astype(np.float32)[:, None])
    rest -= rounded * scales[:, None]
    residuals = np.sqrt(np.einsum("ij,ij->i", rest, rest)).astype(np.float32)
    return rounded.astype(np.int8), scales, residuals, kept


def _empty_codes(capacity: int, dims: int, heavy: np.ndarray) -> Codes:
    return Codes(
        heavy,
        np.zeros((capacity, dims), dtype=np.int8),
        np.zeros(capacity, dtype=np.float32),
        np.zeros(capacity, dtype=np.float32),
        np.zeros((capacity, len(heavy)), dtype=np.float32),
    )


def _put(buffer: _Buffer, at: list[int] | slice, vectors: np.ndarray) -> None:
    """Write unit ``vectors`` into rows ``at`` of the buffer: float32, and codes when the buffer has them."""
    buffer.data[at] = vectors
    if buffer.codes is not None:
        buffer.codes.write(at, vectors)


def _codes(buffer: _Buffer) -> Codes:
    """The buffer's codes, made for its rows so far at the first call (its heavy dims chosen from those rows)."""
    codes = buffer.codes
    if codes is None:
        with buffer.lock:  # (rows are appended under it)
            codes = buffer.codes
            if codes is None:
                rows = buffer.data[: buffer.used]
                weight = np.einsum("ij,ij->j", rows, rows)
                heavy = np.sort(np.argsort(-weight, kind="stable")[: min(HEAVY_DIMS, rows.shape[1])])
                capacity, dims = buffer.data.shape
                codes = _empty_codes(capacity, dims, heavy)
                codes.write(slice(0, buffer.used), rows)
                buffer.codes = codes
    return codes


class ScanError(NamedTuple):
    """How far the scores of an approximate scan (Side.approximate) may be from the exact products.

    Without the heavy dims (scored apart, in float32), the query is coded in two int8 rows (:func:`_query_codes`),
    ``q = q' + e``, and a row is ``m = m' + d`` with ``|d|`` its residual. The products of the codes are exact
    integers, so a score's error is ``e.m + q'.d``, at most ``|e| |m| + |q'| |d|`` (Cauchy-Schwarz; a stored row
    is a unit vector or zero), plus float32 rounding.
    """

    residuals: np.ndarray  # ``|d|`` of each row of the side (but its heavy dims, scored apart: see Codes)
    coded_norm: float  # ``|q'|``
    rest: float  # ``|e|``
    worst: float  # the bound with the side's largest residual, less the rounding (see ``bound``)

    @property
    def bound(self) -> float:
        """A bound on every score's error."""
        return self.worst + _ROUNDING

    def bounds(self, residuals: np.ndarray) -> np.ndarray:
        """The bound on the error of a score from a row of these residuals."""
        return residuals * self.coded_norm + (self.rest + _ROUNDING)


def _query_codes(query: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The query as two rows of int8 codes, the second coding what the first leaves out, with their scales: the
    query's own rounding then adds next to nothing to a score's error. Returns (codes (2, dims), scales (2,) as
    float32, the length of what the codes make of the query, the length of what they leave out)."""
    codes = np.zeros((2, len(query)), dtype=np.int8)
    scales = np.zeros(2, dtype=np.float32)
    rest = query.astype(np.float64)
    for i in range(2):
        peak = float(np.abs(rest).max()) if len(rest) else 0.0
        if peak == 0.0:
            break
        scale = np.float32(peak / 127)
        if scale == 0:  # (a subnormal peak: what is left stays in the rest, and in the bound)
            break
        rounded = np.rint(rest * (1 / float(scale)))  # (within ±127: the peak's own code is ±127)
        codes[i], scales[i] = rounded, scale
        rest -= rounded * float(scale)
    coded = query - rest
    return codes, scales, math.sqrt(float(coded @ coded)), math.sqrt(float(rest @ rest))


_lineages = itertools.count(1)


class Side:
    """One side of a matrix: ``ids`` and their unit vectors (``matrix``), row for row."""

    __slots__ = ("ids", "memory_ids", "n", "_buffer", "_residual")

    def __init__(self, ids: list[str], memory_ids: list[str], buffer: _Buffer) -> None:
        self.ids = ids
        # The ids without their ``memory:`` prefix (memory ids, as the memory buckets rank them).
        self.memory_ids = memory_ids
        self.n = len(ids)
        self._buffer = buffer
        self._residual: float | None = None  # the largest residual of its rows' codes (see approximate)

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
        """(n, dims), a view of the buffer's first ``n`` rows."""
        return self._buffer.data[: self.n]

    def approximate(self, query: np.ndarray) -> tuple[np.ndarray, ScanError]:
        """(scores, error): every row's dot product with ``query``, from the int8 codes, and how far from the exact
        products they may be (:class:`ScanError`). The few rows past the last packed ones (see ``_packed``) are
        scored from their float32 vectors: exact, within any bound."""
        n = self.n
        if n == 0:
            return np.zeros(0, dtype=np.float32), ScanError(np.zeros(0, dtype=np.float32), 0.0, 0.0, 0.0)
        codes = _codes(self._buffer)
        rest_of_query = query.copy()
        rest_of_query[codes.heavy] = 0
        query_codes, scales, coded_norm, rest = _query_codes(rest_of_query)
        packs, packed = self._packed(codes)
        dots = [np.asarray(numkong.dots_packed(query_codes, pack)) for pack in packs]
        scores = scales @ (dots[0] if len(dots) == 1 else np.concatenate(dots, axis=1)).astype(np.float32)
        scores *= codes.scales[:packed]
        scores += codes.kept[:packed] @ query[codes.heavy]
        if packed < n:
            scores = np.concatenate([scores, self._buffer.data[packed:n] @ query])
        if self._residual is None:
            self._residual = float(codes.residuals[:n].max())
        return scores, ScanError(codes.residuals[:n], coded_norm, rest, self._residual * coded_norm + rest)

    def _packed(self, codes: Codes) -> tuple[list[Any], int]:
        """The side's codes packed for numkong, and how many rows they cover (at least all but EXACT_TAIL_ROWS).

        The full chunks of PACK_ROWS rows are packed once per buffer. The rows past them are packed together as
        the buffer's tail, which the next sides reuse while it leaves at most EXACT_TAIL_ROWS of their rows out:
        under a stream of saves, each search's side has a row or two more than the last one's, and those are
        scored exactly instead of the whole tail being packed again."""
        buffer, n = self._buffer, self.n
        full = n // PACK_ROWS
        packs = []
        for chunk in range(full):
            pack = buffer.packed.get(chunk)
            if pack is None:
                rows = codes.codes[chunk * PACK_ROWS : (chunk + 1) * PACK_ROWS]
                pack = buffer.packed.setdefault(chunk, numkong.dots_pack(rows))
            packs.append(pack)
        start = full * PACK_ROWS
        if start == n:
            return packs, n
        tail = buffer.tail
        if tail is not None and tail[0] == start and tail[1] <= n <= tail[1] + EXACT_TAIL_ROWS:
            packs.append(tail[2])
            return packs, tail[1]
        pack = numkong.dots_pack(np.ascontiguousarray(codes.codes[start:n]))
        if tail is None or tail[0] != start or tail[1] < n:
            buffer.tail = (start, n, pack)
        packs.append(pack)
        return packs, n

    def row(self, doc_id: str) -> int | None:
        """The row of ``doc_id``, None when this side does not hold it."""
        row = self._buffer.rows.get(doc_id)
        return row if row is not None and row < self.n else None

    def __contains__(self, doc_id: object) -> bool:
        return isinstance(doc_id, str) and self.row(doc_id) is not None

    @property
    def nbytes(self) -> int:
        buffer = self._buffer
        if buffer.codes is not None:
            coded = sum(column.nbytes for column in buffer.codes[1:])
        elif self.n >= APPROXIMATE_MIN_ROWS:  # (made by its first search: counted from the start)
            capacity, dims = buffer.data.shape
            coded = capacity * (dims + 8 + 4 * HEAVY_DIMS)
        else:
            coded = 0
        return int(buffer.data.nbytes) + coded + 100 * self.n


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
    buffer = _Buffer(
        data=np.zeros((len(ids) + headroom, dims), dtype=np.float32),
        rows={d: n for n, d in enumerate(ids)},
        used=len(ids),
        lineage=next(_lineages),
    )
    if ids:
        _put(buffer, slice(0, len(ids)), unit_rows(vectors))
    return Side(list(ids), _stripped(ids), buffer)


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
            if buffer.used == side.n and side.n + len(new_ids) <= buffer.data.shape[0]:
                _put(buffer, slice(side.n, side.n + len(new_ids)), fresh)
                for n, doc_id in enumerate(new_ids, start=side.n):
                    buffer.rows[doc_id] = n
                buffer.used = side.n + len(new_ids)
                return Side([*side.ids, *new_ids], [*side.memory_ids, *_stripped(new_ids)], buffer)
    all_ids = [*side.ids, *added]
    capacity, dims = len(all_ids) + max(_MIN_HEADROOM, len(all_ids) // 4), fresh.shape[1]
    old = side._buffer
    rows = {doc_id: n for n, doc_id in enumerate(all_ids)}
    buffer = _Buffer(
        data=np.zeros((capacity, dims), dtype=np.float32), rows=rows, used=len(all_ids), lineage=side.lineage
    )
    buffer.data[: side.n] = old.data[: side.n]
    if old.codes is not None:  # (a side with codes keeps them: its copy will be scanned the same way)
        buffer.codes = old.codes.copy(capacity, side.n)
    _put(buffer, [rows[doc_id] for doc_id in new_ids], fresh)
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
