"""The dense similarity floor belongs to the embedder: each model's cosines live on their own scale, so each
embedder class declares the floor measured for it, and the `dense_similarity_floor` setting, when set,
overrides it for every model."""

from __future__ import annotations

import numpy as np
import pytest

from core.config import get_settings
from core.embeddings.providers import (
    HashingEmbedder,
    LiteLLMEmbedder,
    LocalStaticEmbedder,
    LocalTransformerEmbedder,
)
from core.search.dense import FLOOR_MARGIN, floor_verdicts, similarity_floor

# (embedder class, the floor it declares)
DECLARED = [
    (LocalStaticEmbedder, 0.3),  # the bundled model: unrelated questions reach 0.2-0.25
    (HashingEmbedder, 0.0),  # test model: any shared word is evidence
    (LocalTransformerEmbedder, 0.15),  # MiniLM: a true paraphrase can score 0.21
    (LiteLLMEmbedder, 0.0),  # remote models: unmeasured, no floor unless configured
]


@pytest.mark.parametrize(("cls", "floor"), DECLARED, ids=[c.__name__ for c, _ in DECLARED])
def test_each_embedder_declares_its_floor(cls, floor):
    assert cls.similarity_floor == floor


@pytest.mark.parametrize(
    ("embedder", "override", "expected"),
    [
        (HashingEmbedder(), None, 0.0),
        (LocalTransformerEmbedder(), None, 0.15),
        (LiteLLMEmbedder("openai/text-embedding-3-small"), None, 0.0),
        (HashingEmbedder(), 0.4, 0.4),
        (LocalTransformerEmbedder(), -1.0, -1.0),
        (LiteLLMEmbedder("openai/text-embedding-3-small"), 0.25, 0.25),
    ],
)
def test_the_setting_overrides_the_embedders_floor_only_when_set(monkeypatch, embedder, override, expected):
    monkeypatch.setattr(get_settings(), "dense_similarity_floor", override)
    assert similarity_floor(embedder) == expected


def test_the_bundled_model_keeps_its_floor_when_unset(monkeypatch):
    from core.embeddings.providers import get_embedder

    monkeypatch.setattr(get_settings(), "dense_similarity_floor", None)
    assert similarity_floor(get_embedder("local")) == 0.3


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("feedback_weight", [0.0, 0.2, 0.5, 2.0])
@pytest.mark.parametrize("floor", [0.0, 0.3, 0.6])
def test_the_floors_bound_never_contradicts_the_question_cosine(feedback_weight, floor):
    """A row the bound passes has a cosine with the question at or above the floor, a row it neither passes
    nor leaves unsure has one below; without feedback (the moved query is the question) it leaves only rows
    within the margin of the floor unsure."""
    rng = np.random.default_rng(7)
    question = _unit(rng.normal(size=64))
    # Rows whose cosines with the question spread evenly over [-1, 1]: many sit near each floor.
    cosines = rng.uniform(-1.0, 1.0, size=(4000, 1))
    others = rng.normal(size=(4000, 64))
    others -= (others @ question)[:, None] * question
    vectors = _unit(cosines * question + np.sqrt(1 - cosines**2) * _unit(others))
    # Feedback as a search takes it: the mean of docs like the question (here five of cosine 0.4 to 0.6).
    like = vectors[np.flatnonzero(np.abs(vectors @ question - 0.5) < 0.1)[:5]]
    moved = _unit(question + feedback_weight * _unit(like.mean(axis=0)))
    # And rows at the bound's edges: all of their part across the moved query along the question's, either way.
    across = question - (question @ moved) * moved
    if np.linalg.norm(across) > 1e-6:
        t = rng.uniform(-1.0, 1.0, size=(2000, 1))
        sign = rng.choice([-1.0, 1.0], size=(2000, 1))
        vectors = np.vstack([vectors, _unit(t * moved + sign * np.sqrt(1 - t**2) * _unit(across))])
    truth = vectors @ question
    above, unsure = floor_verdicts(vectors @ moved, moved, question, floor)
    assert (truth[above] >= floor).all()
    assert (truth[~above & ~unsure] < floor).all()
    if feedback_weight == 0.0:
        assert (np.abs(truth[unsure] - floor) <= 2 * FLOOR_MARGIN).all()
    if feedback_weight <= 0.5:  # the bound decides the rows far from the floor, either way
        assert unsure.mean() < 0.3
        assert above.any() and (~above & ~unsure).any()
