"""Webhook registrations and their deliveries (the outbox of events, one row per event and webhook)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Index, Integer, String, Text, func, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base, TenantScoped

EVENT_TYPES = (
    "memory.created",
    "memory.updated",
    "memory.forgotten",
    "memory.purged",
    "job.failed",
    "ingest.succeeded",
    "ingest.failed",
    "quota.exceeded",
)


class Webhook(TenantScoped, Base):
    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(ARRAY(Text))
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Fernet, like datasource URLs (core.crypto); the plain secret is shown at creation and rotation.
    secret_encrypted: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(20), default="enabled")  # enabled | disabled
    disabled_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Since when every attempt failed (null after a success): past the setting, the webhook is disabled.
    failing_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # After a failed attempt nothing is sent to it before this (its receiver is failing: no hammering).
    paused_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The lease of the one worker delivering to it (per-webhook concurrency of one).
    delivering_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_by: Mapped[str | None] = mapped_column(String(320), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class WebhookDelivery(TenantScoped, Base):
    """One event for one webhook; its id is the `webhook-id` header of every attempt."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "tenant_id", "webhook_id", "id", postgresql_where=text("state = 'pending'")),
    )

    # No foreign keys (migration 0017): a batch writes one row per event, and per-row checks cost more than the
    # insert. Deleting a webhook deletes its deliveries (core.webhooks.service.delete_webhook).
    tenant_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    # Time-ordered ('msg_' + microseconds + random, made in SQL by core.webhooks.service): delivery order,
    # listing order and cursor, with no sequence shared by tenants.
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(String(40))
    event_type: Mapped[str] = mapped_column(String(40))
    # Sent as {"type": event_type, "timestamp": created_at, "data": data}, the same bytes on every attempt.
    data: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(String(20), default="pending")  # pending | succeeded | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # One {"attempt", "at", "status", "error", "duration_ms"} per attempt, oldest first.
    attempt_log: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list, server_default="[]")
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
