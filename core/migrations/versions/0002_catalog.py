"""catalog: datasources, models, columns, measures, aggregations

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_NOW = sa.text("now()")


def _tenant() -> list[sa.SchemaItem]:
    return [
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
    ]


def _model_parent() -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["tenant_id", "datasource", "model"],
        ["catalog_models.tenant_id", "catalog_models.datasource", "catalog_models.name"],
        ondelete="CASCADE",
    )


def _leaf_keys() -> list[sa.Column]:
    return [
        sa.Column("datasource", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "catalog_datasources",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("dialect", sa.String(length=50), nullable=False),
        sa.Column("url_encrypted", sa.Text(), nullable=False),
        sa.Column("url_redacted", sa.Text(), nullable=False),
        sa.Column("schema_name", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.Column("last_ingested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        *_tenant(),
        sa.PrimaryKeyConstraint("tenant_id", "name"),
    )
    op.create_index("ix_catalog_datasources_seq", "catalog_datasources", ["tenant_id", "change_seq"])
    op.create_table(
        "catalog_models",
        sa.Column("datasource", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("table_name", sa.String(length=200), nullable=True),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("hidden", sa.Boolean(), nullable=False),
        sa.Column("origin", sa.String(length=20), nullable=False),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        *_tenant(),
        sa.ForeignKeyConstraint(
            ["tenant_id", "datasource"],
            ["catalog_datasources.tenant_id", "catalog_datasources.name"],
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "datasource", "name"),
    )
    op.create_index("ix_catalog_models_seq", "catalog_models", ["tenant_id", "change_seq"])
    op.create_table(
        "catalog_columns",
        *_leaf_keys(),
        sa.Column("data_type", sa.String(length=200), nullable=False),
        sa.Column("type_family", sa.String(length=20), nullable=False),
        sa.Column("nullable", sa.Boolean(), nullable=False),
        sa.Column("is_primary_key", sa.Boolean(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("hidden", sa.Boolean(), nullable=False),
        sa.Column("origin", sa.String(length=20), nullable=False),
        sa.Column("sql", sa.Text(), nullable=True),
        sa.Column("sampled", sa.Text(), nullable=True),
        sa.Column("sampled_values", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("distinct_count", sa.BigInteger(), nullable=True),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        *_tenant(),
        _model_parent(),
        sa.PrimaryKeyConstraint("tenant_id", "datasource", "model", "name"),
    )
    op.create_index("ix_catalog_columns_seq", "catalog_columns", ["tenant_id", "change_seq"])
    op.create_table(
        "catalog_measures",
        *_leaf_keys(),
        sa.Column("formula", sa.Text(), nullable=False),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        *_tenant(),
        _model_parent(),
        sa.PrimaryKeyConstraint("tenant_id", "datasource", "model", "name"),
    )
    op.create_index("ix_catalog_measures_seq", "catalog_measures", ["tenant_id", "change_seq"])
    op.create_table(
        "catalog_aggregations",
        *_leaf_keys(),
        sa.Column("formula", sa.Text(), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        *_tenant(),
        _model_parent(),
        sa.PrimaryKeyConstraint("tenant_id", "datasource", "model", "name"),
    )
    op.create_index("ix_catalog_aggregations_seq", "catalog_aggregations", ["tenant_id", "change_seq"])
    op.create_table(
        "catalog_foreign_keys",
        sa.Column("datasource", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("column", sa.String(length=200), nullable=False),
        sa.Column("target_datasource", sa.String(length=64), nullable=False),
        sa.Column("target_model", sa.String(length=200), nullable=False),
        sa.Column("target_column", sa.String(length=200), nullable=False),
        *_tenant(),
        _model_parent(),
        sa.PrimaryKeyConstraint(
            "tenant_id", "datasource", "model", "column", "target_datasource", "target_model"
        ),
    )
    op.create_table(
        "catalog_state",
        sa.Column("version", sa.BigInteger(), nullable=False),
        *_tenant(),
        sa.PrimaryKeyConstraint("tenant_id"),
    )


def downgrade() -> None:
    op.drop_table("catalog_state")
    op.drop_table("catalog_foreign_keys")
    for table in ("catalog_aggregations", "catalog_measures", "catalog_columns", "catalog_models"):
        op.drop_index(f"ix_{table}_seq", table_name=table)
        op.drop_table(table)
    op.drop_index("ix_catalog_datasources_seq", table_name="catalog_datasources")
    op.drop_table("catalog_datasources")
