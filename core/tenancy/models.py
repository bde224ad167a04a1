"""Tenants, their users and API keys."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    DateTime,
    ForeignKey,
    Identity,
    Numeric,
    String,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # Largest integer-shaped memory id ever used (auto or supplied): the next auto id is this + 1. Numeric:
    # a supplied id may have up to 200 digits.
    memory_seq: Mapped[Decimal] = mapped_column(Numeric(210, 0), default=0, server_default="0")
    # Bumped by every write; derived indexes record the value they reflect.
    change_seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The change_seq (and model) at which reconcile last found every embedding in place: until a write
    # moves change_seq or the model changes, there is nothing to look for.
    embeddings_checked_seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    embeddings_checked_model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Operating state (core.tenancy.operations): active, suspended (keys refused, data kept) or deleting.
    state: Mapped[str] = mapped_column(String(20), default="active", server_default="active")
    # The limits that are not unlimited: max_memories, max_datasources, requests_per_minute,
    # embedding_texts_per_day (core.tenancy.quotas).
    quotas: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    # Memories not forgotten, kept by triggers on `memories` (migration 0016): never written by the ORM.
    memory_count: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # What the tenant's rows, vectors and index took when measured at change_seq `storage_seq`.
    storage_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    storage_seq: Mapped[int] = mapped_column(BigInteger, default=-1, server_default="-1")
    storage_measured_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class TenantUsage(Base):
    """A tenant's metered use on one UTC day (core.tenancy.usage)."""

    __tablename__ = "tenant_usage"

    tenant_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    searches: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    saves: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    embedded_texts: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    embedding_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class UsageFlush(Base):
    """The id of each buffered usage flush that committed: a retried flush is not counted twice."""

    __tablename__ = "usage_flushes"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), index=True)


class User(Base):
    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("tenant_id", "email"),)

    # Keys lead with tenant_id (a distributed PostgreSQL shards by it).
    tenant_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    email: Mapped[str] = mapped_column(String(320))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ApiKey(Base):
    """A key is shown once; only its SHA-256 is stored (keys are 256-bit random: a slow hash adds nothing)."""

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("tenant_id", "key_hash"),)

    tenant_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_email: Mapped[str] = mapped_column(String(320))
    role: Mapped[str] = mapped_column(String(20))
    # Authentication finds a key by its hash alone (system mode); keys are 256-bit random, so unique in practice.
    key_hash: Mapped[str] = mapped_column(String(64), index=True)
    # A bound key acts as this agent / persona whatever a call names (see Caller.acting_as).
    agent_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    persona: Mapped[str | None] = mapped_column(String(200), nullable=True)
    read_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
