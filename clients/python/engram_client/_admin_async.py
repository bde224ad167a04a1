"""The catalog, job, key, operations, tenant, audit and webhook calls of
:class:`engram_client.AsyncEngramClient`.

Written by ``clients/python/scripts/make_async_admin.py`` from :mod:`engram_client._admin_sync`; do not edit.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

from engram_client import _admin_operations as op
from engram_client._calls import Call, Settings, T
from engram_client.models import Job
from engram_client.resources import (
    ApiKey,
    AuditPage,
    CoverageRow,
    Datasource,
    Deleted,
    Health,
    IssuedKey,
    JobAccepted,
    JobBulkResult,
    JobPage,
    KeyRevoked,
    ModelInspection,
    ProvisionedTenant,
    Readiness,
    ReindexProgress,
    Tenant,
    TenantPage,
    UsageReport,
    Webhook,
    WebhookCreated,
    WebhookDeleted,
    WebhookDeliveryPage,
    WebhookUpdated,
)

JobState = Literal["queued", "running", "succeeded", "failed"]
TenantState = Literal["active", "suspended", "offboarding"]


class AsyncAdminCalls:
    """Calls needing no memory arguments; the client class provides ``settings`` and ``_send``."""

    settings: Settings

    async def _send(self, call: Call[T]) -> T:
        raise NotImplementedError

    # Catalog

    async def create_datasource(
        self, name: str, url: str, *, description: str | None = None, schema_name: str | None = None
    ) -> Datasource:
        """Register a database (an SQLAlchemy URL); its credentials are stored encrypted, never returned."""
        return await self._send(op.create_datasource(locals()))

    async def list_datasources(self) -> list[Datasource]:
        return await self._send(op.list_datasources())

    async def get_datasource(self, name: str) -> Datasource:
        return await self._send(op.get_datasource(name))

    async def delete_datasource(self, name: str) -> Deleted:
        """Delete a datasource with its models, columns, embeddings and memory references."""
        return await self._send(op.delete_datasource(name))

    async def ingest_datasource(self, name: str) -> JobAccepted:
        """Re-read the datasource's schema and samples in the background; follow the job with get_job."""
        return await self._send(op.ingest_datasource(name))

    async def refresh_samples(self, name: str, *, models: list[str] | None = None) -> JobAccepted:
        return await self._send(op.refresh_samples(name, models))

    async def inspect_model(
        self, datasource: str, name: str, *, agent_id: str | None = None, persona: str | None = None
    ) -> ModelInspection:
        """A model's columns, keys, measures, aggregations and the learnings saved about it."""
        return await self._send(op.inspect_model(self.settings, datasource, name, locals()))

    async def put_model(
        self,
        datasource: str,
        name: str,
        *,
        label: str | None = None,
        description: str | None = None,
        hidden: bool | None = None,
        table: str | None = None,
        columns: list[dict[str, Any]] | None = None,
        measures: list[dict[str, Any]] | None = None,
        aggregations: list[dict[str, Any]] | None = None,
    ) -> ModelInspection:
        """Create or replace a model."""
        return await self._send(op.put_model(datasource, name, locals()))

    async def patch_model(
        self,
        datasource: str,
        name: str,
        *,
        label: str | None = None,
        description: str | None = None,
        hidden: bool | None = None,
        columns: list[dict[str, Any]] | None = None,
        remove_columns: list[str] | None = None,
        measures: list[dict[str, Any]] | None = None,
        remove_measures: list[str] | None = None,
        aggregations: list[dict[str, Any]] | None = None,
        remove_aggregations: list[str] | None = None,
    ) -> ModelInspection:
        """Change the given parts of a model (add or remove columns, measures, aggregations)."""
        return await self._send(op.patch_model(datasource, name, locals()))

    async def delete_model(self, datasource: str, name: str) -> Deleted:
        return await self._send(op.delete_model(datasource, name))

    # Jobs and operations

    async def list_jobs(
        self,
        *,
        kind: str | None = None,
        state: JobState | None = None,
        tenant: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JobPage:
        """One page of jobs, newest first (``tenant``: the operator key's filter)."""
        return await self._send(op.list_jobs(locals()))

    async def get_job(self, job_id: str) -> Job:
        return await self._send(op.get_job(job_id))

    async def retry_job(self, job_id: str) -> Job:
        """Queue a failed job again (:class:`ConflictError` while it is not failed)."""
        return await self._send(op.retry_job(job_id))

    async def coverage(self) -> list[CoverageRow]:
        """Embedding coverage per doc kind and model (every tenant's with the operator key)."""
        return await self._send(op.coverage())

    async def health(self) -> Health:
        return await self._send(op.health())

    async def readiness(self) -> Readiness:
        """Whether the database and Redis answer (:class:`ServiceUnavailableError` when not)."""
        return await self._send(op.readiness())

    # Keys

    async def create_key(
        self,
        *,
        user: str,
        role: Literal["admin", "member"] | None = None,
        agent_id: str | None = None,
        persona: str | None = None,
        read_only: bool | None = None,
    ) -> IssuedKey:
        """Issue a key (admin); ``agent_id`` / ``persona`` / ``read_only`` bind what it may do."""
        return await self._send(op.create_key(locals()))

    async def list_keys(self) -> list[ApiKey]:
        return await self._send(op.list_keys())

    async def revoke_key(self, key_id: str) -> KeyRevoked:
        return await self._send(op.revoke_key(key_id))

    # Tenants (with the operator key) and usage (a tenant's admin key)

    async def create_tenant(self, name: str, *, quotas: dict[str, int | None] | None = None) -> ProvisionedTenant:
        """Provision a tenant; the answer carries its first admin key, shown only here."""
        return await self._send(op.create_tenant(locals()))

    async def list_tenants(
        self,
        *,
        state: TenantState | None = None,
        prefix: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> TenantPage:
        return await self._send(op.list_tenants(locals()))

    async def get_tenant(self, name: str) -> Tenant:
        return await self._send(op.get_tenant(name))

    async def update_tenant(
        self,
        name: str,
        *,
        state: Literal["active", "suspended"] | None = None,
        quotas: dict[str, int | None] | None = None,
    ) -> Tenant:
        """Suspend or resume a tenant, or change its quotas (``None`` in ``quotas``: unlimited)."""
        return await self._send(op.update_tenant(name, locals()))

    async def delete_tenant(self, name: str) -> JobAccepted:
        """Offboard a tenant: its keys stop at once, a job removes all of its data."""
        return await self._send(op.delete_tenant(name))

    async def usage(self, *, from_date: date | None = None, to_date: date | None = None) -> UsageReport:
        """The caller's tenant's usage and quotas; with dates, the daily counters of those days."""
        return await self._send(op.usage(locals()))

    # Audit and webhooks (a tenant's admin key)

    async def list_audit(
        self,
        *,
        action: str | None = None,
        actor: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> AuditPage:
        """Who did what in the tenant, newest first (``action``: one, e.g. ``memory.save``, or a family)."""
        return await self._send(op.list_audit(locals()))

    async def create_webhook(self, url: str, *, events: list[str], description: str | None = None) -> WebhookCreated:
        """Deliver ``events`` to ``url``; the answer's ``secret`` (shown only here) signs the deliveries."""
        return await self._send(op.create_webhook(locals()))

    async def list_webhooks(self) -> list[Webhook]:
        return await self._send(op.list_webhooks())

    async def get_webhook(self, webhook_id: str) -> Webhook:
        return await self._send(op.get_webhook(webhook_id))

    async def update_webhook(
        self,
        webhook_id: str,
        *,
        url: str | None = None,
        events: list[str] | None = None,
        description: str | None = None,
        enabled: bool | None = None,
        rotate_secret: bool | None = None,
    ) -> WebhookUpdated:
        """Change the given fields; ``enabled=False`` pauses deliveries, ``rotate_secret`` issues a new secret."""
        return await self._send(op.update_webhook(webhook_id, locals()))

    async def delete_webhook(self, webhook_id: str) -> WebhookDeleted:
        return await self._send(op.delete_webhook(webhook_id))

    async def webhook_deliveries(
        self,
        webhook_id: str,
        *,
        state: Literal["pending", "succeeded", "failed"] | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> WebhookDeliveryPage:
        """A webhook's deliveries, newest first, each with its attempts."""
        return await self._send(op.webhook_deliveries(webhook_id, locals()))

    # Operating the job queue and the reindexing (the operator key)

    async def retry_failed_jobs(
        self,
        *,
        kind: str | None = None,
        tenant: str | None = None,
        error_contains: str | None = None,
        ids: list[str] | None = None,
    ) -> JobBulkResult:
        """Queue again every failed job of the filter (at most 10,000 a call; the answer names them)."""
        return await self._send(op.retry_failed_jobs(locals()))

    async def discard_failed_jobs(
        self,
        *,
        reason: str,
        kind: str | None = None,
        tenant: str | None = None,
        error_contains: str | None = None,
        ids: list[str] | None = None,
        by: str | None = None,
    ) -> JobBulkResult:
        """Give up on every failed job of the filter, keeping ``reason`` on each."""
        return await self._send(op.discard_failed_jobs(locals()))

    async def discard_job(self, job_id: str, *, reason: str, by: str | None = None) -> Job:
        """Give up on one failed job."""
        return await self._send(op.abandon_job(job_id, "discard", locals()))

    async def cancel_job(self, job_id: str, *, reason: str, by: str | None = None) -> Job:
        """Cancel one queued job."""
        return await self._send(op.abandon_job(job_id, "cancel", locals()))

    async def reindex_progress(self) -> ReindexProgress:
        """How far re-embedding for the current embedding model has come."""
        return await self._send(op.reindex_progress())

    async def pause_reindex(self, *, by: str | None = None) -> ReindexProgress:
        return await self._send(op.set_reindex("pause", locals()))

    async def resume_reindex(self, *, by: str | None = None) -> ReindexProgress:
        return await self._send(op.set_reindex("resume", locals()))
