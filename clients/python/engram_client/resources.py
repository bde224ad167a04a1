"""The shapes of engram's other answers: memory history and transfer, runs, the catalog, jobs, keys,
operations, tenants, the audit log and webhooks, as pydantic models.

Like :mod:`engram_client.models` they mirror the server's OpenAPI schemas (compared by a test in the
engram repository) and keep unknown fields, so a newer server never breaks an older SDK.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from engram_client.models import Job, Memory, _Model


class MemoryVersion(_Model):
    content: str
    kind: str
    category: str
    tags: list[str] = Field(default_factory=list)
    importance: float
    entities: list[str] = Field(default_factory=list)
    changed_by: str
    changed_at: datetime


class MemoryHistory(_Model):
    """A memory's versions, newest (the current one) first."""

    versions: list[MemoryVersion]


class ImportResult(_Model):
    imported: int
    memory_ids: list[str]
    warnings: list[str] = Field(default_factory=list)


class RunEnded(_Model):
    run_id: str
    status: str
    count: int
    skipped: int


class Datasource(_Model):
    name: str
    url: str
    dialect: str | None = None
    description: str | None = None
    # "schema" on the wire; renamed because pydantic's BaseModel has a method of that name.
    schema_name: str | None = Field(default=None, alias="schema")
    created_at: datetime | None = None
    updated_at: datetime | None = None
    last_ingested_at: datetime | None = None
    models: list[str] | None = None
    model_count: int | None = None


class Deleted(_Model):
    """A datasource or model delete; the cascade's counters come as extra fields."""

    status: str


class JobAccepted(_Model):
    job_id: str


class ModelInspection(_Model):
    id: str
    datasource: str
    name: str
    table: str | None = None
    label: str | None = None
    description: str | None = None
    hidden: bool = False
    origin: str | None = None
    columns: list[dict[str, Any]] = Field(default_factory=list)
    foreign_keys: list[dict[str, Any]] = Field(default_factory=list)
    measures: list[dict[str, Any]] = Field(default_factory=list)
    aggregations: list[dict[str, Any]] = Field(default_factory=list)
    learnings: list[Memory] = Field(default_factory=list)


class IssuedKey(_Model):
    """A new key; ``api_key`` is its secret, shown only in this answer."""

    api_key: str
    id: str
    user: str
    role: str
    tenant: str
    agent_id: str | None = None
    persona: str | None = None
    read_only: bool = False


class ApiKey(_Model):
    id: str
    user: str
    role: str
    agent_id: str | None = None
    persona: str | None = None
    read_only: bool = False
    created_at: datetime | None = None


class KeyRevoked(_Model):
    id: str
    revoked: bool


class CoverageRow(_Model):
    tenant: str
    doc_kind: str
    model: str
    indexed: int
    expected: int
    ratio: float
    waiting: str | None = None  # why embedding waits, when it does (a spent daily quota, a suspended tenant)


class Health(_Model):
    status: str


class Readiness(_Model):
    status: str
    checks: dict[str, str]


class Quotas(_Model):
    """A tenant's limits; ``None`` is unlimited."""

    max_memories: int | None = None
    max_datasources: int | None = None
    requests_per_minute: int | None = None
    embedding_texts_per_day: int | None = None


class Usage(_Model):
    memories: int = 0
    datasources: int = 0
    storage_bytes: int = 0
    requests: int = 0
    searches: int = 0
    saves: int = 0
    embedded_texts: int = 0
    embedding_tokens: int = 0


class UsageDay(Usage):
    date: str


class UsageReport(_Model):
    usage: Usage
    quotas: Quotas
    days: list[UsageDay] | None = None


class Tenant(_Model):
    tenant: str
    state: str
    quotas: Quotas
    usage: Usage
    created_at: str | None = None


class ProvisionedTenant(_Model):
    """A new tenant and its first admin key (``api_key``, shown only in this answer)."""

    tenant: str
    api_key: str
    state: str
    quotas: Quotas
    created_at: str | None = None


class TenantPage(_Model):
    tenants: list[Tenant]
    next_cursor: str | None = None


class JobPage(_Model):
    jobs: list[Job]
    next_cursor: str | None = None


# Audit and webhooks


class AuditActor(_Model):
    user: str | None = None
    key_id: str | None = None
    agent_id: str | None = None


class AuditEntry(_Model):
    id: str
    at: datetime
    action: str
    actor: AuditActor
    target: str | None = None
    request_id: str | None = None


class AuditPage(_Model):
    entries: list[AuditEntry]
    next_cursor: str | None = None


class Webhook(_Model):
    id: str
    url: str
    events: list[str]
    description: str | None = None
    state: str
    disabled_reason: str | None = None
    failing_since: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class WebhookCreated(Webhook):
    """A new webhook; ``secret`` signs its deliveries (Standard Webhooks) and is shown only in this answer."""

    secret: str


class WebhookUpdated(Webhook):
    """A changed webhook; ``secret`` only when a new one was issued (``rotate_secret``)."""

    secret: str | None = None


class WebhookDeleted(_Model):
    id: str
    deleted: bool


class DeliveryAttempt(_Model):
    attempt: int
    at: datetime
    status: int | None = None
    error: str | None = None
    duration_ms: float | None = None


class WebhookDelivery(_Model):
    id: str
    type: str
    state: str
    attempts: list[DeliveryAttempt]
    next_attempt_at: datetime | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    data: dict[str, Any] | None = None


class WebhookDeliveryPage(_Model):
    deliveries: list[WebhookDelivery]
    next_cursor: str | None = None


# Operating the job queue and the reindexing (the operator key)


class JobBulkResult(_Model):
    count: int
    job_ids: list[str]


class ReindexProgress(_Model):
    model: str
    state: str
    done: int
    remaining: int
    rate_per_s: float
    eta_seconds: float | None = None
    tenants: list[dict[str, Any]]
