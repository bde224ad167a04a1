"""The dense channel's top-k pick (core.search.dense.top_rows) ranks exactly as a full sort would: best first,
ties by row, whatever the order of the scores its sampled threshold is read from."""

from __future__ import annotations

import numpy as np
import pytest

from core.search.dense import TOP_SAMPLE_MIN, TOP_STRIDE, top_rows


def _full_sort(scores: np.ndarray, k: int) -> np.ndarray:
    return np.lexsort((np.arange(len(scores)), -scores))[:k]


def _shapes(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    noise = rng.random(n)
    return {
        "random": noise.astype(np.float32),
        "ascending": np.sort(noise).astype(np.float32),
        "descending": np.sort(noise)[::-1].astype(np.float32),
        "ties": np.round(noise, 2).astype(np.float32),  # ties at the k-th score: the lower row first
        "constant": np.full(n, 0.25, dtype=np.float32),
        # The sample's rows (every TOP_STRIDE-th) hold the highest scores: the threshold read off them lets
        # fewer than k rows through, so the pick falls back to the k-th score itself.
        "sample misleads": np.where(np.arange(n) % TOP_STRIDE == 0, 1.0 + noise, noise).astype(np.float32),
    }


@pytest.mark.parametrize("n", [1, 7, TOP_SAMPLE_MIN - 1, TOP_SAMPLE_MIN, 10_000])
@pytest.mark.parametrize("k", [1, 5, 90, 400, 20_000])
def test_top_rows_ranks_as_a_full_sort(n, k):
    rng = np.random.default_rng(n * 31 + k)
    for shape, scores in _shapes(rng, n).items():
        got = top_rows(scores, k)
        assert got.tolist() == _full_sort(scores, k).tolist(), shape
