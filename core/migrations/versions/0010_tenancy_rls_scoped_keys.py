"""Scoped API keys and row-level security on every tenant table

A key may be bound to an agent and/or persona and may be read-only (columns on api_keys). Every table
holding tenant data gets a forced policy on the transaction-local settings engram.tenant_id /
engram.system, so PostgreSQL itself refuses another tenant's rows (core.tenancy.rls; `engram migrate`
applies the same to tables added later, and creates the app role the service connects as).

Revision ID: 0010
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

from core.tenancy.rls import POLICY, SYSTEM_POLICY, apply_row_security, tenant_tables

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("agent_id", sa.String(200), nullable=True))
    op.add_column("api_keys", sa.Column("persona", sa.String(200), nullable=True))
    op.add_column("api_keys", sa.Column("read_only", sa.Boolean(), nullable=False, server_default="false"))
    apply_row_security(op.get_bind())


def downgrade() -> None:
    connection = op.get_bind()
    for table in [*tenant_tables(connection), "tenants"]:
        op.execute(f'DROP POLICY IF EXISTS {POLICY} ON "{table}"')
        op.execute(f'DROP POLICY IF EXISTS {SYSTEM_POLICY} ON "{table}"')  # created by apply_row_security since 0014
        op.execute(f'ALTER TABLE "{table}" NO FORCE ROW LEVEL SECURITY')
        op.execute(f'ALTER TABLE "{table}" DISABLE ROW LEVEL SECURITY')
    op.execute("DROP FUNCTION IF EXISTS engram_current_tenant()")
    op.execute("DROP FUNCTION IF EXISTS engram_system_mode()")
    op.drop_column("api_keys", "read_only")
    op.drop_column("api_keys", "persona")
    op.drop_column("api_keys", "agent_id")
