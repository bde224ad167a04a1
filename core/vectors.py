"""The embeddings table: one row per (tenant, canonical id, model).

It sits under the domains: the embedding pipeline (core.embeddings) fills it, while memories, the catalog
and lifecycle delete or rewrite their own docs' rows in the same transaction as the change.
"""

from __future__ import annotations

from datetime import datetime

from pgvector.sqlalchemy import Vector
from sqlalchemy import DateTime, Index, Integer, String, func
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base, TenantScoped


class Embedding(TenantScoped, Base):
    __tablename__ = "embeddings"
    __table_args__ = (Index("ix_embeddings_tenant_model_kind", "tenant_id", "model", "doc_kind"),)

    canonical_id: Mapped[str] = mapped_column(String(400), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    doc_kind: Mapped[str] = mapped_column(String(20))
    dims: Mapped[int] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(String(64))
    # Untyped vector: models of different dimensions share the table; HNSW indexes are per model
    # on an expression cast to that model's dimension.
    embedding: Mapped[list[float]] = mapped_column(Vector())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
