"""Indexes in episode order, so a search finds the memory that replies to a hit in one index descent

A search lifts the memory that replies to a question among its top hits (core.search.replies): the next
memory of the hit's episode by event time, then save order, then id. An episode is a run, or, for memories
without one, the memories given one same explicit event time (core.search.index.episode_of). The run index
(tenant_id, run_id) left every memory of a run to sort per hit, and nothing indexed the other kind of
episode, so a tenant of dated imports read all its run-less memories per hit. Both now have an index that
leads with the episode and follows its order; the one for dated memories without a run is partial, so
notes saved at their save time (most of a tenant) cost it nothing on write.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_memories_tenant_run_order", "memories", ["tenant_id", "run_id", "occurred_at", "created_at"])
    # The wider index serves every lookup the plain one did (it has the same leading columns).
    op.drop_index("ix_memories_tenant_run", "memories")
    op.create_index(
        "ix_memories_tenant_instant",
        "memories",
        ["tenant_id", "occurred_at", "created_at"],
        postgresql_where="run_id IS NULL AND occurred_at <> created_at",
    )


def downgrade() -> None:
    op.drop_index("ix_memories_tenant_instant", "memories")
    op.create_index("ix_memories_tenant_run", "memories", ["tenant_id", "run_id"])
    op.drop_index("ix_memories_tenant_run_order", "memories")
