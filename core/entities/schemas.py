"""Request models of the catalog API (REST and CLI share them)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Datasource names are the first segment of every canonical id: no '.', nothing that needs quoting.
DATASOURCE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
# Names given by hand (models, columns, measures, aggregations) must be formula tokens as well.
LEAF_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")


def check_datasource_name(value: str) -> str:
    if not DATASOURCE_NAME_RE.match(value):
        raise ValueError(
            "a datasource name starts with a letter or '_', then letters, digits, '_' or '-' "
            "(no '.'), at most 64 characters"
        )
    return value


def check_leaf_name(value: str) -> str:
    if not LEAF_NAME_RE.match(value):
        raise ValueError("a name starts with a letter or '_', then letters, digits or '_', at most 200 characters")
    return value


class DatasourceIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    url: str = Field(min_length=1)
    description: str | None = None
    # The source schema to reflect; default: the connection's default schema.
    schema_name: str | None = Field(default=None, alias="schema", min_length=1, max_length=200)

    _name = field_validator("name")(check_datasource_name)


class _Named(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str

    _name = field_validator("name")(check_leaf_name)


class ColumnIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Existing (reflected) columns may carry any name the source has; new ones are checked on add.
    name: str = Field(min_length=1, max_length=200)
    type: str | None = Field(default=None, max_length=200)
    label: str | None = None
    description: str | None = None
    hidden: bool | None = None
    sql: str | None = None


class MeasureIn(_Named):
    formula: str = Field(min_length=1)
    label: str | None = None
    description: str | None = None


class AggregationIn(_Named):
    formula: str = Field(min_length=1)
    params: dict[str, Any] | None = None
    description: str | None = None


class ModelPatchIn(BaseModel):
    """Partial edit: only the fields given change. ``columns`` / ``measures`` / ``aggregations`` upsert by
    name; ``remove_*`` delete (with the memory-reference cascade)."""

    model_config = ConfigDict(extra="forbid")

    label: str | None = None
    description: str | None = None
    hidden: bool | None = None
    columns: list[ColumnIn] = []
    remove_columns: list[str] = []
    measures: list[MeasureIn] = []
    remove_measures: list[str] = []
    aggregations: list[AggregationIn] = []
    remove_aggregations: list[str] = []


class ModelPutIn(BaseModel):
    """Full definition: creates the model when absent (from ``table``, default the model name), else
    replaces its label, description, hidden flag, measures and aggregations; ``columns``, when given, is
    the complete column list (unlisted columns are removed)."""

    model_config = ConfigDict(extra="forbid")

    label: str | None = None
    description: str | None = None
    hidden: bool = False
    table: str | None = Field(default=None, min_length=1, max_length=200)
    columns: list[ColumnIn] | None = None
    measures: list[MeasureIn] = []
    aggregations: list[AggregationIn] = []


class NoOptionsIn(BaseModel):
    """The body of a call that takes no options (ingest, job retry): absent, `{}`, or a 422 naming the field
    it does not know, so a misspelt option is never silently ignored."""

    model_config = ConfigDict(extra="forbid")


class RefreshSamplesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[str] | None = None
