"""remember the change_seq at which reconcile last found a tenant's embeddings complete

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("embeddings_checked_seq", sa.BigInteger(), server_default="0", nullable=False))
    op.add_column("tenants", sa.Column("embeddings_checked_model", sa.String(length=200), nullable=True))


def downgrade() -> None:
    op.drop_column("tenants", "embeddings_checked_model")
    op.drop_column("tenants", "embeddings_checked_seq")
