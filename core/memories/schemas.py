"""Request and response models of the memory API (shared by REST, CLI, client and MCP)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.errors import Invalid, PayloadTooLarge
from core.memories.ids import validate_memory_id


def _storable_time(value: datetime) -> datetime:
    """A time every reader can hold: naive means UTC, and in UTC it must fall in years 1..9999 (an offset
    can push 0001-01-01 or 9999-12-31 out of range, and such a row could never be read back)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time is out of range: in UTC it must fall in years 1 to 9999") from None


Time = Annotated[datetime, AfterValidator(_storable_time)]
MAX_SOURCE_CHARS = 10_000
MAX_BODY_DEPTH = 32  # nesting of objects and lists in a request body (a query dict needs about 4)
MAX_LINKS = 1_000  # linked entities, associations and tags of one memory
Tag = Annotated[str, Field(max_length=1_000)]


def _few_links(value: Any) -> Any:
    if isinstance(value, list) and len(value) > MAX_LINKS:
        raise ValueError(f"at most {MAX_LINKS} linked entities, got {len(value)}")
    return value


LinkedEntities = Annotated[
    list[Annotated[str, Field(max_length=1_000)]] | dict[str, Any] | None, AfterValidator(_few_links)
]

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
RelationType = Literal["related_to", "updates", "contradicts", "caused_by", "result_of", "part_of"]
MemoryStatus = Literal["active", "forgotten", "stale"]

MAX_CONTENT_BYTES = 50_000
MAX_BATCH_ITEMS = 1_000

DEFAULT_IMPORTANCE: dict[str, float] = {
    "identity": 1.0,
    "decision": 0.8,
    "preference": 0.7,
    "goal": 0.7,
    "fact": 0.5,
    "event": 0.5,
    "knowledge": 0.5,
    "entity": 0.5,
    "relationship": 0.5,
    "observation": 0.4,
    "todo": 0.3,
}


def check_content_size(content: str) -> str:
    size = len(content.encode("utf-8"))
    if size > MAX_CONTENT_BYTES:
        raise PayloadTooLarge(
            f"content is {size} bytes; the limit is {MAX_CONTENT_BYTES} bytes of UTF-8", field="content"
        )
    return content


class AssociationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_id: str
    relation_type: RelationType = "related_to"
    weight: float = Field(default=0.5, ge=0.0, le=1.0)

    @field_validator("target_id")
    @classmethod
    def _target_id(cls, value: str) -> str:
        return validate_memory_id(value, field="target_id")


class SaveMemoryIn(BaseModel):
    # A field the call does not know is a 422 naming it: a typo must not silently save a different memory.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    content: str = Field(
        validation_alias=AliasChoices("content", "learning"),
        min_length=1,
        description="the memory's text (alias `learning`); at most 50,000 bytes of UTF-8",
    )
    id: str | None = Field(default=None, description="your id for it (upserts); omitted: the tenant's next integer id")
    linked_entities: LinkedEntities = Field(
        default=None,
        validation_alias=AliasChoices("linked_entities", "entities"),
        description="entity ids it is about (alias `entities`; resolved strictly), "
        "or an inline query dict (resolved leniently and stored on the memory)",
    )
    query: dict[str, Any] | None = Field(default=None, description="an example query attached to the memory")
    kind: MemoryKind = Field(default="fact", description="what sort of memory; sets the default importance")
    category: MemoryCategory = Field(
        default="core", description="core (kept), daily (72 h), conversation (dies with its run), workspace"
    )
    importance: float | None = Field(default=None, ge=0.0, le=1.0, description="0..1; default by kind")
    occurred_at: Time | None = Field(default=None, description="when the remembered thing happened (default: now)")
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_LINKS, description="free-form labels")
    source: str | None = Field(default=None, max_length=MAX_SOURCE_CHARS, description="where it came from")
    run_id: str | None = Field(
        default=None, max_length=200, description="the run it belongs to (see DELETE /v1/runs/{run_id})"
    )
    persona: str | None = Field(default=None, max_length=200, description="the persona the call acts under")
    agent_id: str | None = Field(
        default=None, max_length=200, description="the agent the call acts for (default: the key's or the query's)"
    )
    associations: list[AssociationIn] = Field(
        default_factory=list, max_length=MAX_LINKS, description="links to other memories"
    )
    sync_embed: bool = Field(default=False, description="embed before answering (similar_existing is then filled)")

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else validate_memory_id(value)


class PatchMemoryIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    content: str | None = Field(
        default=None,
        validation_alias=AliasChoices("content", "learning"),
        min_length=1,
        description="new text (alias `learning`)",
    )
    kind: MemoryKind | None = None
    category: MemoryCategory | None = None
    tags: list[Tag] | None = Field(default=None, max_length=MAX_LINKS)
    importance: float | None = Field(default=None, ge=0.0, le=1.0, description="0..1; null: back to the kind's default")
    linked_entities: LinkedEntities = Field(
        default=None,
        validation_alias=AliasChoices("linked_entities", "entities"),
        description="new entities (alias `entities`), or an inline query dict",
    )
    occurred_at: Time | None = Field(default=None, description="new event time; null: back to the creation time")
    source: str | None = Field(default=None, max_length=MAX_SOURCE_CHARS)
    associations: list[AssociationIn] | None = Field(
        default=None, max_length=MAX_LINKS, description="replaces the memory's associations"
    )
    sync_embed: bool = Field(default=False, description="embed the new content before answering")
    # Who the edit acts for (as on every call, the body or the query may say it); not a revised field.
    agent_id: str | None = Field(
        default=None, max_length=200, description="the agent the call acts for (default: the key's or the query's)"
    )
    persona: str | None = Field(default=None, max_length=200, description="the persona the call acts under")


class SaveBatchIn(BaseModel):
    """`POST /v1/memories:batch`. Items are validated one by one (a bad item is an error in its slot)."""

    model_config = ConfigDict(extra="forbid")

    items: list[SaveMemoryIn] = Field(max_length=MAX_BATCH_ITEMS, description="save bodies, up to 1,000")
    agent_id: str | None = Field(
        default=None, max_length=200, description="the agent the call acts for (default: the key's or the query's)"
    )
    persona: str | None = Field(default=None, max_length=200, description="the persona the call acts under")


class HydrateIn(BaseModel):
    """`POST /v1/hydrate`: the memories that fit `budget_bytes` of content."""

    model_config = ConfigDict(extra="forbid")

    budget_bytes: int = Field(ge=0, description="how many bytes of content to fill")
    agent_id: str | None = Field(
        default=None, max_length=200, description="the agent the call acts for (default: the key's or the query's)"
    )
    persona: str | None = Field(default=None, max_length=200, description="the persona the call acts under")


def unknown_fields(model: type[BaseModel], body: dict[str, Any]) -> None:
    """422 naming the first key of `body` that `model` does not declare (for bodies checked by hand)."""
    known = set(model.model_fields)
    for key in body:
        if key not in known:
            raise Invalid(f"{key}: Extra inputs are not permitted", field=str(key))


def _similar_existing_is_optional(schema: dict[str, Any]) -> None:
    # The results of a batch carry no similar_existing; a single save's answer always does.
    schema["required"] = [name for name in schema.get("required", []) if name != "similar_existing"]


class SaveResult(BaseModel):
    # The OpenAPI document marks required what every answer carries (generated clients type it as present).
    model_config = ConfigDict(
        json_schema_serialization_defaults_required=True, json_schema_extra=_similar_existing_is_optional
    )

    memory_id: str
    entities: list[str]
    warnings: list[str] = Field(default_factory=list)
    similar_existing: list[dict[str, Any]] = Field(default_factory=list)


class ListFilters(BaseModel):
    kind: MemoryKind | None = Field(default=None, description="only memories of this kind")
    category: MemoryCategory | None = Field(default=None, description="only memories of this category")
    tags: list[str] = Field(
        default_factory=list,
        description="only memories carrying at least one of these tags (repeat the parameter or comma-separate)",
    )
    run_id: str | None = Field(default=None, description="only memories of this run")
    status: MemoryStatus = Field(default="active", description="active (default), stale, or forgotten (admins)")
    since: Time | None = Field(default=None, description="only memories created at or after this time")
    # Event time bounds (``occurred_at``), both inclusive, as on search.
    occurred_after: Time | None = Field(
        default=None, description="only memories whose occurred_at is at or after this time"
    )
    occurred_before: Time | None = Field(
        default=None, description="only memories whose occurred_at is at or before this time"
    )
    entity: str | None = Field(
        default=None, description="only memories linked to this entity or one of its dotted descendants"
    )
    sort: Literal["recent", "importance", "most_accessed"] = Field(
        default="recent", description="recent, importance or most_accessed"
    )
    limit: int = Field(default=50, ge=1, le=200, description="page size (at most 200)")
    cursor: str | None = Field(default=None, description="the next_cursor of the previous page")

    @field_validator("tags", mode="before")
    @classmethod
    def _split_tags(cls, value: Any) -> Any:
        """`tags=a,b` (a query string, the CLI) and `["a", "b"]` mean the same filter."""
        items = [value] if isinstance(value, str) else value
        if isinstance(items, list) and all(isinstance(t, str) for t in items):
            return [tag for item in items for tag in item.split(",") if tag]
        return value


def _first_error_field(exc: Any) -> tuple[str, str]:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error.get("loc", ()))
    return field, f"{field or 'body'}: {error.get('msg', 'invalid value')}"


def _unstorable(text: str) -> bool:
    """PostgreSQL text cannot hold NUL, and UTF-8 cannot hold an unpaired surrogate (JSON lets both in)."""
    if text.isascii():
        return "\x00" in text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return "\x00" in text


def _at(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _check_body(value: Any, path: str = "", depth: int = 0) -> None:
    """Reject what a body may carry but the database or JSON cannot hold: NUL and unpaired surrogates in
    text (values and keys), non-finite numbers, non-JSON values (YAML dates, bytes, sets) and nesting past
    MAX_BODY_DEPTH (which also stops self-referencing YAML aliases). Raises Invalid naming the field."""
    if isinstance(value, str):
        if _unstorable(value):
            raise Invalid("text may not contain NUL (\\u0000) characters or unpaired surrogates", field=path or None)
    elif isinstance(value, bool) or value is None or isinstance(value, int):
        return
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise Invalid("numbers must be finite (no NaN or Infinity)", field=path or None)
    elif isinstance(value, dict | list):
        if depth >= MAX_BODY_DEPTH:
            raise Invalid(f"the body nests deeper than {MAX_BODY_DEPTH} levels", field=path or None)
        is_dict = isinstance(value, dict)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if is_dict and (not isinstance(key, str) or _unstorable(key)):
                raise Invalid(
                    "object keys must be text without NUL characters or unpaired surrogates", field=_at(path, key)
                )
            # Text, the most of any body, is checked here; the path is spelled only for an error or a container.
            if type(item) is str:
                if _unstorable(item):
                    _check_body(item, _at(path, key), depth + 1)
            elif not (item is None or type(item) is bool or type(item) is int):
                _check_body(item, _at(path, key), depth + 1)
    else:
        raise Invalid(f"unsupported value of type {type(value).__name__}: use JSON types", field=path or None)


def parse_model(model: type[BaseModel], body: Any, *, prefix: str = "") -> Any:
    """Validate a request body into `model`, turning pydantic errors into a 422 naming the field.

    Oversized content is checked first so it answers 413 whatever else is wrong with the body.
    """
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object", field=prefix.rstrip(".") or None)
    try:
        _check_body(body)
    except Invalid as exc:
        exc.field = prefix + exc.field if exc.field else prefix.rstrip(".") or None
        raise
    for key in ("content", "learning"):
        if isinstance(body.get(key), str):
            check_content_size(body[key])
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        field, message = _first_error_field(exc)
        raise Invalid(message, field=prefix + field if field else prefix.rstrip(".") or None) from None
