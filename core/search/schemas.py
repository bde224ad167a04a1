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

    entities: list[Annotated[str, Field(max_length=1_000)]] | None = Field(
        default=None,
        max_length=MAX_INPUT_ENTITIES,
        description="entity ids in hand (e.g. 'shop.orders.amount'); unresolved ones give a warning, not an error",
    )
    query: dict[str, Any] | None = Field(
        default=None,
        description="an example query (source_model, dimensions, measures, filters) whose entities are the input",
    )
    question: str | None = Field(
        default=None,
        max_length=MAX_QUESTION_CHARS,
        description="the question in words: full-text and dense channels run on it",
    )
    datasource: str | None = Field(
        default=None, description="only entities and memories rooted in this datasource (exact or dotted descendant)"
    )
    max_memories: int = Field(default=5, ge=0, le=MAX_CAP, description="cap of the memories bucket")
    max_example_queries: int = Field(default=2, ge=0, le=MAX_CAP, description="cap of the example-queries bucket")
    max_entities: int = Field(default=5, ge=0, le=MAX_CAP, description="cap of the entities bucket")
    mode: SearchMode = Field(
        default="hybrid", description="hybrid (all channels), recent, important, or typed (needs kind)"
    )
    kind: MemoryKind | None = Field(default=None, description="only memories of this kind")
    category: MemoryCategory | None = Field(default=None, description="only memories of this category")
    # Any of: a memory carrying at least one of these tags is eligible (empty or absent: no tag filter).
    tags: list[Annotated[str, Field(max_length=200)]] | None = Field(
        default=None, max_length=MAX_FILTER_TAGS, description="only memories carrying at least one of these tags"
    )
    persona: str | None = Field(default=None, description="the persona the call acts under")
    agent_id: str | None = Field(
        default=None, description="the agent the call acts for (default: the key's or the query's)"
    )
    # Naive times are UTC, and both are compared in UTC (a naive and an aware one could not be compared).
    occurred_after: Time | None = Field(
        default=None, description="only memories whose occurred_at is at or after this time (naive = UTC)"
    )
    occurred_before: Time | None = Field(
        default=None, description="only memories whose occurred_at is at or before this time (naive = UTC)"
    )
    include_stale: bool = Field(default=False, description="also return stale memories")
    # Hits scoring below this relevance (see core.search.fusion) are left out of every bucket.
    min_score: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="leave out hits whose relevance (0..1, comparable across queries) is below this",
    )

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
    # Every answer carries every field: the OpenAPI document marks them required.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    entity_bm25: bool = False
    fulltext: bool = False
    dense: bool = False
    graph: bool = False


class SearchResponse(BaseModel):
    # Every answer carries every field: the OpenAPI document marks them required.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    memories: list[MemoryHit] = Field(default_factory=list)
    example_queries: list[ExampleQueryHit] = Field(default_factory=list)
    entities: list[EntityHit] = Field(default_factory=list)
    resolved_input_entities: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    channels: Channels = Field(default_factory=Channels)
    degraded: bool = False
