"""Job rows: the transactional outbox and the history operators look at."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, Integer, String, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base

JOB_KINDS = ("embed", "refresh_samples", "ingest", "ingest_cleanup", "reconcile", "prune", "purge_tenant", "webhook")
JOB_STATES = ("queued", "running", "succeeded", "failed")


class Job(Base):
    """Not TenantScoped: system jobs (reconcile, prune) have no tenant; tenant reads filter explicitly."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_created", "state", "created_at"),
        Index("ix_jobs_tenant_kind_state", "tenant_id", "kind", "state"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True
    )
    kind: Mapped[str] = mapped_column(String(30))
    state: Mapped[str] = mapped_column(String(20), default="queued")
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # One {"attempt", "error", "at"} per failed attempt, oldest first; `error` is the last of them.
    attempt_errors: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list, server_default="[]")
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    # Set when an operator discarded (failed) or cancelled (queued) the job: {"by", "reason", "at",
    # "from_state"}; the job is then failed and off the failure lists. A retry clears it.
    abandoned: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    dispatched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
