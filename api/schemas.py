"""Response models of the REST API: the OpenAPI description's success bodies, and what the Python clients
(remote and local) and the MCP server parse.

Request models are the core ones (``SaveMemoryIn``, ``PatchMemoryIn``, ``ListFilters``, ``SearchRequest``,
``DatasourceIn``, ``ModelPutIn``, ``ModelPatchIn``); ``SaveResult`` and ``SearchResponse`` are core
responses. Models here allow extra fields so a newer server never breaks an older client.

An answer's field is ``required`` in the document when every answer carries it, even where the model has a
default (``json_schema_serialization_defaults_required``), so generated clients (the TypeScript one) type
it as present (tests/test_client.py checks every answer of a scenario against it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core.memories.schemas import SaveResult

ANSWER = ConfigDict(json_schema_serialization_defaults_required=True)


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow", **ANSWER)


class AssociationOut(_Out):
    target_id: str
    relation_type: str
    weight: float


class Memory(_Out):
    id: str
    content: str
    kind: str
    category: str
    importance: float
    occurred_at: datetime | None = None
    tags: list[str] = Field(default_factory=list)
    source: str | None = None
    run_id: str | None = None
    persona: str | None = None
    agent_id: str | None = None
    entities: list[str] = Field(default_factory=list)
    query: dict[str, Any] | None = None
    associations: list[AssociationOut] = Field(default_factory=list)
    status: str
    stale_reason: str | None = None
    superseded_by: str | None = None
    created_by: str
    created_at: datetime
    updated_at: datetime
    access_count: int = 0
    last_accessed_at: datetime | None = None


class MemoryVersion(_Out):
    content: str
    kind: str
    category: str
    tags: list[str] = Field(default_factory=list)
    importance: float
    entities: list[str] = Field(default_factory=list)
    changed_by: str
    changed_at: datetime


class MemoryHistory(_Out):
    versions: list[MemoryVersion]


class MemoryPage(_Out):
    memories: list[Memory]
    next_cursor: str | None = None


def sometimes(*fields: str) -> ConfigDict:
    """The config of an answer that carries ``fields`` only in some cases: not required in the document."""

    def optional(schema: dict[str, Any]) -> None:
        schema["required"] = [name for name in schema.get("required", []) if name not in fields]

    return ConfigDict(json_schema_extra=optional)


class ErrorBody(_Out):
    """The contract's error object; more keys may follow (e.g. `status` in MCP answers)."""

    # `field` names the offending field on a 422; other errors leave it out.
    model_config = sometimes("field")

    code: str = Field(description="machine-readable kind of error", examples=["validation_error"])
    message: str = Field(description="what went wrong, for a human", examples=["kind: Input should be 'fact', ..."])
    field: str | None = Field(default=None, description="on 422: the offending field's path", examples=["kind"])


class ErrorResponse(_Out):
    """Every error of every route: ``{"error": {"code", "message", "field"?}}``."""

    error: ErrorBody


class BatchItemError(_Out):
    error: ErrorBody


class BatchResult(_Out):
    results: list[SaveResult | BatchItemError]


class ForgetResult(_Out):
    memory_id: str
    status: str


class HydrateResult(_Out):
    memories: list[Memory]
    bytes: int


class ImportResult(_Out):
    imported: int
    memory_ids: list[str]
    warnings: list[str] = Field(default_factory=list)


class IssuedKeyOut(_Out):
    api_key: str
    id: str
    user: str
    role: str
    tenant: str
    agent_id: str | None = None
    persona: str | None = None
    read_only: bool = False


class KeyOut(_Out):
    id: str
    user: str
    role: str
    agent_id: str | None = None
    persona: str | None = None
    read_only: bool = False
    created_at: datetime | None = None


class KeyList(_Out):
    keys: list[KeyOut]


class KeyRevoked(_Out):
    id: str
    revoked: bool


class Datasource(_Out):
    # A listed datasource carries model_count, a single one its models' names.
    model_config = sometimes("models", "model_count")

    name: str
    url: str
    dialect: str | None = None
    description: str | None = None
    schema_name: str | None = Field(default=None, alias="schema")
    created_at: datetime | None = None
    updated_at: datetime | None = None
    last_ingested_at: datetime | None = None
    models: list[str] | None = None
    model_count: int | None = None


class DatasourceList(_Out):
    datasources: list[Datasource]


class Deleted(_Out):
    """A datasource or model delete, with the cascade's counters as extra fields."""

    status: str


class JobAccepted(_Out):
    job_id: str


class Job(_Out):
    id: str
    kind: str
    state: str
    attempts: int
    error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    payload: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    tenant: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # An operator's discard or cancel: {"by", "reason", "at", "from_state"} (the job is failed).
    abandoned: dict[str, Any] | None = None


class JobBulkResult(_Out):
    count: int
    job_ids: list[str]


class JobPage(_Out):
    jobs: list[Job]
    next_cursor: str | None = None


class RunEnded(_Out):
    run_id: str
    status: str
    count: int
    skipped: int


class CoverageRow(_Out):
    tenant: str
    doc_kind: str
    model: str
    indexed: int
    expected: int
    ratio: float
    waiting: str | None = Field(
        default=None, description="why embedding waits, when it does (a spent daily quota, a suspended tenant)"
    )


class ModelInspection(_Out):
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


class CoverageReport(_Out):
    coverage: list[CoverageRow]


class Health(_Out):
    status: str = Field(examples=["ok"])


class Readiness(_Out):
    status: str = Field(description="`ready`, or `unavailable` (with a 503)", examples=["ready"])
    checks: dict[str, str] = Field(description="per dependency: `ok` or why not", examples=[{"database": "ok"}])


class AuditActor(_Out):
    user: str | None = None
    key_id: str | None = None
    agent_id: str | None = None


class AuditEntryOut(_Out):
    id: str
    at: datetime
    action: str
    actor: AuditActor
    target: str | None = None
    request_id: str | None = None


class AuditPage(_Out):
    entries: list[AuditEntryOut]
    next_cursor: str | None = None


class WebhookOut(_Out):
    id: str
    url: str
    events: list[str]
    description: str | None = None
    state: str
    disabled_reason: str | None = None
    failing_since: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class WebhookCreated(WebhookOut):
    secret: str = Field(description="the signing secret (Standard Webhooks `whsec_...`), shown only now")


class WebhookUpdated(WebhookOut):
    model_config = sometimes("secret")

    secret: str | None = Field(default=None, description="the new signing secret, only when one was issued")


class WebhookList(_Out):
    webhooks: list[WebhookOut]


class WebhookDeleted(_Out):
    id: str
    deleted: bool


class DeliveryAttempt(_Out):
    attempt: int
    at: datetime
    status: int | None = None
    error: str | None = None
    duration_ms: float | None = None


class WebhookDeliveryOut(_Out):
    id: str
    type: str
    state: str
    attempts: list[DeliveryAttempt]
    next_attempt_at: datetime | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    data: dict[str, Any] | None = None


class WebhookDeliveryPage(_Out):
    deliveries: list[WebhookDeliveryOut]
    next_cursor: str | None = None
