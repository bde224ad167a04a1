"""Operating tenants: state, quotas, a kept count of memories, daily usage and measured storage

- ``tenants.state``: ``active``, ``suspended`` (keys refused with 403, data and jobs kept) or ``deleting``
  (offboarded: keys revoked, a purge job removes every row). ``tenants.quotas``: the limits that differ
  from unlimited (``max_memories``, ``max_datasources``, ``requests_per_minute``,
  ``embedding_texts_per_day``).
- ``tenants.memory_count``: the tenant's memories that are not forgotten, kept by triggers on ``memories``
  so a save checks ``max_memories`` and the usage view reads the figure without counting rows. Inserts and
  deletes are counted per statement from transition tables; an update counts only when a row enters or
  leaves ``forgotten`` (a row trigger with a WHEN condition, so the far more common updates of access
  counters and revisions never run it).
- ``tenants.storage_bytes`` with ``storage_seq``: what the tenant's rows, vectors and index took when last
  measured, and at which change_seq (a periodic job measures only tenants whose change_seq moved).
- ``tenant_usage``: per tenant and UTC day, the counters an operator bills by. API processes buffer their
  counts and flush them with an id recorded in ``usage_flushes`` in the same transaction, so a flush that
  is retried after an unclear commit is not counted twice.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_COUNT_FUNCTIONS = """
CREATE FUNCTION engram_memory_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tenants t SET memory_count = t.memory_count + n.added
    FROM (SELECT tenant_id, count(*) AS added FROM new_rows WHERE status <> 'forgotten' GROUP BY tenant_id) n
    WHERE t.id = n.tenant_id;
    RETURN NULL;
END $$;

CREATE FUNCTION engram_memory_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tenants t SET memory_count = greatest(0, t.memory_count - n.removed)
    FROM (SELECT tenant_id, count(*) AS removed FROM old_rows WHERE status <> 'forgotten' GROUP BY tenant_id) n
    WHERE t.id = n.tenant_id;
    RETURN NULL;
END $$;

CREATE FUNCTION engram_memory_count_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tenants SET memory_count = greatest(0, memory_count + CASE WHEN NEW.status = 'forgotten' THEN -1 ELSE 1 END)
    WHERE id = NEW.tenant_id;
    RETURN NULL;
END $$;
"""

_COUNT_TRIGGERS = """
CREATE TRIGGER memories_count_inserted AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION engram_memory_count_inserted();
CREATE TRIGGER memories_count_deleted AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION engram_memory_count_deleted();
CREATE TRIGGER memories_count_status AFTER UPDATE OF status ON memories FOR EACH ROW
    WHEN ((OLD.status = 'forgotten') IS DISTINCT FROM (NEW.status = 'forgotten'))
    EXECUTE FUNCTION engram_memory_count_status();
"""


def upgrade() -> None:
    op.add_column("tenants", sa.Column("state", sa.String(20), nullable=False, server_default="active"))
    op.create_check_constraint("ck_tenants_state", "tenants", "state IN ('active', 'suspended', 'deleting')")
    op.add_column("tenants", sa.Column("quotas", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")))
    op.add_column("tenants", sa.Column("memory_count", sa.BigInteger(), nullable=False, server_default="0"))
    op.add_column("tenants", sa.Column("storage_bytes", sa.BigInteger(), nullable=False, server_default="0"))
    op.add_column("tenants", sa.Column("storage_seq", sa.BigInteger(), nullable=False, server_default="-1"))
    op.add_column("tenants", sa.Column("storage_measured_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(_COUNT_FUNCTIONS)
    op.execute(_COUNT_TRIGGERS)
    op.execute(
        "UPDATE tenants t SET memory_count = coalesce((SELECT count(*) FROM memories m "
        "WHERE m.tenant_id = t.id AND m.status <> 'forgotten'), 0)"
    )
    op.create_table(
        "tenant_usage",
        sa.Column("tenant_id", sa.BigInteger(), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("searches", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("saves", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("embedded_texts", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("embedding_tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("tenant_id", "day"),
    )
    op.create_table(
        "usage_flushes",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_usage_flushes_at", "usage_flushes", ["at"])


def downgrade() -> None:
    op.drop_table("usage_flushes")
    op.drop_table("tenant_usage")
    for trigger in ("memories_count_inserted", "memories_count_deleted", "memories_count_status"):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON memories")
    for function in ("engram_memory_count_inserted", "engram_memory_count_deleted", "engram_memory_count_status"):
        op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    for column in ("storage_measured_at", "storage_seq", "storage_bytes", "memory_count", "quotas", "state"):
        op.drop_column("tenants", column)
