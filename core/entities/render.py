"""The one renderer: the text each doc contributes to full-text, embeddings, content hashes and hits.

A memory's text is its content alone, so rewriting its entity tags (cascades, cleanup) never changes its
content hash and never re-embeds it.
"""

from __future__ import annotations

import hashlib
import json

from core.entities.models import (
    CatalogAggregation,
    CatalogColumn,
    CatalogMeasure,
    CatalogModel,
    Datasource,
)
from core.memories.models import Memory


def render_memory(memory: Memory) -> str:
    return render_memory_content(memory.content)


def render_memory_content(content: str) -> str:
    """A memory's text from its content alone (what render_memory makes of it), for rows read without
    building an ORM object per row."""
    return content


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- Catalog docs: datasources, models, columns, named measures, custom aggregations ---
# The URL (credentials) never enters a datasource's text; meta-like fields stay out as well.


def _lines(*pairs: tuple[str, object]) -> str:
    return "\n".join(f"{label}: {value}" for label, value in pairs if value not in (None, ""))


def render_datasource(datasource: Datasource) -> str:
    return _lines(
        ("Datasource", datasource.name),
        ("Dialect", datasource.dialect),
        ("Description", datasource.description),
    )


def render_model(model: CatalogModel) -> str:
    return _lines(
        ("Model", f"{model.datasource}.{model.name}"),
        ("Label", model.label),
        ("Description", model.description),
        ("Table", model.table_name if model.table_name != model.name else None),
    )


def render_column(column: CatalogColumn) -> str:
    """Sample values prefer the structured top-50 list (JSON, so values holding commas stay whole);
    an empty list is authoritative and skipped; without a list the ``sampled`` text (ranges) is used."""
    samples: str | None = column.sampled
    distinct: int | None = None
    if column.sampled_values is not None:
        samples = json.dumps(column.sampled_values, ensure_ascii=False) if column.sampled_values else None
        if column.distinct_count is not None and column.distinct_count > len(column.sampled_values):
            distinct = column.distinct_count
    return _lines(
        ("Column", f"{column.datasource}.{column.model}.{column.name}"),
        ("Type", column.data_type),
        ("Label", column.label),
        ("Description", column.description),
        ("SQL", column.sql),
        ("Sample values", samples),
        ("Distinct count", distinct),
    )


def render_measure(measure: CatalogMeasure) -> str:
    return _lines(
        ("Measure", f"{measure.datasource}.{measure.model}.{measure.name}"),
        ("Formula", measure.formula),
        ("Label", measure.label),
        ("Description", measure.description),
    )


def render_aggregation(aggregation: CatalogAggregation) -> str:
    return _lines(
        ("Aggregation", f"{aggregation.datasource}.{aggregation.model}.{aggregation.name}"),
        ("Formula", aggregation.formula),
        ("Params", json.dumps(aggregation.params, sort_keys=True) if aggregation.params else None),
        ("Description", aggregation.description),
    )
