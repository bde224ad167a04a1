"""notify the outbox relay when job rows are committed

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE FUNCTION engram_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_notify('engram_jobs', ''); RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER engram_jobs_notify AFTER INSERT ON jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION engram_jobs_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS engram_jobs_notify ON jobs")
    op.execute("DROP FUNCTION IF EXISTS engram_jobs_notify()")
