"""The int8 codes of a tenant's matrix (core.embeddings.matrix): an approximate scan and its error bound, and the
exact top rows the dense channel refines from it (core.search.dense.refined_top)."""

from __future__ import annotations

import numpy as np
import pytest

from core.embeddings.matrix import PACK_ROWS, merged, side_of
from core.search.dense import CONTEXT_TURNS, refined_top, top_rows, with_context


def _vectors(rng: np.random.Generator, n: int, dims: int = 64) -> np.ndarray:
    """Unit-able rows whose first dims carry most of their length, as the bundled model's do; one zero row."""
    vectors = rng.standard_normal((n, dims)).astype(np.float32)
    vectors[:, :3] *= 8
    vectors[n // 2] = 0
    return vectors


def _clustered(rng: np.random.Generator, n: int, dims: int = 64) -> np.ndarray:
    """Rows close to one another: their cosines with a query near them lie closer together than the codes' error,
    so the codes alone would rank them wrongly."""
    centre = rng.standard_normal(dims).astype(np.float32)
    centre[:3] *= 8
    return centre + 0.6 * rng.standard_normal((n, dims)).astype(np.float32)


def _ids(start: int, n: int) -> list[str]:
    return [f"memory:{i}" for i in range(start, start + n)]


def _queries(rng: np.random.Generator, side_matrix: np.ndarray) -> list[np.ndarray]:
    """A stored row, a random unit vector, and a mix moved towards a few rows (as feedback moves a question)."""
    random = rng.standard_normal(side_matrix.shape[1]).astype(np.float32)
    moved = side_matrix[3] + 0.5 * side_matrix[[7, 11, 13]].mean(axis=0)
    return [side_matrix[5].copy(), random / np.linalg.norm(random), (moved / np.linalg.norm(moved)).astype(np.float32)]


def _within_bounds(side, query: np.ndarray) -> None:
    scores, error = side.approximate(query)
    exact = side.matrix.astype(np.float64) @ query.astype(np.float64)
    off = np.abs(exact - scores)
    assert off.max() <= error.bound
    assert np.all(off <= error.bounds(error.residuals))
    # The bound is not vacuous: it is a small fraction of a cosine, and the codes are closer than it.
    assert error.bound < 0.05 and off.max() > 0


def test_approximate_scores_stay_within_their_bound_across_chunks():
    rng = np.random.default_rng(7)
    n = 2 * PACK_ROWS + 37  # two packed chunks and a partial one
    side = side_of(_ids(0, n), _vectors(rng, n), dims=64)
    for query in _queries(rng, side.matrix):
        _within_bounds(side, query)


def test_the_bound_is_reached_by_a_query_along_a_rows_rounding():
    """A query pointing along what a row's codes leave out scores that row off by about its whole bound: the
    bound cannot be taken smaller."""
    rng = np.random.default_rng(9)
    side = side_of(_ids(0, 500), _vectors(rng, 500), dims=64)
    side.approximate(side.matrix[0])
    codes = side._buffer.codes
    row = 17
    rounding = side.matrix[row] - codes.codes[row] * codes.scales[row]
    rounding[codes.heavy] = 0
    query = (rounding / np.linalg.norm(rounding)).astype(np.float32)
    scores, error = side.approximate(query)
    off = abs(float(side.matrix[row].astype(np.float64) @ query) - float(scores[row]))
    assert 0.9 * error.bounds(error.residuals[row : row + 1])[0] <= off


def test_rows_added_after_the_codes_are_coded_like_the_rest():
    rng = np.random.default_rng(8)
    side = side_of(_ids(0, 300), _vectors(rng, 300), dims=64, headroom=400)
    query = _queries(rng, side.matrix)[1]
    side.approximate(query)  # (the buffer's codes are made here)
    grown = merged(side, _ids(300, 250), _vectors(rng, 250))  # appended in the buffer's headroom
    assert grown.n == 550
    _within_bounds(grown, query)
    replaced = merged(grown, ["memory:4", *_ids(550, 10)], _vectors(rng, 11))  # a new vector for a row: copied
    assert replaced.n == 560 and replaced.lineage == side.lineage
    _within_bounds(replaced, query)
    # The older sides still read their own rows.
    _within_bounds(side, query)
    _within_bounds(grown, query)


def test_a_side_a_few_rows_past_the_packed_tail_scores_those_rows_exactly():
    rng = np.random.default_rng(10)
    side = side_of(_ids(0, PACK_ROWS + 100), _vectors(rng, PACK_ROWS + 100), dims=64, headroom=300)
    query = _queries(rng, side.matrix)[1]
    _within_bounds(side, query)  # (packs the rows past the full chunk: the buffer's tail)
    grown = side
    for start in range(PACK_ROWS + 100, PACK_ROWS + 106):  # a save at a time, as under a stream of saves
        grown = merged(grown, [f"memory:{start}"], _vectors(rng, 2)[:1])
    assert grown._buffer.tail is not None and grown._buffer.tail[1] == side.n  # (the tail was not packed again)
    scores, _ = grown.approximate(query)
    assert np.array_equal(scores[side.n :], grown.matrix[side.n :] @ query)  # past it: the float32 product
    _within_bounds(grown, query)
    _within_bounds(side, query)


def _neighbours(rng: np.random.Generator, n: int) -> np.ndarray:
    near = rng.integers(-1, n, size=(n, 2 * CONTEXT_TURNS))
    near[rng.random(n) < 0.3] = -1  # a third of the rows in no run
    return near


def _both_ways(side, query: np.ndarray, rows: np.ndarray, neighbours: np.ndarray | None):  # type: ignore[no-untyped-def]
    """A bucket's approximate scores and its exact ones (every row scored alike, wherever it stands), blended with
    run context when ``neighbours`` are given; the exact cosines of every row; and refined_top over the approximate
    scores, as a function of k."""
    raw, error = side.approximate(query)
    exact_raw = np.einsum("ij,j->i", side.matrix, query)
    if neighbours is not None:
        sub, expected = with_context(raw, neighbours, rows), with_context(exact_raw, neighbours, rows)
    else:
        sub, expected = raw[rows], exact_raw[rows]

    def refine(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return refined_top(
            sub,
            k,
            error=error,
            rows=rows,
            matrix=side.matrix,
            query=query,
            raw=None if neighbours is None else raw,
            neighbours=neighbours,
        )

    return sub, expected, exact_raw, refine


@pytest.mark.parametrize("clustered", [False, True])
@pytest.mark.parametrize("context", [False, True])
@pytest.mark.parametrize("k", [1, 10, 60, 400])
def test_refined_top_ranks_as_exact_scores_of_every_row(clustered, context, k):
    rng = np.random.default_rng(k)
    n = 3000
    side = side_of(_ids(0, n), (_clustered if clustered else _vectors)(rng, n), dims=64)
    matrix = side.matrix
    rows = np.sort(rng.choice(n, size=2400, replace=False))  # a bucket: most of the rows
    misranked = 0
    for query in _queries(rng, matrix):
        neighbours = _neighbours(rng, n)[rows] if context else None
        sub, expected, exact_raw, refine = _both_ways(side, query, rows, neighbours)
        places, scores, moved = refine(k)
        want = top_rows(expected, k)
        misranked += top_rows(sub, k).tolist() != want.tolist()
        assert places.tolist() == want.tolist()
        assert np.allclose(scores, expected[want], atol=1e-6)
        assert np.allclose(moved, exact_raw[rows[want]], atol=1e-6)
    if clustered and k >= 10:
        assert misranked  # (the codes alone would not do: the refinement is what ranks these right)


def test_a_side_is_weighed_with_the_codes_its_first_search_makes():
    """The matrix cache's byte bound (ENGRAM_DENSE_CACHE_MAX_MB) weighs a side when it is cached, before its first
    scan makes its codes: a side large enough to get them is weighed with them from the start."""
    from core.embeddings.matrix import APPROXIMATE_MIN_ROWS

    rng = np.random.default_rng(11)
    small = side_of(_ids(0, 100), _vectors(rng, 100), dims=64)
    large = side_of(_ids(0, APPROXIMATE_MIN_ROWS), _vectors(rng, APPROXIMATE_MIN_ROWS), dims=64)
    before = small.nbytes, large.nbytes
    assert large.nbytes > large.matrix.nbytes * 5 // 4  # (float32 rows, and a quarter of that in codes)
    small.approximate(small.matrix[0])
    large.approximate(large.matrix[0])
    assert (small.nbytes, large.nbytes) == (before[0] + 100 * (64 + 8 + 16), before[1])


def test_a_query_whose_peak_is_subnormal_is_scanned_without_failing():
    rng = np.random.default_rng(12)
    side = side_of(_ids(0, 300), _vectors(rng, 300), dims=64)
    query = np.zeros(64, dtype=np.float32)
    query[10] = 1e-40
    scores, error = side.approximate(query)
    assert np.all(np.abs(side.matrix.astype(np.float64) @ query.astype(np.float64) - scores) <= error.bound)


@pytest.mark.parametrize("context", [False, True])
def test_memories_of_the_same_vector_tie_and_rank_by_place(context):
    """Twenty vectors saved many times over (the same text saved again): the refinement scores each copy alike, so
    copies tie and rank by place, as top_rows ranks the exact scores."""
    rng = np.random.default_rng(13)
    distinct = _vectors(rng, 20)
    n = 4500
    side = side_of(_ids(0, n), distinct[rng.integers(0, 20, size=n)], dims=64)
    rows = np.arange(n)
    neighbours = _neighbours(rng, n) if context else None
    for pick in range(6):
        _, expected, _, refine = _both_ways(side, side.matrix[pick].copy(), rows, neighbours)
        for k in (1, 7, 60):
            places, _, _ = refine(k)
            assert places.tolist() == top_rows(expected, k).tolist()
