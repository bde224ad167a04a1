"""Imports every table module so Base.metadata is complete (Alembic, tests)."""

import core.entities.store  # noqa: F401 - catalog tables, and the snapshot loader memory saves use
from core.embeddings.store_models import Embedding
from core.jobs.models import Job
from core.lifecycle.definitions import EntityDefinition
from core.memories.models import Association, Memory, MemoryVersion, Tombstone
from core.tenancy.models import ApiKey, Tenant, TenantUsage, UsageFlush, User

__all__ = [
    "ApiKey", "Association", "Embedding", "EntityDefinition", "Job", "Memory", "MemoryVersion", "Tenant", "TenantUsage",
    "Tombstone", "UsageFlush", "User",
]  # fmt: skip
