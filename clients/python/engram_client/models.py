"""The shapes engram answers with, as pydantic models.

They mirror the server's OpenAPI schemas (a test in the engram repository compares the two, so they do
not drift). Unknown fields are kept rather than refused, so a newer server never breaks an older SDK.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MemoryKind = Literal[
    "fact",
    "preference",
    "decision",
    "identity",
    "event",
    "observation",
    "goal",
    "todo",
    "knowledge",
    "entity",
    "relationship",
]
MemoryCategory = Literal["core", "daily", "conversation", "workspace"]
MemoryStatus = Literal["active", "forgotten", "stale"]
RelationType = Literal["related_to", "updates", "contradicts", "caused_by", "result_of", "part_of"]
SearchMode = Literal["hybrid", "recent", "important", "typed"]
ListSort = Literal["recent", "importance", "most_accessed"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Association(_Model):
    """A link from one memory to another (``relation_type`` is one of :data:`RelationType`)."""

    target_id: str
    relation_type: RelationType = "related_to"
    weight: float = 0.5


class Memory(_Model):
    id: str
    content: str
    kind: MemoryKind
    category: MemoryCategory
    importance: float
    occurred_at: datetime | None = None
    tags: list[str] = Field(default_factory=list)
    source: str | None = None
    run_id: str | None = None
    persona: str | None = None
    agent_id: str | None = None
    entities: list[str] = Field(default_factory=list)
    query: dict[str, Any] | None = None
    associations: list[Association] = Field(default_factory=list)
    status: MemoryStatus
    stale_reason: str | None = None
    superseded_by: str | None = None
    created_by: str
    created_at: datetime
    updated_at: datetime
    access_count: int = 0
    last_accessed_at: datetime | None = None


class SaveResult(_Model):
    memory_id: str
    entities: list[str]
    warnings: list[str] = Field(default_factory=list)
    similar_existing: list[dict[str, Any]] = Field(default_factory=list)


class ErrorBody(_Model):
    code: str
    message: str
    field: str | None = None


class BatchItemError(_Model):
    error: ErrorBody


class BatchResult(_Model):
    results: list[SaveResult | BatchItemError]


class MemoryPage(_Model):
    memories: list[Memory]
    next_cursor: str | None = None


class ForgetResult(_Model):
    memory_id: str
    status: str


class HydrateResult(_Model):
    memories: list[Memory]
    bytes: int


class MemoryHit(_Model):
    id: str
    score: float
    text: str
    matched_entities: list[str]
    kind: str
    category: str
    importance: float
    created_at: datetime


class ExampleQueryHit(MemoryHit):
    query: dict[str, Any]


class EntityHit(_Model):
    id: str
    kind: str
    score: float
    text: str


class Channels(_Model):
    entity_bm25: bool = False
    fulltext: bool = False
    dense: bool = False
    graph: bool = False


class SearchResponse(_Model):
    memories: list[MemoryHit] = Field(default_factory=list)
    example_queries: list[ExampleQueryHit] = Field(default_factory=list)
    entities: list[EntityHit] = Field(default_factory=list)
    resolved_input_entities: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    channels: Channels = Field(default_factory=Channels)
    degraded: bool = False


class Job(_Model):
    id: str
    kind: str
    state: str
    attempts: int
    error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    payload: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    tenant: str | None = None  # shown to the operator key, which sees every tenant's jobs
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # An operator's discard or cancel: {"by", "reason", "at", "from_state"} (the job is failed).
    abandoned: dict[str, Any] | None = None
