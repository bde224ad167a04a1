"""Fault injection for resilience drills: fail a share of embedding calls like a flaky provider would.

Enabled only by ENGRAM_EMBEDDING_FAULT_RATE (0 by default). Operators use it to check that a deployment
converges through provider outages; the fault tests use it to prove the retry path with real workers.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import numpy as np

from core.embeddings.providers import Embedder, EmbeddingProviderError


class FaultInjectingEmbedder(Embedder):
    def __init__(self, inner: Embedder, *, fault_rate: float, seed: int | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.fault_rate = fault_rate
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    @property
    def dims(self) -> int:
        return self.inner.dims

    def warm(self) -> None:
        self.inner.warm()

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            fail = self._rng.random() < self.fault_rate
        if fail:
            raise EmbeddingProviderError(
                "injected provider failure (ENGRAM_EMBEDDING_FAULT_RATE): 503 Service Unavailable"
            )
        return self.inner.embed_documents(texts)

