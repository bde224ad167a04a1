"""Every primary key, unique constraint and foreign key among tenant tables leads with tenant_id

The shape a distributed PostgreSQL (Citus, tenant_id as distribution column) requires: a key that does
not lead with the distribution column cannot be enforced across shards. users and api_keys were the two
tables keyed by a global id. api_keys keeps a plain index on key_hash for authentication (a lookup by
hash is the named system path that spans tenants). jobs is the exception, by design: it is the outbox,
rows of system work carry no tenant, and it stays a coordinator-local table (deploy/SCALING.md).

Revision ID: 0012
Revises: 0010
"""

from alembic import op

revision = "0012"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("users_pkey", "users", type_="primary")
    op.create_primary_key("users_pkey", "users", ["tenant_id", "id"])
    op.drop_constraint("api_keys_pkey", "api_keys", type_="primary")
    op.create_primary_key("api_keys_pkey", "api_keys", ["tenant_id", "id"])
    op.drop_constraint("api_keys_key_hash_key", "api_keys", type_="unique")
    op.create_unique_constraint("api_keys_tenant_id_key_hash_key", "api_keys", ["tenant_id", "key_hash"])
    op.create_index("ix_api_keys_key_hash", "api_keys", ["key_hash"])
    # Leads with tenant_id already: the separate index on it alone is now redundant.
    op.execute("DROP INDEX IF EXISTS ix_api_keys_tenant_id")


def downgrade() -> None:
    op.create_index("ix_api_keys_tenant_id", "api_keys", ["tenant_id"])
    op.drop_index("ix_api_keys_key_hash", "api_keys")
    op.drop_constraint("api_keys_tenant_id_key_hash_key", "api_keys", type_="unique")
    op.create_unique_constraint("api_keys_key_hash_key", "api_keys", ["key_hash"])
    op.drop_constraint("api_keys_pkey", "api_keys", type_="primary")
    op.create_primary_key("api_keys_pkey", "api_keys", ["id"])
    op.drop_constraint("users_pkey", "users", type_="primary")
    op.create_primary_key("users_pkey", "users", ["id"])
