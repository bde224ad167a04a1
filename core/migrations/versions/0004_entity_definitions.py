"""entity definitions seen by the staleness watcher

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "entity_definitions",
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.Column("canonical_id", sa.String(length=400), nullable=False),
        sa.Column("definition", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "canonical_id"),
    )


def downgrade() -> None:
    op.drop_table("entity_definitions")
