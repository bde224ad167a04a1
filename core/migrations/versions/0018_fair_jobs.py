"""fair job scheduling: indexes for the relay's round-robin claim and its in-flight count

The relay (core.jobs.relay) ranks each tenant's undispatched jobs by age and counts the jobs in flight
per lane on every round: both read only a small partial index, however many finished jobs the table keeps.

Revision ID: 0018
Revises: 0015
"""

from alembic import op

revision = "0018"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_jobs_undispatched ON jobs (tenant_id, created_at, id) "
        "WHERE state = 'queued' AND dispatched_at IS NULL"
    )
    op.execute(
        "CREATE INDEX ix_jobs_in_flight ON jobs (tenant_id, kind) "
        "WHERE state = 'running' OR (state = 'queued' AND dispatched_at IS NOT NULL)"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_jobs_in_flight")
    op.execute("DROP INDEX IF EXISTS ix_jobs_undispatched")
