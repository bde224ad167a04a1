"""memory_versions (every revision kept), who forgot a memory and when, what an attached query resolved
to when saved, every job attempt's error

A PATCH or an upsert used to overwrite a memory in place; each revision is now a row of
``memory_versions`` keyed by the tenant's change_seq of the write. Existing memories get their current
state as their first version. ``forgotten_by`` / ``forgotten_at`` complete the stored forget reason, and
``jobs.attempt_errors`` keeps the error of each failed attempt (``error`` holds only the last).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memory_versions",
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.Column("memory_id", sa.String(length=200), nullable=False),
        sa.Column("change_seq", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("category", sa.String(length=20), nullable=False),
        sa.Column("tags", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("importance", sa.Float(), nullable=False),
        sa.Column("entities", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("changed_by", sa.String(length=320), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "memory_id"], ["memories.tenant_id", "memories.id"], ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "memory_id", "change_seq"),
    )
    op.execute(
        """
        INSERT INTO memory_versions (
            tenant_id, memory_id, change_seq, content, kind, category, tags, importance, entities,
            changed_by, changed_at
        )
        SELECT tenant_id, id, change_seq, content, kind, category, coalesce(tags, '{}'), importance,
               coalesce(entities, '{}'), created_by, updated_at
        FROM memories
        """
    )
    op.add_column("memories", sa.Column("query_entities", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column("memories", sa.Column("forgotten_by", sa.String(length=320), nullable=True))
    op.add_column("memories", sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "jobs",
        sa.Column("attempt_errors", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("jobs", "attempt_errors")
    op.drop_column("memories", "forgotten_at")
    op.drop_column("memories", "forgotten_by")
    op.drop_column("memories", "query_entities")
    op.drop_table("memory_versions")
