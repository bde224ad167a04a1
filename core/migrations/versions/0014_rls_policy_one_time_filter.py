"""Row-level security in the form the planner checks once per statement

The tenant policy was `tenant_id = (SELECT engram_current_tenant()) OR (SELECT engram_system_mode())`: two
InitPlans to plan on every statement for every tenant table it names, and a per-row filter. It is now the
equality alone, `tenant_id = NULLIF(current_setting('engram.tenant_id', true), '')::bigint` (written out: a
SQL function would be inlined, its text parsed, again at every plan), which PostgreSQL merges with the
statement's own `tenant_id = :tenant` into one check per statement (a one-time filter). System mode moves to a
policy of its own, `engram_system_mode`, that applies only to the role `engram_system` (which the app role
switches to for a system transaction, without inheriting it) and to the owner (core.tenancy.rls). 0010's
functions engram_current_tenant() / engram_system_mode() are used by no policy any more (a database created
since does not have them; the downgrade creates them). The guarantee is unchanged: forced on every tenant
table, the app role without BYPASSRLS, settings per transaction.

Downgrade restores the single policy of 0010; the role `engram_system` is left in place (roles belong to
the cluster, not to this database; it cannot log in and owns nothing).

Revision ID: 0014
Revises: 0013
"""

from alembic import op

from core.tenancy.rls import POLICY, SYSTEM_POLICY, apply_row_security, tenant_tables

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_row_security(op.get_bind(), replace=True)


_FUNCTIONS = """
CREATE OR REPLACE FUNCTION engram_current_tenant() RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT NULLIF(current_setting('engram.tenant_id', true), '')::bigint $$;
CREATE OR REPLACE FUNCTION engram_system_mode() RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT coalesce(current_setting('engram.system', true), '') = 'on' $$;
"""


def downgrade() -> None:
    connection = op.get_bind()
    op.execute(_FUNCTIONS)
    for table, column in [(t, "tenant_id") for t in tenant_tables(connection)] + [("tenants", "id")]:
        condition = f"{column} = (SELECT engram_current_tenant()) OR (SELECT engram_system_mode())"
        op.execute(f'DROP POLICY IF EXISTS {SYSTEM_POLICY} ON "{table}"')
        op.execute(f'DROP POLICY IF EXISTS {POLICY} ON "{table}"')
        op.execute(f'CREATE POLICY {POLICY} ON "{table}" USING ({condition}) WITH CHECK ({condition})')
