"""The schema fits a distributed PostgreSQL sharded by tenant (Citus): every primary key, unique index and
foreign key among tenant tables leads with tenant_id. Read from the live catalog, so a table or index a
later migration adds is checked too."""

from __future__ import annotations

from sqlalchemy import text

from core.db import get_owner_engine

# The outbox: system work (reconcile, prune) carries no tenant, so it cannot be keyed by one. It stays a
# coordinator-local table under Citus (deploy/SCALING.md).
NOT_DISTRIBUTED = {"jobs"}

_KEYS = """
WITH tenant_tables AS (
    SELECT c.oid, c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id'
    WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
)
SELECT t.relname, 'unique index ' || i.indexrelid::regclass::text,
       (SELECT attname FROM pg_attribute WHERE attrelid = t.oid AND attnum = i.indkey[0])
FROM tenant_tables t JOIN pg_index i ON i.indrelid = t.oid
WHERE i.indisunique
UNION ALL
SELECT t.relname, 'foreign key ' || con.conname,
       (SELECT attname FROM pg_attribute WHERE attrelid = t.oid AND attnum = con.conkey[1])
FROM tenant_tables t JOIN pg_constraint con ON con.conrelid = t.oid AND con.contype = 'f'
UNION ALL
SELECT t.relname, 'referenced key of ' || con.conname,
       (SELECT attname FROM pg_attribute WHERE attrelid = con.confrelid AND attnum = con.confkey[1])
FROM tenant_tables t JOIN pg_constraint con ON con.conrelid = t.oid AND con.contype = 'f'
WHERE con.confrelid IN (SELECT oid FROM tenant_tables)
"""


def test_every_key_among_tenant_tables_leads_with_tenant_id(stack):
    with get_owner_engine().connect() as connection:
        rows = connection.execute(text(_KEYS)).all()
        primary_keys = dict(
            connection.execute(
                text(
                    "SELECT c.relname, (SELECT attname FROM pg_attribute WHERE attrelid = c.oid "
                    "AND attnum = con.conkey[1]) FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid "
                    "WHERE con.contype = 'p' AND c.relnamespace = 'public'::regnamespace"
                )
            ).all()
        )
    tables = {table for table, _, _ in rows}
    assert {"memories", "embeddings", "api_keys", "users", "catalog_columns"} <= tables
    offending = [(t, what, first) for t, what, first in rows if first != "tenant_id" and t not in NOT_DISTRIBUTED]
    assert offending == []
    assert {t: primary_keys[t] for t in tables - NOT_DISTRIBUTED if primary_keys[t] != "tenant_id"} == {}
