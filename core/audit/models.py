"""Audit rows: a tenant's entries (row-level security, append-only) and the operator's trail (no tenant)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Identity, Index, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base, TenantScoped


class AuditEntry(TenantScoped, Base):
    """Who did what to which target, in the transaction of the change; never content nor secrets."""

    __tablename__ = "audit_entries"
    __table_args__ = (Index("ix_audit_entries_at", "at"),)

    # No foreign key (migration 0017): a batch writes one entry per item, and per-row checks cost more than
    # the insert. Offboarding removes a tenant's entries through engram_purge_tenant_audit.
    tenant_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)

    # Counted per tenant (audit_counters), so an id says nothing about other tenants.
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    action: Mapped[str] = mapped_column(String(60))
    actor_user: Mapped[str | None] = mapped_column(String(320), nullable=True)
    actor_key_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    actor_agent_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    target: Mapped[str | None] = mapped_column(String(400), nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(200), nullable=True)


class AuditCounter(TenantScoped, Base):
    """The last audit entry id of a tenant."""

    __tablename__ = "audit_counters"

    n: Mapped[int] = mapped_column(BigInteger, default=0)


class OperatorAuditEntry(Base):
    """The operator's trail of actions on tenants; names the tenant, holds no tenant_id (it outlives it)."""

    __tablename__ = "operator_audit"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    action: Mapped[str] = mapped_column(String(60))
    tenant_name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    actor: Mapped[str | None] = mapped_column(String(320), nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
