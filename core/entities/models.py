"""Catalog tables: datasources, models, columns, named measures, custom aggregations, foreign keys.

Every doc-bearing row (datasource, model, column, measure, aggregation) carries ``change_seq``, stamped
from the tenant's change sequence on every write, so derived indexes catch up from ``change_seq > since``;
deletions leave :class:`core.memories.models.Tombstone` rows. Children reference their parent with
composite foreign keys that cascade, so a datasource row cannot outlive its models in the database.
``catalog_state.version`` moves on every catalog write and keys the per-process snapshot cache.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from core.db import Base, TenantScoped

NAME_LENGTH = 200

# Column families decide how a column is profiled (see core.entities.profiling).
CATEGORICAL, NUMERIC, TEMPORAL, OTHER = "categorical", "numeric", "temporal", "other"


def _parent(columns: list[str], table: str, parent_columns: list[str]) -> ForeignKeyConstraint:
    return ForeignKeyConstraint(
        ["tenant_id", *columns],
        [f"{table}.tenant_id", *(f"{table}.{c}" for c in parent_columns)],
        ondelete="CASCADE",
    )


class Datasource(TenantScoped, Base):
    __tablename__ = "catalog_datasources"
    __table_args__ = (Index("ix_catalog_datasources_seq", "tenant_id", "change_seq"),)

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    dialect: Mapped[str] = mapped_column(String(50))
    # The full URL, Fernet-encrypted with the settings key; only the redacted form is ever returned.
    url_encrypted: Mapped[str] = mapped_column(Text)
    url_redacted: Mapped[str] = mapped_column(Text)
    schema_name: Mapped[str | None] = mapped_column(String(NAME_LENGTH), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_ingested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    change_seq: Mapped[int] = mapped_column(BigInteger, default=0)


class CatalogModel(TenantScoped, Base):
    __tablename__ = "catalog_models"
    __table_args__ = (
        _parent(["datasource"], "catalog_datasources", ["name"]),
        Index("ix_catalog_models_seq", "tenant_id", "change_seq"),
    )

    datasource: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    # The source table; None for a model defined by hand without one (never profiled).
    table_name: Mapped[str | None] = mapped_column(String(NAME_LENGTH), nullable=True)
    label: Mapped[str | None] = mapped_column(Text, nullable=True)
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    hidden: Mapped[bool] = mapped_column(Boolean, default=False)
    # "reflected" models vanish when their table does; "manual" ones only on request.
    origin: Mapped[str] = mapped_column(String(20), default="reflected")
    change_seq: Mapped[int] = mapped_column(BigInteger, default=0)


class CatalogColumn(TenantScoped, Base):
    __tablename__ = "catalog_columns"
    __table_args__ = (
        _parent(["datasource", "model"], "catalog_models", ["datasource", "name"]),
        Index("ix_catalog_columns_seq", "tenant_id", "change_seq"),
    )

    datasource: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    data_type: Mapped[str] = mapped_column(String(NAME_LENGTH), default="")
    type_family: Mapped[str] = mapped_column(String(20), default=OTHER)
    nullable: Mapped[bool] = mapped_column(Boolean, default=True)
    is_primary_key: Mapped[bool] = mapped_column(Boolean, default=False)
    position: Mapped[int] = mapped_column(Integer, default=0)
    label: Mapped[str | None] = mapped_column(Text, nullable=True)
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    hidden: Mapped[bool] = mapped_column(Boolean, default=False)
    origin: Mapped[str] = mapped_column(String(20), default="reflected")
    # A SQL expression for a computed column added by hand; such columns are not profiled.
    sql: Mapped[str | None] = mapped_column(Text, nullable=True)
    sampled: Mapped[str | None] = mapped_column(Text, nullable=True)
    sampled_values: Mapped[list[Any] | None] = mapped_column(JSONB, nullable=True)
    distinct_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    sampled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    change_seq: Mapped[int] = mapped_column(BigInteger, default=0)


class CatalogMeasure(TenantScoped, Base):
    __tablename__ = "catalog_measures"
    __table_args__ = (
        _parent(["datasource", "model"], "catalog_models", ["datasource", "name"]),
        Index("ix_catalog_measures_seq", "tenant_id", "change_seq"),
    )

    datasource: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    formula: Mapped[str] = mapped_column(Text)
    label: Mapped[str | None] = mapped_column(Text, nullable=True)
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    change_seq: Mapped[int] = mapped_column(BigInteger, default=0)


class CatalogAggregation(TenantScoped, Base):
    __tablename__ = "catalog_aggregations"
    __table_args__ = (
        _parent(["datasource", "model"], "catalog_models", ["datasource", "name"]),
        Index("ix_catalog_aggregations_seq", "tenant_id", "change_seq"),
    )

    datasource: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    formula: Mapped[str] = mapped_column(Text)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    change_seq: Mapped[int] = mapped_column(BigInteger, default=0)


class CatalogForeignKey(TenantScoped, Base):
    """``column`` of a model references ``target_column`` of ``target_model``: the resolver's join paths."""

    __tablename__ = "catalog_foreign_keys"
    __table_args__ = (_parent(["datasource", "model"], "catalog_models", ["datasource", "name"]),)

    datasource: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    column: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    target_datasource: Mapped[str] = mapped_column(String(64), primary_key=True)
    target_model: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    target_column: Mapped[str] = mapped_column(String(NAME_LENGTH), default="")


class CatalogState(TenantScoped, Base):
    """One row per tenant: the catalog version (the change_seq of the last catalog write)."""

    __tablename__ = "catalog_state"

    version: Mapped[int] = mapped_column(BigInteger, default=0)
