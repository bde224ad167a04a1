"""Memory rows, their associations, and tombstones for hard-deleted docs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, ForeignKeyConstraint, Index, Integer, String, Text, func, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base, TenantScoped


class Memory(TenantScoped, Base):
    __tablename__ = "memories"
    __table_args__ = (
        Index("ix_memories_tenant_seq", "tenant_id", "change_seq"),
        Index("ix_memories_tenant_created", "tenant_id", "created_at"),
        Index("ix_memories_entities", "entities", postgresql_using="gin"),
        # Episode order (core.search.replies; migration 0015): a run, or one explicit event time without a run.
        Index("ix_memories_tenant_run_order", "tenant_id", "run_id", "occurred_at", "created_at"),
        Index(
            "ix_memories_tenant_instant",
            "tenant_id",
            "occurred_at",
            "created_at",
            postgresql_where=text("run_id IS NULL AND occurred_at <> created_at"),
        ),
    )

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    content: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20), default="fact")
    category: Mapped[str] = mapped_column(String(20), default="core")
    importance: Mapped[float] = mapped_column(Float)
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list)
    source: Mapped[str | None] = mapped_column(Text, nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    persona: Mapped[str | None] = mapped_column(String(200), nullable=True)
    agent_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    entities: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list)
    # none_as_null: "no query" is SQL NULL, not JSON null, so `query IS NULL` finds plain learnings.
    query: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True), nullable=True)
    # What the attached query resolved to when it was saved: staleness is judged against these, never by
    # resolving the query again against a catalog that has changed since.
    query_entities: Mapped[list[str] | None] = mapped_column(ARRAY(Text), nullable=True)
    status: Mapped[str] = mapped_column(String(20), default="active")
    stale_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    forget_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    forgotten_by: Mapped[str | None] = mapped_column(String(320), nullable=True)
    forgotten_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    superseded_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_by: Mapped[str] = mapped_column(String(320))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    access_count: Mapped[int] = mapped_column(Integer, default=0)
    last_accessed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    change_seq: Mapped[int] = mapped_column(BigInteger, default=0)


class Association(TenantScoped, Base):
    """A directed edge source -> target; `updates` means the source supersedes the target."""

    __tablename__ = "associations"
    __table_args__ = (Index("ix_associations_target", "tenant_id", "target_id"),)

    source_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    target_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    relation_type: Mapped[str] = mapped_column(String(20), primary_key=True)
    weight: Mapped[float] = mapped_column(Float, default=0.5)


class Tombstone(TenantScoped, Base):
    """A doc removed for good; derived indexes past `change_seq` delete it."""

    __tablename__ = "tombstones"
    __table_args__ = (Index("ix_tombstones_tenant_seq", "tenant_id", "change_seq"),)

    doc_id: Mapped[str] = mapped_column(String(400), primary_key=True)
    change_seq: Mapped[int] = mapped_column(BigInteger)


class MemoryVersion(TenantScoped, Base):
    """One revision of a memory as a save, an upsert or a patch left it; the newest is the current one.

    Keyed by the tenant's ``change_seq`` of the write that made it: each write takes a new one under the
    tenant's row lock, so two revisions of a memory never share it and its order is the order of writes.
    """

    __tablename__ = "memory_versions"
    __table_args__ = (
        ForeignKeyConstraint(
            ["tenant_id", "memory_id"], ["memories.tenant_id", "memories.id"], ondelete="CASCADE"
        ),
    )

    memory_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    change_seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    content: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20))
    category: Mapped[str] = mapped_column(String(20))
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list)
    importance: Mapped[float] = mapped_column(Float)
    entities: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list)
    changed_by: Mapped[str] = mapped_column(String(320))
    changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
