"""The embedder a process uses: the configured model (or the one a job names), wrapped in fault injection
only when the resilience drill asks for it (ENGRAM_EMBEDDING_FAULT_RATE, core.embeddings.chaos)."""

from __future__ import annotations

from core.config import get_settings
from core.embeddings.chaos import FaultInjectingEmbedder
from core.embeddings.providers import Embedder, get_embedder


def embedder_for_settings(model: str | None = None) -> Embedder:
    """The configured embedder (or `model`, when a job names one), wrapped in fault injection when the drill
    setting asks for it."""
    settings = get_settings()
    embedder = get_embedder(model or settings.embedding_model)
    if settings.embedding_fault_rate > 0:
        return FaultInjectingEmbedder(embedder, fault_rate=settings.embedding_fault_rate)
    return embedder
