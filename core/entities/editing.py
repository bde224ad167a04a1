"""Model edits (PUT and PATCH): descriptions, labels, hidden flags, columns, measures, aggregations.

One edit is one transaction: it bumps the tenant's change_seq once and stamps every doc whose text or
visibility changed (hiding a model changes the visibility of its whole subtree); removals go through
the cascade. Newly hidden docs lose their embeddings, changed visible docs are re-embedded, and columns
whose values may differ (added, or with a new type or SQL) get their samples refreshed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from core.changes import bump_change_seq
from core.entities.cascade import Removal, remove_entities
from core.entities.models import (
    CATEGORICAL,
    NUMERIC,
    OTHER,
    TEMPORAL,
    CatalogAggregation,
    CatalogColumn,
    CatalogMeasure,
    CatalogModel,
)
from core.entities.schemas import ColumnIn, ModelPatchIn, ModelPutIn, check_leaf_name
from core.entities.service import get_datasource, get_model
from core.entities.store import touch_catalog
from core.errors import Conflict, Invalid, NotFound
from core.jobs.service import enqueue
from core.vectors import Embedding

_FAMILY_HINTS = (
    (TEMPORAL, ("date", "time", "interval")),
    (NUMERIC, ("int", "num", "dec", "float", "double", "real", "money", "serial")),
    (CATEGORICAL, ("char", "text", "string", "enum", "bool", "citext")),
)


def family_from_type_name(type_name: str | None) -> str:
    """The profiling family of a type given by name (columns added by hand)."""
    lowered = (type_name or "").lower()
    for family, hints in _FAMILY_HINTS:
        if any(h in lowered for h in hints):
            return family
    return OTHER


@dataclass
class _Edit:
    tenant_id: int
    model: CatalogModel
    change_seq: int
    changed: set[str] = field(default_factory=set)  # doc ids whose text or visibility changed
    hidden_now: set[str] = field(default_factory=set)
    resample: list[str] = field(default_factory=list)
    removal: Removal = field(default_factory=Removal)

    @property
    def model_id(self) -> str:
        return f"{self.model.datasource}.{self.model.name}"

    def leaf_id(self, name: str) -> str:
        return f"{self.model_id}.{name}"


def _leaves(session: Session, table: Any, model: CatalogModel) -> dict[str, Any]:
    rows = session.scalars(
        select(table).where(table.datasource == model.datasource, table.model == model.name).with_for_update()
    ).all()
    return {row.name: row for row in rows}


def _set_model_fields(session: Session, edit: _Edit, values: dict[str, Any]) -> None:
    model = edit.model
    for name, value in values.items():
        if getattr(model, name) != value:
            setattr(model, name, value)
            model.change_seq = edit.change_seq
            edit.changed.add(edit.model_id)
            if name == "hidden":
                _stamp_subtree(session, edit)
                if value:
                    edit.hidden_now.add(edit.model_id)


def _stamp_subtree(session: Session, edit: _Edit) -> None:
    """Visibility of every child follows the model's: the change feed must report each of them again."""
    for table in (CatalogColumn, CatalogMeasure, CatalogAggregation):
        names = session.scalars(
            update(table)
            .where(table.datasource == edit.model.datasource, table.model == edit.model.name)
            .values(change_seq=edit.change_seq)
            .returning(table.name)
            .execution_options(synchronize_session=False)
        ).all()
        edit.changed.update(edit.leaf_id(n) for n in names)


def _apply_column(session: Session, edit: _Edit, existing: dict[str, CatalogColumn], spec: ColumnIn) -> None:
    given = spec.model_dump(exclude_unset=True, exclude={"name"})
    column = existing.get(spec.name)
    if column is None:
        try:
            check_leaf_name(spec.name)
        except ValueError as exc:
            raise Invalid(str(exc), field="columns.name") from None
        column = CatalogColumn(
            tenant_id=edit.tenant_id,
            datasource=edit.model.datasource,
            model=edit.model.name,
            name=spec.name,
            data_type=spec.type or "",
            type_family=family_from_type_name(spec.type),
            nullable=True,
            is_primary_key=False,
            position=max([c.position for c in existing.values()], default=-1) + 1,
            label=spec.label,
            description=spec.description,
            hidden=bool(spec.hidden),
            origin="manual",
            sql=spec.sql,
            change_seq=edit.change_seq,
        )
        session.add(column)
        existing[spec.name] = column
        edit.changed.add(edit.leaf_id(spec.name))
        if spec.sql is None:
            edit.resample.append(spec.name)
        return
    values = {("data_type" if k == "type" else k): v for k, v in given.items()}
    if "hidden" in values:
        values["hidden"] = bool(values["hidden"])
    if "data_type" in values:
        values["data_type"] = values["data_type"] or ""
        values["type_family"] = family_from_type_name(values["data_type"])
    touched = {k: v for k, v in values.items() if getattr(column, k) != v}
    for k, v in touched.items():
        setattr(column, k, v)
    if touched:
        column.change_seq = edit.change_seq
        edit.changed.add(edit.leaf_id(column.name))
    if touched.get("hidden"):
        edit.hidden_now.add(edit.leaf_id(column.name))
    if {"data_type", "sql"} & set(touched) and column.sql is None:
        edit.resample.append(column.name)


def _upsert_named(session: Session, edit: _Edit, *, table: Any, existing: dict[str, Any], specs: list[Any]) -> None:
    for spec in specs:
        values = spec.model_dump(exclude={"name"})
        row = existing.get(spec.name)
        if row is None:
            row = table(
                tenant_id=edit.tenant_id,
                datasource=edit.model.datasource,
                model=edit.model.name,
                name=spec.name,
                change_seq=edit.change_seq,
                **values,
            )
            session.add(row)
            existing[spec.name] = row
            edit.changed.add(edit.leaf_id(spec.name))
        elif any(getattr(row, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(row, k, v)
            row.change_seq = edit.change_seq
            edit.changed.add(edit.leaf_id(spec.name))


def _remove(edit: _Edit, *, kind: str, existing: dict[str, Any], names: list[str], field_name: str) -> None:
    for name in dict.fromkeys(names):
        if name not in existing:
            raise Invalid(f"{edit.model_id} has no {kind} {name!r}", field=field_name)
        existing.pop(name)
        edit.removal.add(kind=kind, canonical_id=edit.leaf_id(name))


def _check_unique_leaves(edit: _Edit, *groups: dict[str, Any]) -> None:
    """A leaf id names one thing: columns, measures and aggregations of a model never share a name."""
    seen: dict[str, int] = {}
    for index, group in enumerate(groups):
        for name in group:
            if name in seen and seen[name] != index:
                raise Conflict(f"{edit.leaf_id(name)} is already a {('column', 'measure', 'aggregation')[seen[name]]}")
            seen[name] = index


def _begin(session: Session, *, tenant_id: int, datasource: str, name: str, create: ModelPutIn | None) -> _Edit:
    _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
    try:
        model = get_model(session, datasource=datasource, name=name, lock=True)
    except NotFound:
        if create is None:
            raise
        get_datasource(session, name=datasource)
        try:
            check_leaf_name(name)
        except ValueError as exc:
            raise Invalid(f"model name {name!r}: {exc}", field="name") from None
        model = CatalogModel(
            tenant_id=tenant_id,
            datasource=datasource,
            name=name,
            table_name=create.table or name,
            hidden=False,
            origin="manual",
            change_seq=change_seq,
        )
        session.add(model)
        session.flush()
        edit = _Edit(tenant_id=tenant_id, model=model, change_seq=change_seq)
        edit.changed.add(edit.model_id)
        return edit
    return _Edit(tenant_id=tenant_id, model=model, change_seq=change_seq)


def put_model(session: Session, *, tenant_id: int, datasource: str, name: str, body: ModelPutIn) -> None:
    edit = _begin(session, tenant_id=tenant_id, datasource=datasource, name=name, create=body)
    _set_model_fields(session, edit, {"label": body.label, "description": body.description, "hidden": body.hidden})
    columns = _leaves(session, CatalogColumn, edit.model)
    if body.columns is not None:
        listed = {c.name for c in body.columns}
        _remove(
            edit,
            kind="column",
            existing=columns,
            names=[c for c in columns if c not in listed],
            field_name="columns",
        )
        for spec in body.columns:
            _apply_column(session, edit, columns, spec)
    measures = _leaves(session, CatalogMeasure, edit.model)
    aggregations = _leaves(session, CatalogAggregation, edit.model)
    keep_m, keep_a = {m.name for m in body.measures}, {a.name for a in body.aggregations}
    _remove(
        edit,
        kind="measure",
        existing=measures,
        names=[m for m in measures if m not in keep_m],
        field_name="measures",
    )
    _remove(
        edit,
        kind="aggregation",
        existing=aggregations,
        names=[a for a in aggregations if a not in keep_a],
        field_name="aggregations",
    )
    _upsert_named(session, edit, table=CatalogMeasure, existing=measures, specs=body.measures)
    _upsert_named(session, edit, table=CatalogAggregation, existing=aggregations, specs=body.aggregations)
    _finish(session, edit, columns, measures, aggregations)


def patch_model(session: Session, *, tenant_id: int, datasource: str, name: str, body: ModelPatchIn) -> None:
    edit = _begin(session, tenant_id=tenant_id, datasource=datasource, name=name, create=None)
    fields = body.model_dump(exclude_unset=True, include={"label", "description", "hidden"})
    if fields.get("hidden", False) is None:
        raise Invalid("hidden must be true or false", field="hidden")
    _set_model_fields(session, edit, fields)
    columns = _leaves(session, CatalogColumn, edit.model)
    measures = _leaves(session, CatalogMeasure, edit.model)
    aggregations = _leaves(session, CatalogAggregation, edit.model)
    _remove(edit, kind="column", existing=columns, names=body.remove_columns, field_name="remove_columns")
    _remove(edit, kind="measure", existing=measures, names=body.remove_measures, field_name="remove_measures")
    _remove(
        edit,
        kind="aggregation",
        existing=aggregations,
        names=body.remove_aggregations,
        field_name="remove_aggregations",
    )
    for spec in body.columns:
        _apply_column(session, edit, columns, spec)
    _upsert_named(session, edit, table=CatalogMeasure, existing=measures, specs=body.measures)
    _upsert_named(session, edit, table=CatalogAggregation, existing=aggregations, specs=body.aggregations)
    _finish(session, edit, columns, measures, aggregations)


def _finish(session: Session, edit: _Edit, *leaf_groups: dict[str, Any]) -> None:
    _check_unique_leaves(edit, *leaf_groups)
    session.flush()
    remove_entities(session, tenant_id=edit.tenant_id, removal=edit.removal, change_seq=edit.change_seq)
    if edit.hidden_now:
        # Hidden docs must leave the dense channel too; a hidden model takes its subtree with it.
        doc_ids = [d for d in edit.changed if any(d == h or d.startswith(h + ".") for h in edit.hidden_now)]
        session.execute(
            delete(Embedding).where(Embedding.canonical_id.in_(doc_ids)).execution_options(synchronize_session=False)
        )
    touch_catalog(session, tenant_id=edit.tenant_id, change_seq=edit.change_seq)
    ds = edit.model.datasource
    if edit.changed:
        enqueue(session, tenant_id=edit.tenant_id, kind="embed", payload={"doc_ids": sorted(edit.changed)})
    if edit.resample and edit.model.table_name:
        enqueue(
            session,
            tenant_id=edit.tenant_id,
            kind="refresh_samples",
            payload={"datasource": ds, "models": [edit.model.name], "columns": sorted(set(edit.resample))},
        )
