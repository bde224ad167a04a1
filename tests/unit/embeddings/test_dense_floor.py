"""The dense similarity floor belongs to the embedder: each model's cosines live on their own scale, so each
embedder class declares the floor measured for it, and the `dense_similarity_floor` setting, when set,
overrides it for every model."""

from __future__ import annotations

import pytest

from core.config import get_settings
from core.embeddings.providers import (
    HashingEmbedder,
    LiteLLMEmbedder,
    LocalStaticEmbedder,
    LocalTransformerEmbedder,
)
from core.search.dense import similarity_floor

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
