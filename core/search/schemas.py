"""Request and response models of search (CONTRACT section 6), shared by REST, CLI, MCP and benches."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from core.errors import Invalid
from core.memories.schemas import MemoryCategory, MemoryKind, Time

SearchMode = Literal["hybrid", "recent", "important", "typed"]
# A cap above this is refused: each channel ranks a fixed depth per bucket (see core.search.service).
MAX_CAP = 100
MAX_QUESTION_CHARS = 10_000
MAX_INPUT_ENTITIES = 200
MAX_FILTER_TAGS = 100


class SearchRequest(BaseModel):
    # A field search does not know is a 422 naming it, not unfiltered results.
    model_config = ConfigDict(extra="forbid")

    entities: list[Annotated[str, Field(max_length=1_000)]] | None = Field(default=None, max_length=MAX_INPUT_ENTITIES)
    query: dict[str, Any] | None = None
    question: str | None = Field(default=None, max_length=MAX_QUESTION_CHARS)
    datasource: str | None = None
    max_memories: int = Field(default=5, ge=0, le=MAX_CAP)
    max_example_queries: int = Field(default=2, ge=0, le=MAX_CAP)
    max_entities: int = Field(default=5, ge=0, le=MAX_CAP)
    mode: SearchMode = "hybrid"
    kind: MemoryKind | None = None
    category: MemoryCategory | None = None
    # Any of: a memory carrying at least one of these tags is eligible (empty or absent: no tag filter).
    tags: list[Annotated[str, Field(max_length=200)]] | None = Field(default=None, max_length=MAX_FILTER_TAGS)
    persona: str | None = None
    agent_id: str | None = None
    # Naive times are UTC, and both are compared in UTC (a naive and an aware one could not be compared).
    occurred_after: Time | None = None
    occurred_before: Time | None = None
    include_stale: bool = False
    # Hits scoring below this relevance (see core.search.fusion) are left out of every bucket.
    min_score: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)

    @field_validator("datasource")
    @classmethod
    def _datasource(cls, value: str | None) -> str | None:
        return value or None

    def check(self) -> None:
        """Rules across fields, raised as 422 naming the field."""
        if self.mode == "typed" and self.kind is None:
            raise Invalid("mode 'typed' requires kind", field="kind")
        if (
            self.occurred_after is not None
            and self.occurred_before is not None
            and self.occurred_after > self.occurred_before
        ):
            raise Invalid("occurred_after is later than occurred_before", field="occurred_after")

    @property
    def question_text(self) -> str:
        return (self.question or "").strip()

    @property
    def has_entity_input(self) -> bool:
        return bool(self.entities) or bool(self.query)


class MemoryHit(BaseModel):
    id: str
    # Relevance in [0, 1], comparable across queries: 1 when first in every channel that ran.
    score: float
    text: str
    matched_entities: list[str]
    kind: str
    category: str
    importance: float
    created_at: str


class ExampleQueryHit(MemoryHit):
    query: dict[str, Any]


class EntityHit(BaseModel):
    id: str
    kind: str
    score: float
    text: str


class Channels(BaseModel):
    entity_bm25: bool = False
    fulltext: bool = False
    dense: bool = False
    graph: bool = False


class SearchResponse(BaseModel):
    memories: list[MemoryHit] = Field(default_factory=list)
    example_queries: list[ExampleQueryHit] = Field(default_factory=list)
    entities: list[EntityHit] = Field(default_factory=list)
    resolved_input_entities: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    channels: Channels = Field(default_factory=Channels)
    degraded: bool = False
