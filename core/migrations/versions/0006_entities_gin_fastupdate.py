"""entity lookups never scan a GIN pending list

Revision ID: 0006
Revises: 0005

With fastupdate on, new entity tags wait in the GIN index's pending list until vacuum merges it, and
every entity lookup scans that list meanwhile (milliseconds per query right after a bulk load). Writes
pay a little more instead, which the save path can afford.
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER INDEX ix_memories_entities SET (fastupdate = off)")


def downgrade() -> None:
    op.execute("ALTER INDEX ix_memories_entities RESET (fastupdate)")
