"""initial schema: tenants, keys, memories, jobs, embeddings

Revision ID: 0001
Revises:
"""

import pgvector.sqlalchemy
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("memory_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("change_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.Column("user_email", sa.String(length=320), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash"),
    )
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"], unique=False)
    op.create_table(
        "associations",
        sa.Column("source_id", sa.String(length=200), nullable=False),
        sa.Column("target_id", sa.String(length=200), nullable=False),
        sa.Column("relation_type", sa.String(length=20), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "source_id", "target_id", "relation_type"),
    )
    op.create_index("ix_associations_target", "associations", ["tenant_id", "target_id"], unique=False)
    op.create_table(
        "embeddings",
        sa.Column("canonical_id", sa.String(length=400), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("doc_kind", sa.String(length=20), nullable=False),
        sa.Column("dims", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("embedding", pgvector.sqlalchemy.vector.VECTOR(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "canonical_id", "model"),
    )
    op.create_index(
        "ix_embeddings_tenant_model_kind", "embeddings", ["tenant_id", "model", "doc_kind"], unique=False
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.String(length=30), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_jobs_state_created", "jobs", ["state", "created_at"], unique=False)
    op.create_index("ix_jobs_tenant_kind_state", "jobs", ["tenant_id", "kind", "state"], unique=False)
    op.create_table(
        "memories",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("category", sa.String(length=20), nullable=False),
        sa.Column("importance", sa.Float(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tags", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("persona", sa.String(length=200), nullable=True),
        sa.Column("agent_id", sa.String(length=200), nullable=True),
        sa.Column("entities", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("query", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("stale_reason", sa.Text(), nullable=True),
        sa.Column("forget_reason", sa.Text(), nullable=True),
        sa.Column("superseded_by", sa.String(length=200), nullable=True),
        sa.Column("created_by", sa.String(length=320), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("access_count", sa.Integer(), nullable=False),
        sa.Column("last_accessed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "id"),
    )
    op.create_index("ix_memories_entities", "memories", ["entities"], unique=False, postgresql_using="gin")
    op.create_index("ix_memories_tenant_created", "memories", ["tenant_id", "created_at"], unique=False)
    op.create_index("ix_memories_tenant_run", "memories", ["tenant_id", "run_id"], unique=False)
    op.create_index("ix_memories_tenant_seq", "memories", ["tenant_id", "change_seq"], unique=False)
    op.create_table(
        "tombstones",
        sa.Column("doc_id", sa.String(length=400), nullable=False),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "doc_id"),
    )
    op.create_index("ix_tombstones_tenant_seq", "tombstones", ["tenant_id", "change_seq"], unique=False)
    op.create_table(
        "users",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant_id", "email"),
    )


def downgrade() -> None:
    op.drop_table("users")
    op.drop_index("ix_tombstones_tenant_seq", table_name="tombstones")
    op.drop_table("tombstones")
    op.drop_index("ix_memories_tenant_seq", table_name="memories")
    op.drop_index("ix_memories_tenant_run", table_name="memories")
    op.drop_index("ix_memories_tenant_created", table_name="memories")
    op.drop_index("ix_memories_entities", table_name="memories", postgresql_using="gin")
    op.drop_table("memories")
    op.drop_index("ix_jobs_tenant_kind_state", table_name="jobs")
    op.drop_index("ix_jobs_state_created", table_name="jobs")
    op.drop_table("jobs")
    op.drop_index("ix_embeddings_tenant_model_kind", table_name="embeddings")
    op.drop_table("embeddings")
    op.drop_index("ix_associations_target", table_name="associations")
    op.drop_table("associations")
    op.drop_index(op.f("ix_api_keys_tenant_id"), table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("tenants")
