"""tenants.memory_seq holds any integer-shaped id: numeric, not bigint

A supplied id may be up to 200 digits, and the next generated id must be one more than the largest
integer-shaped id ever used (CONTRACT section 4). As a bigint the sequence ignored ids of 19+ digits,
so generated ids could later land on them and overwrite those memories.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.alter_column("tenants", "memory_seq", type_=sa.Numeric(210, 0), existing_server_default="0")
    # Ids of 19+ digits saved before this revision were not counted: count them now.
    op.execute(
        """
        UPDATE tenants AS t SET memory_seq = m.top
        FROM (
            SELECT tenant_id, max(id::numeric) AS top FROM memories
            WHERE id ~ '^(0|[1-9][0-9]*)$' GROUP BY tenant_id
        ) AS m
        WHERE m.tenant_id = t.id AND m.top > t.memory_seq
        """
    )


def downgrade() -> None:
    op.alter_column(
        "tenants",
        "memory_seq",
        type_=sa.BigInteger(),
        existing_server_default="0",
        postgresql_using="least(memory_seq, 9223372036854775807)::bigint",
    )
