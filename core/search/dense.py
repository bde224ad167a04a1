"""Channel 3: cosine similarity between the question and the tenant's stored embeddings.

Only rows of the active embedding model count (rows of an older model are inert). Two strategies,
chosen by the number of stored vectors of the tenant and model (``search_embedding_stats``):

* up to ``dense_exact_max_docs``: exact cosine in numpy over the process's matrix of the tenant's
  vectors (core.embeddings.matrix, shared with similarity linking), kept at the stats row's
  ``version`` by reading only the vectors written since, so a query does not reload the vectors. From
  APPROXIMATE_MIN_ROWS memory rows, the scan of every row reads their int8 codes, a quarter of the bytes, and
  the rows that could rank are then scored from their float32 vectors (``refined_top``): the same ranking and
  scores as scoring every row in float32, to float32 rounding;
* above: pgvector's HNSW index on ``embedding::vector(dims)`` (migration 0003), filtered by tenant,
  model and doc kind in the query, with ``hnsw.ef_search`` set for the depth asked and iterative
  scans so filtering does not starve the result.

Either way each doc kind side (memories, catalog entities) is ranked on its own, so one side never
takes the other's depth. Any reason the channel cannot run raises :class:`DenseUnavailable`.

On the exact path, two query-side refinements (stored vectors stay the embedding of a memory's content
alone, so content hashes and convergence are untouched):

* run context: a memory's cosine is blended with the mean cosine of its neighbours in the same episode (its
  run, or the memories given the same explicit event time, see core.search.index.episode_of; the
  window full-text lends it, ``CONTEXT_TURNS``), as a conversation turn often makes sense only with the
  turns around it (``with_context``);
* feedback: the question's vector is moved towards the mean vector of the bucket's first eligible
  full-text hits (Rocchio pseudo-relevance feedback), which the caller gives per bucket.

Both need the memory layout (bucket and run neighbours of every row), read in one query and cached per
(embeddings version, tenant change seq); the approximate path uses neither.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import Executable, or_, select, text
from sqlalchemy.orm import Session

from core import sql
from core.caches import BoundedCache
from core.changes import feed_range, feed_values
from core.config import get_settings
from core.db import driver_connection
from core.embeddings.matrix import APPROXIMATE_MIN_ROWS, ScanError, Side, TenantMatrix, tenant_matrix, vector_stats
from core.embeddings.matrix import clear_cache as clear_matrices
from core.embeddings.providers import Embedder, EmbeddingProviderError, get_embedder
from core.memories.models import Memory
from core.native import single_threaded_blas
from core.refs import MEMORY_PREFIX
from core.search.facts import Fed, feed_after
from core.search.filters import EXAMPLE_QUERIES, HAS_QUERY_SQL, IN_EPISODE_SQL, MEMORIES, has_query
from core.search.index import CONTEXT_TURNS, episode_of

MEMORY_KIND = "memory"
ENTITIES = "entities"
HNSW_DIMS = frozenset({256, 384, 512, 768, 1024, 1536})
# Depth of the single approximate query above dense_exact_max_docs (see DenseSearch._hnsw_sql).
HNSW_POOL = 200
# How much a memory's exact-path score takes from its run neighbours' mean cosine (see with_context).
CONTEXT_WEIGHT = 0.5
# Pseudo-relevance feedback (Rocchio): the exact path moves the question's vector towards the mean
# vector of a bucket's top full-text hits by this much (see DenseSearch.rank).
FEEDBACK_WEIGHT = 0.5
# What the similarity floor's bound (see floor_verdicts) leaves to an exact product: cosines this close to the
# floor, float32 rounding being ~1e-5 at these dimensions.
FLOOR_MARGIN = 1e-3
# top_rows reads its threshold off every TOP_STRIDE-th score of a ranking of at least TOP_SAMPLE_MIN rows.
TOP_STRIDE = 16
TOP_SAMPLE_MIN = 2048


class DenseUnavailable(Exception):
    """The dense channel cannot run; the message is the warning shown to the caller.

    ``change_seq`` is the tenant's change seq when it was read on the way (see ``DenseSearch``).
    """

    def __init__(self, message: str, *, change_seq: int | None = None) -> None:
        super().__init__(message)
        self.change_seq = change_seq


@dataclass(frozen=True)
class EmbeddingStats:
    """The tenant's stored vectors of ``model`` and their version (``search_embedding_stats``), read by
    the caller with its other first reads; ``model`` None when the embedder could not be named."""

    model: str | None
    docs: int
    version: int


def dense_model() -> str | None:
    """The name the active embedder stores its vectors under (None when it cannot be built)."""
    try:
        return get_embedder(get_settings().embedding_model).name
    except Exception:  # noqa: BLE001 - DenseSearch reports the failure itself
        return None


def clear_cache() -> None:
    clear_matrices()
    _layouts.clear()


MEMORY_BUCKETS = (MEMORIES, EXAMPLE_QUERIES)


@dataclass(frozen=True)
class _Layout:
    """What the memory rows of a matrix need beyond their vectors, for one (version, change_seq).

    ``rows``: per memory bucket, the matrix rows of its memories (example_queries: those carrying a
    query). ``neighbours``: per bucket and aligned with ``rows``, the rows of the memories up to
    ``CONTEXT_TURNS`` before and after each one in its run (the window full-text lends a memory, see
    core.search.index), -1 where there is none; ``has_context`` is False when no row has any.
    """

    version: int
    change_seq: int
    rows: dict[str, np.ndarray]
    neighbours: dict[str, np.ndarray]
    has_context: bool
    # The memories it was made from (those carrying a query, a run id or an explicit event time, not forgotten).
    members: frozenset[str] = frozenset()
    # The matrix rows it covers: the first ``n`` of the memory side of ``lineage`` (core.embeddings.matrix).
    lineage: int = 0
    n: int = 0
    # The change seq from which its members are those of ``change_seq``: no member was written in between, so
    # it holds as well for a search whose snapshot is anywhere from there to ``change_seq``.
    since: int = 0
    # Per bucket of a minority of the rows: (a weak reference to the matrix buffer, its rows' vectors copied
    # column by column), made by the first search that needs it (see DenseSearch._block).
    blocks: dict[str, tuple[weakref.ref[np.ndarray], np.ndarray]] = field(default_factory=dict, compare=False)


class _BucketScores(NamedTuple):
    """A memory bucket's scores (its rows' cosines with ``query``, the question moved by ``feedback``, blended
    with run context when the layout has runs), and how far from exact they may be (``error``: None when they
    are exact, see DenseSearch._refined). ``raw``: every memory row's cosine with ``query`` (as approximate as the
    scores) when context blended the scores, else None (the scores are those); ``neighbours``: the bucket's rows'
    run neighbours then (the layout's)."""

    feedback: tuple[str, ...]
    scores: np.ndarray
    error: ScanError | None
    query: np.ndarray
    raw: np.ndarray | None
    neighbours: np.ndarray | None


def _extended(layout: _Layout, *, n: int, version: int, change_seq: int) -> _Layout:
    """``layout`` over ``n`` rows, the rows past its own being plain memories: each in the memories bucket,
    in no run and nobody's neighbour."""
    if n == layout.n:
        return replace(layout, version=version, change_seq=change_seq)
    added = np.arange(layout.n, n, dtype=np.int64)
    rows = dict(layout.rows)
    neighbours = dict(layout.neighbours)
    rows[MEMORIES] = np.concatenate([layout.rows[MEMORIES], added])
    neighbours[MEMORIES] = np.concatenate(
        [layout.neighbours[MEMORIES], np.full((len(added), 2 * CONTEXT_TURNS), -1, dtype=np.int64)]
    )
    # (The memories bucket's rows changed: its block, if it had one, is not its block any more.)
    blocks = {bucket: held for bucket, held in layout.blocks.items() if bucket != MEMORIES}
    return replace(layout, version=version, change_seq=change_seq, rows=rows, neighbours=neighbours, n=n, blocks=blocks)


def _truncated(layout: _Layout, *, n: int, version: int, change_seq: int) -> _Layout:
    """``layout`` over the first ``n`` of its rows (a search holding a matrix from before the rows past ``n``
    were added): what reading it afresh against that matrix gives, since its members are the same. A member
    whose row is past ``n`` has no vector in that matrix: in no bucket, and a neighbour of nobody (-1)."""
    rows: dict[str, np.ndarray] = {}
    neighbours: dict[str, np.ndarray] = {}
    for bucket, bucket_rows in layout.rows.items():
        held = bucket_rows < n
        rows[bucket] = bucket_rows[held]
        near = layout.neighbours[bucket][held]
        neighbours[bucket] = np.where(near < n, near, -1)
    has_context = any(bool((near >= 0).any()) for near in neighbours.values())
    return replace(
        layout,
        version=version,
        change_seq=change_seq,
        rows=rows,
        neighbours=neighbours,
        has_context=has_context,
        n=n,
        blocks={},
    )


_layouts: BoundedCache[_Layout] = BoundedCache(
    "dense_layouts", max_entries=lambda: get_settings().dense_cache_max_tenants
)
# Memories changed since a layout whose ids a search reads to know whether the layout still holds.
_LAYOUT_CHANGES = text(
    f"SELECT memories.id, memories.status <> 'forgotten' AND ({HAS_QUERY_SQL} OR {IN_EPISODE_SQL}) "
    "FROM memories WHERE memories.tenant_id = :tenant AND " + feed_range("memories.change_seq") + " "
    f"UNION ALL SELECT substr(tombstones.doc_id, {len(MEMORY_PREFIX) + 1}), false FROM tombstones "
    "WHERE tombstones.tenant_id = :tenant AND " + feed_range("tombstones.change_seq") + " "
    f"AND starts_with(tombstones.doc_id, '{MEMORY_PREFIX}')"
)


def layout_feed_queries(tenant_id: int, since: int) -> list[sql.Query]:
    """The memories written after ``since`` (each with whether a layout is made from it), for
    :func:`core.sql.run_many`: what a search asks when the tenant's layout is older than its head."""
    return [sql.Query("layout-changes", lambda: _LAYOUT_CHANGES, feed_values(tenant_id, since), generic=True)]


def held_layout_seq(tenant_id: int, model: str) -> int | None:
    """The change seq of the tenant's layout this process holds for ``model`` (None: none)."""
    hit = _layouts.peek((tenant_id, model))
    return None if hit is None else hit.change_seq


def _still_holds(session: Session, layout: _Layout, *, tenant_id: int, fed: Fed | None = None) -> bool:
    """Whether no memory written since ``layout`` was or now is one of the memories it is made from (a plain
    note saved or edited leaves it as it is); from ``fed`` (:func:`layout_feed_queries`' rows, read with the
    search's head) when it covers where the layout stands."""
    since = layout.change_seq
    (changed,) = feed_after(session, fed, since, lambda: layout_feed_queries(tenant_id, since))
    return not any(member or memory_id in layout.members for memory_id, member in changed)


def _layout(
    session: Session, *, tenant_id: int, model: str, matrix: TenantMatrix, change_seq: int, fed: Fed | None = None
) -> _Layout:
    """The matrix's memory layout, from one query, cached per (embeddings version, change seq); a newer
    change seq whose writes touch none of its members keeps it, and rows added since of plain memories
    extend it. A search whose snapshot or matrix is older than the cached layout's (saves and vectors land
    while it runs) takes it as it was then, when its members were already the same: cut to the search's
    rows, not cached."""
    key = (tenant_id, model)
    side = matrix.memories
    hit = _layouts.get(key)
    if hit is not None and hit.version == matrix.version and hit.change_seq == change_seq:
        return hit
    held: list[bool] = []

    def members_held(hit: _Layout) -> bool:
        """Whether ``hit``'s members are those of this search's change seq (asked of the database at most once)."""
        if not held:
            held.append(
                hit.since <= change_seq <= hit.change_seq
                or (change_seq > hit.change_seq and _still_holds(session, hit, tenant_id=tenant_id, fed=fed))
            )
        return held[0]

    if hit is not None and hit.lineage == side.lineage:
        added_members = any(memory_id in hit.members for memory_id in side.memory_ids[hit.n :])
        if not added_members and members_held(hit):
            if side.n < hit.n:
                if change_seq > hit.change_seq:  # (its members are those of this later state too)
                    _layouts.put(key, replace(hit, change_seq=change_seq))
                return _truncated(hit, n=side.n, version=matrix.version, change_seq=change_seq)
            # Every row it lacks is a plain memory (no member of it, and no member changed since): extended in
            # place of being rebuilt, as under a stream of plain saves whose vectors keep landing.
            kept = _extended(hit, n=side.n, version=matrix.version, change_seq=change_seq)
            if change_seq >= hit.change_seq:
                _layouts.put(key, kept)
            return kept
    found = session.execute(
        select(Memory.id, Memory.run_id, has_query(), Memory.occurred_at, Memory.created_at)
        .where(
            Memory.status != "forgotten",
            or_(has_query(), Memory.run_id.is_not(None), Memory.occurred_at != Memory.created_at),
        )
        .order_by(Memory.run_id, Memory.occurred_at, Memory.created_at, Memory.id)
    ).all()
    mask = np.zeros(side.n, dtype=bool)
    neighbours = np.full((side.n, 2 * CONTEXT_TURNS), -1, dtype=np.int64)
    runs: dict[str, list[int]] = {}
    for memory_id, run_id, carries_query, occurred_at, created_at in found:
        found_row = side.row(MEMORY_PREFIX + memory_id)
        row = -1 if found_row is None else found_row
        if carries_query and row >= 0:
            mask[row] = True
        episode = episode_of(run_id, occurred_at, created_at)
        if episode is not None:
            runs.setdefault(episode, []).append(row)
    for run in runs.values():
        for n, row in enumerate(run):
            if row < 0:
                continue
            window = [*range(n - CONTEXT_TURNS, n), *range(n + 1, n + 1 + CONTEXT_TURNS)]
            for slot, k in enumerate(window):
                if 0 <= k < len(run):
                    neighbours[row, slot] = run[k]
    rows = {MEMORIES: np.flatnonzero(~mask), EXAMPLE_QUERIES: np.flatnonzero(mask)}
    members = frozenset(row[0] for row in found)
    since = change_seq
    if hit is not None and hit.members == members and members_held(hit):
        since = hit.since  # (read again for a member's vector that landed: its members held all along)
    layout = _Layout(
        version=matrix.version,
        change_seq=change_seq,
        rows=rows,
        neighbours={bucket: neighbours[bucket_rows] for bucket, bucket_rows in rows.items()},
        has_context=bool((neighbours >= 0).any()),
        members=members,
        lineage=side.lineage,
        n=side.n,
        since=since,
    )
    latest = _layouts.get(key)
    if latest is None or latest.lineage != layout.lineage or (latest.n <= layout.n and latest.change_seq <= change_seq):
        _layouts.put(key, layout)  # never replaces one covering more rows of the same matrix, or a later state
    return layout


def _block(layout: _Layout, bucket: str, side: Side) -> np.ndarray:
    """The vectors of a bucket's rows as one contiguous (dims, rows) array, copied once per layout and buffer:
    gathering a few thousand scattered rows of the matrix at every search cost more than the product."""
    buffer = side.matrix.base
    held = layout.blocks.get(bucket)
    if held is not None and held[0]() is buffer:
        return held[1]
    block = np.ascontiguousarray(side.matrix[layout.rows[bucket]].T)
    if buffer is not None:
        layout.blocks[bucket] = (weakref.ref(buffer), block)
    return block


def with_context(scores: np.ndarray, neighbours: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Blend each row's cosine with the mean cosine of its run neighbours (weight ``CONTEXT_WEIGHT``).

    ``scores`` covers every row; the result covers ``rows`` (all when None), ``neighbours`` is aligned
    with it. A turn of a conversation is often only recognisable through the turns around it, as on
    the full-text side; a row without neighbours keeps its own cosine.
    """
    own = scores if rows is None else scores[rows]
    valid = neighbours >= 0
    counts = valid.sum(axis=1)
    if not counts.any():
        return own
    gathered = np.where(valid, scores[np.maximum(neighbours, 0)], 0.0).sum(axis=1)
    context = np.where(counts > 0, gathered / np.maximum(counts, 1), own)
    return ((own + CONTEXT_WEIGHT * context) / (1.0 + CONTEXT_WEIGHT)).astype(np.float32)


def top_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """The rows of the ``k`` highest ``scores`` (1 <= k), best first, ties by row.

    numpy's partition of 10,000 floats costs ~75 µs here, five times what picking from a threshold costs: the
    rows scoring at least a value are ranked, when there are ``k`` of them. The value is first read off every
    TOP_STRIDE-th score (a sample whose top holds a few more than k / TOP_STRIDE: ~2k rows pass, whatever the
    order of the scores), else, when the sample misled, it is the k-th highest score itself. Either way every
    row of the top k scores at least the value, so the ranking is that of the whole."""
    n = len(scores)
    if k >= n:
        return np.argsort(-scores, kind="stable")
    candidates = None
    if n >= TOP_SAMPLE_MIN:
        sample = scores[::TOP_STRIDE]
        j = min(len(sample), 2 * (k // TOP_STRIDE) + 8)
        candidates = np.flatnonzero(scores >= np.partition(sample, len(sample) - j)[len(sample) - j])
        if len(candidates) < k:
            candidates = None
    if candidates is None:
        candidates = np.flatnonzero(scores >= np.partition(scores, n - k)[n - k])
    return candidates[np.argsort(-scores[candidates], kind="stable")[:k]]


def refined_top(
    sub: np.ndarray,
    k: int,
    *,
    error: ScanError,
    rows: np.ndarray,
    matrix: np.ndarray,
    query: np.ndarray,
    raw: np.ndarray | None = None,
    neighbours: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top ``k`` (1 <= k <= len(sub)) of a bucket's approximate scores ``sub``, as exact scores would rank them:
    (their places in ``sub``, best first and ties by place as top_rows ranks; their exact scores; their exact
    cosines with ``query``), the same as :func:`top_rows` of exact scores of every row.

    ``sub`` holds the approximate cosines with ``query`` (core.embeddings.matrix, Side.approximate, whose error is
    ``error``) of the ``matrix`` rows ``rows``; with ``raw`` (every row's approximate cosine) and ``neighbours``
    (aligned with ``rows``), the blends of :func:`with_context` of those.

    The k-th highest exact score is at least the k-th highest lower bound of a score (k rows score at least
    theirs), so a row of the top k has an upper bound at least that; only those rows are scored exactly, from
    their float32 vectors (with their run neighbours' for a blend, which is off by at most the largest error of
    what it blends). The bound common to every row first leaves the rows within twice it of the k-th approximate
    score, which hold the k highest lower bounds; each one's own bound (its residual's) then leaves those that
    could rank: ~1.5 k of them at the bench's first looks (k = 60 of 10,000 rows)."""
    places = np.flatnonzero(sub >= sub[top_rows(sub, k)[-1]] - 2 * error.bound)
    picked = rows[places]
    residuals = error.residuals[picked]
    near = None
    if raw is not None:
        assert neighbours is not None
        near = neighbours[places]
        residuals = np.maximum(residuals, np.where(near >= 0, error.residuals[near], 0).max(axis=1))
    bounds, near_sub = error.bounds(residuals), sub[places]
    lower = near_sub - bounds
    could = near_sub + bounds >= np.partition(lower, len(lower) - k)[len(lower) - k]
    places, picked = places[could], picked[could]
    # (einsum scores a row the same wherever it stands among the rows given: BLAS's gemv takes the last few rows
    # by another path, and two memories of the same text would no longer tie, to be ordered by place.)
    if raw is None or near is None:
        exact = moved = np.einsum("ij,j->i", matrix[picked], query)
    else:
        near = near[could]
        wanted = np.concatenate([picked, near[near >= 0]])
        exact_raw = raw.copy()
        exact_raw[wanted] = np.einsum("ij,j->i", matrix[wanted], query)
        exact, moved = with_context(exact_raw, near, picked), exact_raw[picked]
    order = top_rows(exact, k)
    return places[order], exact[order], moved[order]


def floor_verdicts(
    moved_cosines: np.ndarray, moved: np.ndarray, question: np.ndarray, floor: float
) -> tuple[np.ndarray, np.ndarray]:
    """For unit vectors whose cosines with the query vector ``moved`` are ``moved_cosines``: (whose cosine with
    ``question`` is surely at least ``floor``, whose is too close to it to tell from these: compute those).

    Written q = c·m + q⊥ (m the unit ``moved``), a unit v has v·q = c·t + v·q⊥ with t = v·m and
    |v·q⊥| ≤ |q⊥|·sqrt(1 - t²) (Cauchy-Schwarz on v's part orthogonal to m): the cosine lies in that interval.
    Without feedback ``moved`` is the question and the interval is a point."""
    norm = math.sqrt(float(moved @ moved))
    along = float(question @ moved) / norm
    across = math.sqrt(max(0.0, float(question @ question) - along * along))
    t = moved_cosines * (1.0 / norm)
    centre = t * along
    spread = np.sqrt(np.maximum(1.0 - t * t, 0.0)) * across
    surely = centre - spread >= floor + FLOOR_MARGIN
    unsure = ~surely & (centre + spread >= floor - FLOOR_MARGIN)
    return surely, unsure


def _seen_sql() -> Executable:
    """Which of the ids (``ids``) have a vector of the model (``m``, ``d``) stored for the tenant (``t``)."""
    return text(
        "SELECT canonical_id FROM embeddings WHERE tenant_id = :t AND model = :m AND dims = :d "
        "AND canonical_id = ANY(:ids)"
    ).bindparams(sql.text_array("ids"))


def _sees_not(row: Callable[[str], int | None], n: int, prefix: str) -> Callable[[str], bool]:
    """Whether a doc has no row below ``n`` of a matrix side (``row``: its row by doc id, ``prefix``: of its id)."""

    def sees_not(doc_id: str) -> bool:
        found = row(prefix + doc_id)
        return found is None or found >= n

    return sees_not


def similarity_floor(embedder: Embedder) -> float:
    """The cosine below which dense does not rank a doc: the deployment's override, else the model's own."""
    override = get_settings().dense_similarity_floor
    return embedder.similarity_floor if override is None else override


class DenseSearch:
    """One question against one tenant's vectors, ranked per search bucket (see ``rank``)."""

    def __init__(
        self,
        session: Session,
        *,
        tenant_id: int,
        question: str,
        change_seq: int | None = None,
        stats: EmbeddingStats | None = None,
        fed: Fed | None = None,
    ) -> None:
        settings = get_settings()
        model_name = settings.embedding_model
        try:
            embedder = get_embedder(model_name)
            # A doc less like the question than this is not ranked (an unrelated question still has neighbours).
            self._floor = similarity_floor(embedder)
            self._query = np.asarray(embedder.embed_query(question), dtype=np.float32)
        except EmbeddingProviderError as exc:
            raise DenseUnavailable(f"dense channel skipped: embedding model unavailable ({exc})") from None
        self._session = session
        self._fed = fed
        self._tenant_id = tenant_id
        self._model = embedder.name
        self._dims = int(self._query.shape[0])
        if stats is not None and stats.model == self._model and change_seq is not None:
            docs, version, tenant_seq = stats.docs, stats.version, change_seq
        else:
            docs, version, tenant_seq = vector_stats(session, tenant_id=tenant_id, model=self._model)
        # The tenant's change seq (keys the memory layout): the caller's, else the one just read.
        self.change_seq = tenant_seq if change_seq is None else change_seq
        if docs <= 0:
            raise DenseUnavailable(
                f"dense channel skipped: no embeddings stored for model '{self._model}'", change_seq=self.change_seq
            )
        self._exact = docs <= get_settings().dense_exact_max_docs or self._dims not in HNSW_DIMS
        self._entity_scores: np.ndarray | None = None
        # Per memory bucket: how its rows were last scored (see _BucketScores).
        self._bucket_scores: dict[str, _BucketScores] = {}
        self._products: dict[tuple[str, ...], tuple[np.ndarray, ScanError | None]] = {}
        # Per minority bucket: its rows' vectors, contiguous (see _block), once its scores were computed.
        self._blocks: dict[str, np.ndarray] = {}
        self._pool: dict[str, list[tuple[str, float]]] | None = None
        if self._exact:
            single_threaded_blas()
            self._matrix = tenant_matrix(
                session, tenant_id=tenant_id, model=self._model, dims=self._dims, version=version
            )
            if not self._matrix.memories.ids and not self._matrix.entities.ids:
                raise DenseUnavailable(
                    f"dense channel skipped: stored embeddings of '{self._model}' do not have "
                    f"the question's {self._dims} dimensions",
                    change_seq=self.change_seq,
                )

    def rank(self, bucket: str, limit: int, feedback: Sequence[str] = ()) -> list[tuple[str, float]]:
        """[(id, score)] best first, at most ``limit``, of one bucket: ``memories`` and
        ``example_queries`` give memory ids, ``entities`` canonical ids of catalog docs.

        ``feedback`` (memory buckets only): memory ids taken as relevant (the bucket's first eligible full-text
        hits, given by the caller per call). On the exact path the question's vector is moved towards their
        mean vector (Rocchio pseudo-relevance feedback), which lets the static model see the vocabulary of the
        turns that answer; the approximate path ignores it. Scores are cosines, for memories blended with
        their run context (``with_context``).
        """
        if limit <= 0:
            return []
        if self._exact:
            return self._exact_rank(bucket, limit, tuple(feedback))
        hits = self._hnsw_rank(bucket, limit)
        if bucket == ENTITIES:
            return hits
        return [(doc_id[len(MEMORY_PREFIX) :], score) for doc_id, score in hits]

    def blind(self, bucket: str, candidates: Sequence[str]) -> Callable[[str], bool]:
        """Whether this channel cannot see a doc of ``bucket`` at all (no vector of the model stored yet):
        such a doc is neither ranked nor to be counted against (core.search.fusion.relevance).

        Exact path: the doc has no row in the matrix. Approximate path: one query tells which of the
        ``candidates`` outside the pool have a vector (entities are embedded by their ingest: all seen).
        """
        return self.blinds({bucket: candidates})[bucket]

    def blinds(self, candidates: dict[str, Sequence[str]]) -> dict[str, Callable[[str], bool]]:
        """:meth:`blind` for several buckets, each with its candidates: on the approximate path one query
        for all of them."""
        if self._exact:
            out = {}
            for bucket in candidates:
                side = self._matrix.entities if bucket == ENTITIES else self._matrix.memories
                out[bucket] = _sees_not(side.rows.get, side.n, "" if bucket == ENTITIES else MEMORY_PREFIX)
            return out
        never: Callable[[str], bool] = lambda doc_id: False  # noqa: E731
        unknown: dict[str, set[str]] = {}
        for bucket, docs in candidates.items():
            if bucket != ENTITIES:
                pooled = {doc_id for doc_id, _ in self._hnsw_rank(bucket, HNSW_POOL)}
                unknown[bucket] = {MEMORY_PREFIX + d for d in docs if d not in pooled}
        asked = sorted(set().union(*unknown.values()))
        found = set()
        if asked:
            values = {"t": self._tenant_id, "m": self._model, "d": self._dims, "ids": asked}
            found = {row[0] for row in sql.run(self._session, sql.Query("dense-seen", _seen_sql, values))}
        out = {}
        for bucket in candidates:
            missing = {doc_id[len(MEMORY_PREFIX) :] for doc_id in unknown.get(bucket, set()) - found}
            out[bucket] = missing.__contains__ if missing else never
        return out

    def _query_for(self, side: Side, feedback: Sequence[str]) -> np.ndarray:
        found = (side.row(MEMORY_PREFIX + f) for f in feedback)
        rows = [row for row in found if row is not None]
        if not rows:
            return self._query
        moved = self._query + FEEDBACK_WEIGHT * side.matrix[rows].mean(axis=0)
        norm = float(np.linalg.norm(moved))
        return self._query if norm < 1e-12 else (moved / norm).astype(np.float32)

    def _scores_of(self, bucket: str, feedback: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, bool]:
        """(matrix rows of the bucket, their scores, whether those are exact), computed once per search, side and
        feedback."""
        if bucket == ENTITIES:
            if self._entity_scores is None:
                self._entity_scores = self._matrix.entities.matrix @ self._query
            return np.arange(len(self._entity_scores)), self._entity_scores, True
        layout = _layout(
            self._session,
            tenant_id=self._tenant_id,
            model=self._model,
            matrix=self._matrix,
            change_seq=self.change_seq,
            fed=self._fed,
        )
        cached = self._bucket_scores.get(bucket)
        if cached is None or cached.feedback != feedback:
            # One scan of the rows per bucket and feedback (a change of feedback recomputes), approximate: the
            # rows that could rank are scored exactly after (_refined). How a bucket's scores are computed depends
            # only on the corpus (the bucket's share of the rows, whether runs lend context), never on whether
            # the other bucket was asked for.
            side, rows = self._matrix.memories, layout.rows[bucket]
            query = self._query_for(side, feedback)
            raw = neighbours = error = None
            if layout.has_context:
                raw, error = self._product(query, feedback)
                neighbours = layout.neighbours[bucket]
                scores = with_context(raw, neighbours, rows)
            elif 2 * len(rows) >= len(side.ids):
                every, error = self._product(query, feedback)
                scores = every[rows]
            else:
                self._blocks[bucket] = block = _block(layout, bucket, side)
                scores = block.T @ query
            cached = _BucketScores(feedback, scores, error, query, raw, neighbours)
            self._bucket_scores[bucket] = cached
        return layout.rows[bucket], cached.scores, cached.error is None

    def _product(self, query: np.ndarray, feedback: tuple[str, ...]) -> tuple[np.ndarray, ScanError | None]:
        """Every memory row's cosine with ``query`` and how far from exact it may be, shared by the buckets that
        ask with the same feedback: from the int8 codes (core.embeddings.matrix, Side.approximate) for a side of
        at least APPROXIMATE_MIN_ROWS rows, else exact (error None)."""
        hit = self._products.get(feedback)
        if hit is None:
            side = self._matrix.memories
            hit = side.approximate(query) if side.n >= APPROXIMATE_MIN_ROWS else (side.matrix @ query, None)
            self._products[feedback] = hit
        return hit

    @property
    def exact(self) -> bool:
        """Whether this search ranks by the exact product (else by the approximate HNSW query)."""
        return self._exact

    def _exact_rank(self, bucket: str, limit: int, feedback: tuple[str, ...]) -> list[tuple[str, float]]:
        side = self._matrix.entities if bucket == ENTITIES else self._matrix.memories
        if not side.ids:
            return []
        rows, sub, exact = self._scores_of(bucket, feedback)
        k = min(limit, len(sub))
        if k == 0:
            return []
        # The floor is on the question's own cosine (as on the approximate path), not the score that
        # feedback and run context moved: a doc must be like the question itself to be ranked. Entity scores
        # are that cosine already.
        if bucket == ENTITIES:
            top = top_rows(sub, k)
            scores = sub[top]
            top, scores = top[scores >= self._floor], scores[scores >= self._floor]
        else:
            if exact:
                top = top_rows(sub, k)
                scores = sub[top]
                raw = self._bucket_scores[bucket].raw
                moved = scores if raw is None else raw[rows[top]]
            else:
                top, scores, moved = self._refined(bucket, rows, sub, k)
            above = self._above_floor(bucket, side, rows, top, moved)
            top, scores = top[above], scores[above]
        ids = side.ids if bucket == ENTITIES else side.memory_ids
        return list(zip([ids[r] for r in rows[top].tolist()], scores.tolist(), strict=True))

    def _refined(
        self, bucket: str, rows: np.ndarray, sub: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`refined_top` of a memory bucket whose scores came from the approximate scan."""
        scored = self._bucket_scores[bucket]
        assert scored.error is not None
        return refined_top(
            sub,
            k,
            error=scored.error,
            rows=rows,
            matrix=self._matrix.memories.matrix,
            query=scored.query,
            raw=scored.raw,
            neighbours=scored.neighbours,
        )

    def _above_floor(self, bucket: str, side: Side, rows: np.ndarray, top: np.ndarray, moved: np.ndarray) -> np.ndarray:
        """Which of a memory bucket's ``top`` rows have a cosine with the question of at least the floor
        (``moved``: their exact cosines with the moved query).

        Most verdicts follow from their cosine with the moved query (floor_verdicts); the rest are computed. A
        minority bucket's vectors are at hand, contiguous, in its block; the same rows, hence the same product."""
        scored = self._bucket_scores[bucket]
        above, unsure = floor_verdicts(moved, scored.query, self._query, self._floor)
        if unsure.any():
            picked = top[unsure]
            block = self._blocks.get(bucket)
            vectors = np.ascontiguousarray(block[:, picked].T) if block is not None else side.matrix[rows[picked]]
            above[unsure] = vectors @ self._query >= self._floor
        return above

    def _hnsw_rank(self, bucket: str, limit: int) -> list[tuple[str, float]]:
        if self._pool is None:
            driver = self._send_hnsw()
            self._pool = self._pool_from_rows(sql.receive(driver)[-1])
        return self._pool.get(bucket, [])[:limit]

    def _send_hnsw(self) -> Any:
        """Send the approximate query (with ``hnsw.ef_search`` set for it, in the same message) on the search's
        connection; returns the driver connection to read its rows from (core.sql.receive)."""
        driver: Any = driver_connection(self._session)
        sql.send(driver, f"SET LOCAL hnsw.ef_search = {HNSW_POOL};\n{self._hnsw_sql()}")
        return driver

    @contextmanager
    def overlapped(self) -> Iterator[None]:
        """On the approximate path, send the query at once and let the caller work while PostgreSQL runs it.

        The query goes out (core.sql.send) on the search's own connection (its transaction); the body must
        not use that connection. Its rows are read when the body ends. The exact path does nothing.
        """
        if self._exact or self._pool is not None:
            yield
            return
        driver = self._send_hnsw()
        try:
            yield
        finally:
            rows = sql.receive(driver)[-1]
        self._pool = self._pool_from_rows(rows)

    def _hnsw_sql(self) -> str:
        """One approximate nearest-neighbour query of fixed depth (``hnsw.ef_search`` set to HNSW_POOL first).

        A fixed pool (not one filtered query per bucket) keeps the index scan short: filtering a rare
        bucket inside HNSW makes pgvector walk far down the graph. Each bucket's ranking is its part of
        the pool, the same whatever the caps.
        """
        dims = self._dims
        # Every value is written into the SQL text: a prepared, generic plan (psycopg prepares repeated
        # statements) cannot see the query vector and would sort the whole table instead of using HNSW.
        vector = "[" + ",".join(f"{x:.7g}" for x in self._query.tolist()) + "]"
        distance = f"(e.embedding::vector({dims})) <=> '{vector}'::vector({dims})"
        model = self._model.replace("'", "''")
        return (
            f"SELECT n.canonical_id, n.doc_kind, n.dist, {HAS_QUERY_SQL} FROM ("
            f"SELECT e.tenant_id, e.canonical_id, e.doc_kind, {distance} AS dist FROM embeddings AS e "
            f"WHERE e.tenant_id = {int(self._tenant_id)} AND e.model = '{model}' AND e.dims = {dims} "
            f"ORDER BY {distance} LIMIT {HNSW_POOL}) AS n "
            f"LEFT JOIN memories ON memories.tenant_id = n.tenant_id AND n.doc_kind = '{MEMORY_KIND}' "
            f"AND memories.id = substr(n.canonical_id, {len(MEMORY_PREFIX) + 1})"
        )

    def _pool_from_rows(self, rows: Sequence[Any]) -> dict[str, list[tuple[str, float]]]:
        """The query's rows split into the three buckets, each best first (ties by id)."""
        pool: dict[str, list[tuple[str, float]]] = {ENTITIES: [], MEMORIES: [], EXAMPLE_QUERIES: []}
        floor = self._floor
        for canonical_id, doc_kind, dist, carries_query in rows:
            if doc_kind != MEMORY_KIND:
                bucket = ENTITIES
            else:
                bucket = EXAMPLE_QUERIES if carries_query else MEMORIES
            similarity = 1.0 - float(dist)
            if similarity >= floor:
                pool[bucket].append((canonical_id, similarity))
        return {b: sorted(hits, key=lambda hit: (-hit[1], hit[0])) for b, hits in pool.items()}
