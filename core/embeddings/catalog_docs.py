"""Catalog docs (datasources, models, columns, measures, aggregations) for embedding.

The catalog arrives with its own issue; until it exists there are no catalog docs to embed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from core.embeddings.refresh import Doc


def load(session: Session, *, doc_ids: list[str]) -> list[Doc]:
    return []
