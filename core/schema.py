"""Imports every table module so Base.metadata is complete (Alembic, tests)."""

import core.entities.store  # noqa: F401 - catalog tables, and the snapshot loader memory saves use
from core.audit.models import AuditCounter, AuditEntry, OperatorAuditEntry
from core.jobs.models import Job
from core.lifecycle.definitions import EntityDefinition
from core.memories.models import Association, Memory, MemoryVersion, Tombstone
from core.tenancy.models import ApiKey, Tenant, TenantUsage, UsageFlush, User
from core.vectors import Embedding
from core.webhooks.models import Webhook, WebhookDelivery

__all__ = [
    "ApiKey", "Association", "AuditCounter", "AuditEntry", "Embedding", "EntityDefinition", "Job", "Memory",
    "MemoryVersion", "OperatorAuditEntry", "Tenant", "TenantUsage", "Tombstone", "UsageFlush", "User", "Webhook",
    "WebhookDelivery",
]  # fmt: skip
