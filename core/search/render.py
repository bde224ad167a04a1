"""The one renderer: the text each doc contributes to full-text, embeddings, content hashes and hits.

A memory's text is its content alone, so rewriting its entity tags (cascades, cleanup) never changes its
content hash and never re-embeds it.
"""

from __future__ import annotations

import hashlib

from core.memories.models import Memory


def render_memory(memory: Memory) -> str:
    return memory.content


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
