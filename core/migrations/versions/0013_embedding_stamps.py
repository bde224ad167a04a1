"""embeddings.stamp: the embeddings version a row was written at, so a matrix refreshes exactly what is new

The in-process vector matrix of a tenant (core.embeddings.matrix) is keyed by the ``version`` of its
``search_embedding_stats`` row, which every statement writing the tenant's embeddings moves by one (the
statement-level triggers of migration 0003). Refreshing a cached matrix used to read every vector
written in the five minutes before its newest ``updated_at`` (a transaction may commit after a later
one stamped later), which under a steady write load meant re-reading and re-parsing thousands of
vectors on every search.

Now a row-level trigger stamps each written row with the version its statement is about to produce:
``version + 1`` of the stats row, read ``FOR UPDATE``. That lock is the one the statement trigger takes
anyway to move the version, taken earlier, so two writers of one tenant and model are ordered by it and
a stamp is committed exactly when the version it names is. A reader that sees version V therefore sees
every row stamped at or below V, and a matrix at version V needs exactly the rows stamped above V.

A first write of a tenant and model finds no stats row yet and stamps 1, as may a concurrent first
writer; readers also compare the vector count, which such a pair of inserts changes, and reload then.
Rows written before this migration keep a NULL stamp: they are older than any version a running
process can have cached after the upgrade (a matrix is loaded whole the first time).

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE embeddings ADD COLUMN stamp bigint")
    op.execute(
        """
        CREATE FUNCTION embeddings_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            SELECT s.version + 1 INTO NEW.stamp FROM search_embedding_stats AS s
            WHERE s.tenant_id = NEW.tenant_id AND s.model = NEW.model FOR UPDATE;
            IF NEW.stamp IS NULL THEN
                NEW.stamp := 1;
            END IF;
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER embeddings_stamp BEFORE INSERT OR UPDATE ON embeddings "
        "FOR EACH ROW EXECUTE FUNCTION embeddings_stamp()"
    )
    op.execute("CREATE INDEX ix_embeddings_tenant_model_stamp ON embeddings (tenant_id, model, stamp)")


def downgrade() -> None:
    op.execute("DROP INDEX ix_embeddings_tenant_model_stamp")
    op.execute("DROP TRIGGER embeddings_stamp ON embeddings")
    op.execute("DROP FUNCTION embeddings_stamp()")
    op.execute("ALTER TABLE embeddings DROP COLUMN stamp")
