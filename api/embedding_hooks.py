"""`sync_embed=true`: embed a saved memory inside the request, so dense search sees it at once."""

from __future__ import annotations

from typing import Any

from core.config import get_settings
from core.db import tenant_session
from core.embeddings.providers import EmbeddingProviderError, get_embedder
from core.embeddings.refresh import embed_docs
from core.memories.schemas import SaveResult
from core.refs import memory_ref
from core.tenancy.context import Caller


def after_save(*, caller: Caller, result: SaveResult) -> SaveResult:
    try:
        outcome = embed_now(caller=caller, memory_id=result.memory_id)
        result.similar_existing = outcome.get("similar", {}).get(result.memory_id, [])
    except EmbeddingProviderError as exc:
        result.warnings.append(f"embedding failed ({exc}); it will be retried in the background")
    return result


def embed_now(*, caller: Caller, memory_id: str) -> dict[str, Any]:
    """Embed one memory in this request (the embed job queued by its write then finds nothing to do)."""
    embedder = get_embedder(get_settings().embedding_model)
    with tenant_session(caller.tenant_id) as session:
        return embed_docs(session, tenant_id=caller.tenant_id, doc_ids=[memory_ref(memory_id)], embedder=embedder)
