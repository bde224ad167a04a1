"""Embeddings: the provider seam (``providers``); the vector store lives in ``store``."""

from core.embeddings.providers import (
    LOCAL_ALIAS,
    LOCAL_MODEL_NAME,
    Embedder,
    EmbeddingProviderError,
    LiteLLMEmbedder,
    LocalStaticEmbedder,
    clear_embedder_cache,
    get_embedder,
)

__all__ = [
    "LOCAL_ALIAS",
    "LOCAL_MODEL_NAME",
    "Embedder",
    "EmbeddingProviderError",
    "LiteLLMEmbedder",
    "LocalStaticEmbedder",
    "clear_embedder_cache",
    "get_embedder",
]
