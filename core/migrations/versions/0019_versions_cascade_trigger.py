"""memory_versions: no per-row foreign key to memories; a statement trigger removes a deleted memory's versions

Every save writes a revision per memory, and the foreign key from ``memory_versions (tenant_id, memory_id)``
to ``memories`` checked each one with a statement of its own, planned afresh (the connections plan every
statement for its own parameters, core.db): a third of a 1,000-item batch's time in PostgreSQL (backend CPU
of the save statement 50 -> 34 ms without it). A revision is only ever written from a memory row in the same
transaction, under the tenant's row lock (the save's own statement, core.memories.history.record_versions, an
import's restore_history), so the check never refused anything; what the key also did, removing a memory's
versions with it, a trigger on ``memories`` now does for every way a memory is deleted (a purge, the
lifecycle's removals, the offboarding purge), one lookup by primary key per deleted memory as the cascade did.
The foreign key to ``tenants`` stays (as on every tenant table but the append-only ones, 0017).

Revision ID: 0019
Revises: 0018
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# One DELETE per removed memory, by the versions' primary key (its only index): the same work the cascade did,
# and a plan that cannot go wrong whatever the table's statistics when the function was first planned.
_CASCADE = """
CREATE FUNCTION engram_memory_versions_cascade() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    gone record;
BEGIN
    FOR gone IN SELECT tenant_id, id FROM old_rows LOOP
        DELETE FROM memory_versions WHERE tenant_id = gone.tenant_id AND memory_id = gone.id;
    END LOOP;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_versions_cascade AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION engram_memory_versions_cascade();
"""


def upgrade() -> None:
    op.execute("ALTER TABLE memory_versions DROP CONSTRAINT IF EXISTS memory_versions_tenant_id_memory_id_fkey")
    op.execute(_CASCADE)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS memories_versions_cascade ON memories")
    op.execute("DROP FUNCTION IF EXISTS engram_memory_versions_cascade()")
    # Versions whose memory is gone would fail the key: none are left by the trigger, but be sure (as the
    # system: row security applies to the owner too).
    op.execute("SELECT set_config('engram.system', 'on', true)")
    op.execute(
        "DELETE FROM memory_versions v WHERE NOT EXISTS "
        "(SELECT 1 FROM memories m WHERE m.tenant_id = v.tenant_id AND m.id = v.memory_id)"
    )
    op.execute(
        "ALTER TABLE memory_versions ADD CONSTRAINT memory_versions_tenant_id_memory_id_fkey "
        "FOREIGN KEY (tenant_id, memory_id) REFERENCES memories (tenant_id, id) ON DELETE CASCADE"
    )
