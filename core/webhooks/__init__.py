"""Webhooks: tenants' registrations, events written to the outbox with their change, signed deliveries."""

from core.webhooks.service import emit, emit_many

__all__ = ["emit", "emit_many"]
