"""The requests of the calls around the memories: the catalog, jobs, keys, operations, tenants, the audit
log and webhooks.

One function per REST call, shared by the sync and async clients (as :mod:`engram_client._operations` is
for the memory calls), so both send exactly the same requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engram_client._calls import Call, Settings, given, identity, list_parser, parser, segment
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


def _model_path(datasource: str, name: str) -> str:
    return f"/v1/models/{segment(datasource)}/{segment(name)}"


# Catalog


def create_datasource(fields: Mapping[str, Any]) -> Call[Datasource]:
    body = given(fields, skip=("schema_name",))
    if fields.get("schema_name") is not None:
        body["schema"] = fields["schema_name"]
    return Call("POST", "/v1/datasources", parser(Datasource), json=body)


def list_datasources() -> Call[list[Datasource]]:
    return Call("GET", "/v1/datasources", list_parser(Datasource, "datasources"))


def get_datasource(name: str) -> Call[Datasource]:
    return Call("GET", f"/v1/datasources/{segment(name)}", parser(Datasource))


def delete_datasource(name: str) -> Call[Deleted]:
    return Call("DELETE", f"/v1/datasources/{segment(name)}", parser(Deleted))


def ingest_datasource(name: str) -> Call[JobAccepted]:
    return Call("POST", f"/v1/datasources/{segment(name)}/ingest", parser(JobAccepted))


def refresh_samples(name: str, models: list[str] | None) -> Call[JobAccepted]:
    body = {"models": models} if models is not None else {}
    return Call("POST", f"/v1/datasources/{segment(name)}/refresh-samples", parser(JobAccepted), json=body)


def inspect_model(settings: Settings, datasource: str, name: str, fields: Mapping[str, Any]) -> Call[ModelInspection]:
    who = identity(settings, fields.get("agent_id"), fields.get("persona"))
    return Call("GET", _model_path(datasource, name), parser(ModelInspection), params=who)


def put_model(datasource: str, name: str, fields: Mapping[str, Any]) -> Call[ModelInspection]:
    body = given(fields, skip=("datasource", "name"))
    return Call("PUT", _model_path(datasource, name), parser(ModelInspection), json=body)


def patch_model(datasource: str, name: str, fields: Mapping[str, Any]) -> Call[ModelInspection]:
    body = given(fields, skip=("datasource", "name"))
    return Call("PATCH", _model_path(datasource, name), parser(ModelInspection), json=body)


def delete_model(datasource: str, name: str) -> Call[Deleted]:
    return Call("DELETE", _model_path(datasource, name), parser(Deleted))


# Jobs and operations


def list_jobs(fields: Mapping[str, Any]) -> Call[JobPage]:
    return Call("GET", "/v1/jobs", parser(JobPage), params=given(fields))


def get_job(job_id: str) -> Call[Job]:
    return Call("GET", f"/v1/jobs/{segment(job_id)}", parser(Job))


def retry_job(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{segment(job_id)}/retry", parser(Job))


def coverage() -> Call[list[CoverageRow]]:
    return Call("GET", "/v1/ops/coverage", list_parser(CoverageRow, "coverage"))


def health() -> Call[Health]:
    return Call("GET", "/healthz", parser(Health))


def readiness() -> Call[Readiness]:
    return Call("GET", "/readyz", parser(Readiness))


# Keys


def create_key(fields: Mapping[str, Any]) -> Call[IssuedKey]:
    return Call("POST", "/v1/keys", parser(IssuedKey), json=given(fields))


def list_keys() -> Call[list[ApiKey]]:
    return Call("GET", "/v1/keys", list_parser(ApiKey, "keys"))


def revoke_key(key_id: str) -> Call[KeyRevoked]:
    return Call("DELETE", f"/v1/keys/{segment(key_id)}", parser(KeyRevoked))


# Tenants (the operator key) and usage (a tenant's admin key)


def create_tenant(fields: Mapping[str, Any]) -> Call[ProvisionedTenant]:
    return Call("POST", "/v1/tenants", parser(ProvisionedTenant), json=given(fields))


def list_tenants(fields: Mapping[str, Any]) -> Call[TenantPage]:
    params = given(fields, skip=("prefix",))
    params["q"] = fields.get("prefix")
    return Call("GET", "/v1/tenants", parser(TenantPage), params=params)


def get_tenant(name: str) -> Call[Tenant]:
    return Call("GET", f"/v1/tenants/{segment(name)}", parser(Tenant))


def update_tenant(name: str, fields: Mapping[str, Any]) -> Call[Tenant]:
    return Call("PATCH", f"/v1/tenants/{segment(name)}", parser(Tenant), json=given(fields, skip=("name",)))


def delete_tenant(name: str) -> Call[JobAccepted]:
    return Call("DELETE", f"/v1/tenants/{segment(name)}", parser(JobAccepted))


def usage(fields: Mapping[str, Any]) -> Call[UsageReport]:
    params = {"from": given(fields).get("from_date"), "to": given(fields).get("to_date")}
    return Call("GET", "/v1/usage", parser(UsageReport), params=params)


# Audit and webhooks (a tenant's admin key)


def list_audit(fields: Mapping[str, Any]) -> Call[AuditPage]:
    return Call("GET", "/v1/audit", parser(AuditPage), params=given(fields))


def create_webhook(fields: Mapping[str, Any]) -> Call[WebhookCreated]:
    return Call("POST", "/v1/webhooks", parser(WebhookCreated), json=given(fields))


def list_webhooks() -> Call[list[Webhook]]:
    return Call("GET", "/v1/webhooks", list_parser(Webhook, "webhooks"))


def get_webhook(webhook_id: str) -> Call[Webhook]:
    return Call("GET", f"/v1/webhooks/{segment(webhook_id)}", parser(Webhook))


def update_webhook(webhook_id: str, fields: Mapping[str, Any]) -> Call[WebhookUpdated]:
    body = given(fields, skip=("webhook_id",))
    return Call("PATCH", f"/v1/webhooks/{segment(webhook_id)}", parser(WebhookUpdated), json=body)


def delete_webhook(webhook_id: str) -> Call[WebhookDeleted]:
    return Call("DELETE", f"/v1/webhooks/{segment(webhook_id)}", parser(WebhookDeleted))


def webhook_deliveries(webhook_id: str, fields: Mapping[str, Any]) -> Call[WebhookDeliveryPage]:
    params = given(fields, skip=("webhook_id",))
    return Call("GET", f"/v1/webhooks/{segment(webhook_id)}/deliveries", parser(WebhookDeliveryPage), params=params)


# Operating the job queue and the reindexing (the operator key)


def retry_failed_jobs(fields: Mapping[str, Any]) -> Call[JobBulkResult]:
    return Call("POST", "/v1/jobs:retry", parser(JobBulkResult), json=given(fields))


def discard_failed_jobs(fields: Mapping[str, Any]) -> Call[JobBulkResult]:
    return Call("POST", "/v1/jobs:discard", parser(JobBulkResult), json=given(fields))


def abandon_job(job_id: str, action: str, fields: Mapping[str, Any]) -> Call[Job]:
    body = given(fields, skip=("job_id",))
    return Call("POST", f"/v1/jobs/{segment(job_id)}/{action}", parser(Job), json=body)


def reindex_progress() -> Call[ReindexProgress]:
    return Call("GET", "/v1/ops/reindex", parser(ReindexProgress))


def set_reindex(action: str, fields: Mapping[str, Any]) -> Call[ReindexProgress]:
    return Call("POST", f"/v1/ops/reindex:{action}", parser(ReindexProgress), json=given(fields))
