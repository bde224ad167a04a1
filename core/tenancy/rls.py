"""Row-level security: the PostgreSQL half of tenant isolation, and the app role it applies to.

Every table with a ``tenant_id`` column (and ``tenants`` itself, by ``id``) gets one forced policy: a row
is visible and writable when its tenant is the transaction's ``engram.tenant_id``, or when the
transaction runs in the named system mode (``engram.system = 'on'``). Both settings are transaction-local
and set by core.db at the start of each transaction. The policy reads them through scalar subqueries, so
PostgreSQL evaluates them once per statement (an InitPlan), not once per row.

Tables are found in the live catalog, so a table a later migration adds is covered by the next
`engram migrate` without anyone remembering to list it. Applying is idempotent and takes no lock on a
table that already has its policy.
"""

from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url

log = logging.getLogger("engram.tenancy")

POLICY = "engram_tenant_isolation"

_FUNCTIONS = """
CREATE OR REPLACE FUNCTION engram_current_tenant() RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT NULLIF(current_setting('engram.tenant_id', true), '')::bigint $$;
CREATE OR REPLACE FUNCTION engram_system_mode() RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT coalesce(current_setting('engram.system', true), '') = 'on' $$;
"""


def tenant_tables(connection: Connection) -> list[str]:
    """Every ordinary or partitioned table of the current schema with a ``tenant_id`` column."""
    return list(
        connection.execute(
            text(
                "SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
                "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') "
                "AND a.attname = 'tenant_id' AND NOT a.attisdropped ORDER BY c.relname"
            )
        ).scalars()
    )


def _policy_sql(table: str, column: str) -> str:
    condition = f"{column} = (SELECT engram_current_tenant()) OR (SELECT engram_system_mode())"
    return f'CREATE POLICY {POLICY} ON "{table}" USING ({condition}) WITH CHECK ({condition})'


def apply_row_security(connection: Connection) -> list[str]:
    """Enable, force and police every tenant table that lacks it; returns the tables changed."""
    policed = set(
        connection.execute(
            text(
                "SELECT p.tablename FROM pg_policies p JOIN pg_class c ON c.relname = p.tablename "
                "AND c.relnamespace = current_schema()::regnamespace "
                "WHERE p.schemaname = current_schema() AND p.policyname = :p "
                "AND c.relrowsecurity AND c.relforcerowsecurity"
            ),
            {"p": POLICY},
        ).scalars()
    )
    targets = [(table, "tenant_id") for table in tenant_tables(connection)] + [("tenants", "id")]
    changed: list[str] = []
    if all(table in policed for table, _ in targets):
        return changed  # nothing to do, and nothing an app role running `migrate` may not do
    connection.execute(text(_FUNCTIONS))
    for table, column in targets:
        if table in policed:
            continue
        connection.execute(text(f'ALTER TABLE "{table}" ENABLE ROW LEVEL SECURITY'))
        connection.execute(text(f'ALTER TABLE "{table}" FORCE ROW LEVEL SECURITY'))
        connection.execute(text(f'DROP POLICY IF EXISTS {POLICY} ON "{table}"'))
        connection.execute(text(_policy_sql(table, column)))
        changed.append(table)
    return changed


# PostgreSQL uses a condition as an index condition under row-level security only when its operator is
# LEAKPROOF; the array operators are not declared so, which turns the GIN-indexed entity lookups
# (`entities && ...`, `entities @> ...`) into scans of the tenant's rows (measured: 0.4 ms -> 16 ms at 20k
# memories). They only compare elements and report nothing about the rows they see, and the app role
# cannot create functions of its own, so declaring them leakproof opens nothing. Only a superuser may.
_ARRAY_OPERATORS = ("arrayoverlap(anyarray, anyarray)", "arraycontains(anyarray, anyarray)")


def declare_array_operators_leakproof(connection: Connection) -> bool:
    """Let the GIN array operators serve as index conditions under row-level security (superuser only);
    False when they stay as they are (a managed PostgreSQL: entity lookups then scan the tenant's rows)."""
    missing = connection.execute(
        text("SELECT count(*) FROM pg_proc WHERE proname IN ('arrayoverlap', 'arraycontains') AND NOT proleakproof")
    ).scalar()
    if not missing:
        return True
    if not connection.execute(text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).scalar():
        log.warning("not a superuser: array operators stay non-leakproof, entity lookups scan under RLS")
        return False
    for signature in _ARRAY_OPERATORS:
        connection.execute(text(f"ALTER FUNCTION {signature} LEAKPROOF"))
    return True


def _quote_ident(connection: Connection, name: str) -> str:
    return str(connection.execute(text("SELECT quote_ident(:n)"), {"n": name}).scalar())


def ensure_app_role(connection: Connection, *, app_url: str) -> bool:
    """Create (or align) the login role of `app_url` and grant it data access, nothing more: no ownership,
    no BYPASSRLS, no DDL. Returns False when the connected role may not manage roles (the operator then
    creates it, see deploy/README.md); grants are applied either way."""
    url = make_url(app_url)
    role_name = url.username
    owner = connection.execute(text("SELECT current_user")).scalar()
    if not role_name or role_name == owner:
        privileged = connection.execute(
            text(
                "SELECT r.rolsuper OR r.rolbypassrls OR c.relowner = r.oid FROM pg_roles r, pg_class c "
                "WHERE r.rolname = current_user AND c.oid = 'memories'::regclass"
            )
        ).scalar()
        if privileged:
            log.warning("the service connects as %r, which row-level security does not bind", owner)
        return False
    role = _quote_ident(connection, role_name)
    may_manage = bool(
        connection.execute(
            text("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")
        ).scalar()
    )
    managed = False
    if may_manage:
        exists = connection.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role_name}).scalar()
        if not exists:
            connection.execute(text(f"CREATE ROLE {role} LOGIN"))
        password = url.password
        # Literal, not a bind parameter: utility statements take none. quote_literal escapes it.
        secret = "NULL"
        if password:
            secret = str(connection.execute(text("SELECT quote_literal(:p)"), {"p": str(password)}).scalar())
        connection.execute(
            text(f"ALTER ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE PASSWORD {secret}")
        )
        managed = True
    else:
        log.warning("role %r may not manage roles: create %r as deploy/README.md shows", owner, role_name)
    exists = connection.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role_name}).scalar()
    if exists:
        grant_app_role(connection, role=role)
    return managed


def grant_app_role(connection: Connection, *, role: str) -> None:
    """Data access on everything the owner made and will make in this schema; `role` is quoted."""
    database = _quote_ident(connection, str(connection.execute(text("SELECT current_database()")).scalar()))
    for statement in (
        f"GRANT CONNECT ON DATABASE {database} TO {role}",
        f"GRANT USAGE ON SCHEMA public TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
        f"REVOKE INSERT, UPDATE, DELETE ON alembic_version FROM {role}",
        f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {role}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {role}",
    ):
        connection.execute(text(statement))
