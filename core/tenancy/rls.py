"""Row-level security: the PostgreSQL half of tenant isolation, and the roles it applies to.

Every table with a ``tenant_id`` column (and ``tenants`` itself, by ``id``) has row-level security enabled
and forced, with two policies:

- ``engram_tenant_isolation`` (every role): a row is visible and writable when its tenant is the
  transaction's ``engram.tenant_id`` setting. A plain equality on a stable expression, nothing else: the
  planner puts it in one equivalence class with the statement's own ``tenant_id = :tenant`` and checks it
  once per statement (a one-time filter), so a tenant's query pays no per-row filter, no InitPlans to
  plan, and keeps its row estimates; a statement that forgets its tenant condition gets this one as its
  index condition.
- ``engram_system_mode`` (only :data:`SYSTEM_ROLE` and the schema owner): every row, when the transaction
  runs in the named system mode (``engram.system = 'on'``). The app role enters it by switching to
  :data:`SYSTEM_ROLE` for the transaction (``SET LOCAL ROLE``) with the setting on; it is a member of that
  role without inheriting it, so outside system mode this policy does not even apply to it (and its
  statements are not burdened with it). The owner keeps the setting alone for data migrations.

Both settings (and the role switch) are transaction-local, set by core.db at the start of each
transaction. Tables are found in the live catalog, so a table a later migration adds is covered by the
next `engram migrate` without anyone remembering to list it. Applying is idempotent and takes no lock on a
table that already has its policies.
"""

from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError

from core.db import SYSTEM_ROLE

log = logging.getLogger("engram.tenancy")

POLICY = "engram_tenant_isolation"
SYSTEM_POLICY = "engram_system_mode"
# Tables the service may insert into and read but never update or delete from (the audit trails).
APPEND_ONLY_TABLES = ("audit_entries", "operator_audit")


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


# The settings written out, not through SQL functions (0010's engram_current_tenant() and
# engram_system_mode()): PostgreSQL inlines a function's body again (parses and analyses its text) for
# every tenant table of every statement it plans, which measured as much as the rest of the policy's cost.
# NULLIF: a setting once set in a session reads '' after its transaction, not NULL.
_CURRENT_TENANT = "NULLIF(current_setting('engram.tenant_id', true), '')::bigint"
_SYSTEM_MODE_ON = "coalesce(current_setting('engram.system', true), '') = 'on'"


def _policy_sql(table: str, column: str) -> list[str]:
    tenant = f"{column} = {_CURRENT_TENANT}"
    system = _SYSTEM_MODE_ON
    return [
        f'CREATE POLICY {POLICY} ON "{table}" USING ({tenant}) WITH CHECK ({tenant})',
        f'CREATE POLICY {SYSTEM_POLICY} ON "{table}" TO {SYSTEM_ROLE}, CURRENT_USER USING ({system}) '
        f"WITH CHECK ({system})",
    ]


def _policed_tables(connection: Connection) -> set[str]:
    """Tables with row security enabled and forced and both policies in their current form."""
    return set(
        connection.execute(
            text(
                "SELECT c.relname FROM pg_class c "
                "JOIN pg_policy t ON t.polrelid = c.oid AND t.polname = :tenant "
                "JOIN pg_policy s ON s.polrelid = c.oid AND s.polname = :system "
                "WHERE c.relnamespace = current_schema()::regnamespace AND c.relrowsecurity "
                "AND c.relforcerowsecurity AND pg_get_expr(t.polqual, t.polrelid) NOT LIKE '%engram_system_mode%'"
            ),
            {"tenant": POLICY, "system": SYSTEM_POLICY},
        ).scalars()
    )


def apply_row_security(connection: Connection, *, replace: bool = False) -> list[str]:
    """Enable, force and police every tenant table that lacks it (every one with `replace`); returns the
    tables changed. Run by the owner; creates :data:`SYSTEM_ROLE` first if it is missing."""
    policed = set() if replace else _policed_tables(connection)
    targets = [(table, "tenant_id") for table in tenant_tables(connection)] + [("tenants", "id")]
    changed: list[str] = []
    if all(table in policed for table, _ in targets):
        return changed  # nothing to do, and nothing an app role running `migrate` may not do
    ensure_system_role(connection)
    for table, column in targets:
        if table in policed:
            continue
        connection.execute(text(f'ALTER TABLE "{table}" ENABLE ROW LEVEL SECURITY'))
        connection.execute(text(f'ALTER TABLE "{table}" FORCE ROW LEVEL SECURITY'))
        for name in (POLICY, SYSTEM_POLICY):
            connection.execute(text(f'DROP POLICY IF EXISTS {name} ON "{table}"'))
        for statement in _policy_sql(table, column):
            connection.execute(text(statement))
        changed.append(table)
    return changed


def _role_exists(connection: Connection, name: str) -> bool:
    return bool(connection.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": name}).scalar())


def _may_manage_roles(connection: Connection) -> bool:
    return bool(
        connection.execute(text("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")).scalar()
    )


def ensure_system_role(connection: Connection) -> None:
    """Create (or align) :data:`SYSTEM_ROLE`: no login, no BYPASSRLS, owns nothing, the app role's grants.
    Without the right to manage roles it must exist already (deploy/README.md shows how to create it)."""
    if not _role_exists(connection, SYSTEM_ROLE):
        if not _may_manage_roles(connection):
            raise RuntimeError(
                f"role {SYSTEM_ROLE!r} is missing and {connection.execute(text('SELECT current_user')).scalar()!r} "
                "may not create roles: create it as deploy/README.md shows, then run `engram migrate` again"
            )
        connection.execute(text(f"CREATE ROLE {SYSTEM_ROLE} NOLOGIN"))
    if _may_manage_roles(connection):
        connection.execute(text(f"ALTER ROLE {SYSTEM_ROLE} NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE"))
    grant_app_role(connection, role=SYSTEM_ROLE)


# PostgreSQL uses a condition as an index condition under row-level security only when it is LEAKPROOF
# (every function it calls on a column is). Two kinds of hot conditions are not, by default:
# - the array operators of the GIN-indexed entity lookups (`entities && ...`, `entities @> ...`), which
#   then scan the tenant's rows (measured: 0.4 ms -> 16 ms at 20k memories);
# - `substr(text, integer)`, in the join of the dense channel's nearest neighbours to their memories
#   (`memories.id = substr(e.canonical_id, 8)`): not leakproof, the join cannot probe memories' primary
#   key below the policy, and the planner hashes the tenant's whole memories table instead (measured at
#   100k memories: 36 ms against 4.9 ms for that statement, a question search +230%).
# They only compare or cut their arguments, raise no error that depends on a row's content (substr without
# a length has no error case), and report nothing about the rows they see; the app role cannot create
# functions of its own, so declaring them leakproof opens nothing. Only a superuser may.
_LEAKPROOF_FUNCTIONS = (
    "arrayoverlap(anyarray, anyarray)",
    "arraycontains(anyarray, anyarray)",
    "substr(text, integer)",
)


def not_leakproof(connection: Connection) -> list[str]:
    """The functions above that are not (yet) declared leakproof."""
    return list(
        connection.execute(
            text(
                "SELECT s FROM unnest(CAST(:signatures AS text[])) AS s "
                "LEFT JOIN pg_proc p ON p.oid = to_regprocedure(s) WHERE p.oid IS NULL OR NOT p.proleakproof"
            ),
            {"signatures": list(_LEAKPROOF_FUNCTIONS)},
        ).scalars()
    )


def declare_leakproof_functions(connection: Connection) -> bool:
    """Let the hot conditions above serve as index and join conditions under row-level security (superuser
    only); False when they stay as they are (a managed PostgreSQL: entity lookups then scan the tenant's
    rows, and the dense channel's join hashes them)."""
    if not not_leakproof(connection):
        return True
    if not connection.execute(text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).scalar():
        log.warning("not a superuser: array operators and substr stay non-leakproof, slower under RLS")
        return False
    for signature in _LEAKPROOF_FUNCTIONS:
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
        _join_system_role(connection, role="CURRENT_USER")
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
    may_manage = _may_manage_roles(connection)
    managed = False
    if may_manage:
        if not _role_exists(connection, role_name):
            connection.execute(text(f"CREATE ROLE {role} LOGIN"))
        password = url.password
        # Literal, not a bind parameter: utility statements take none. quote_literal escapes it.
        secret = "NULL"
        if password:
            secret = str(connection.execute(text("SELECT quote_literal(:p)"), {"p": str(password)}).scalar())
        connection.execute(
            text(f"ALTER ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOINHERIT PASSWORD {secret}")
        )
        _join_system_role(connection, role=role)
        managed = True
    else:
        log.warning("role %r may not manage roles: create %r as deploy/README.md shows", owner, role_name)
    if _role_exists(connection, role_name):
        grant_app_role(connection, role=role)
    return managed


def _join_system_role(connection: Connection, *, role: str) -> None:
    """Let `role` switch to :data:`SYSTEM_ROLE` (`SET ROLE`) without inheriting it: a role that inherited
    it would have the system policy applied to all its statements (still gated by ``engram.system``, but
    paid by every tenant query). NOINHERIT on the app role says the same on servers before 16."""
    may_set = connection.execute(
        text("SELECT rolsuper OR pg_has_role(current_user, :r, 'MEMBER') FROM pg_roles WHERE rolname = current_user"),
        {"r": SYSTEM_ROLE},
    ).scalar()
    if role == "CURRENT_USER" and may_set:
        return  # a superuser may set any role; a member already may
    if int(str(connection.execute(text("SHOW server_version_num")).scalar())) >= 160000:
        grant = f"GRANT {SYSTEM_ROLE} TO {role} WITH INHERIT FALSE, SET TRUE"
    else:
        grant = f"GRANT {SYSTEM_ROLE} TO {role}"
    try:
        with connection.begin_nested():
            connection.execute(text(grant))
    except DBAPIError as error:
        log.warning("could not grant %s to %s (%s): see deploy/README.md", SYSTEM_ROLE, role, error)


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
    # Append-only tables: the service inserts and reads; entries leave only through the owner's functions.
    for table in APPEND_ONLY_TABLES:
        if connection.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar() is not None:
            connection.execute(text(f'REVOKE UPDATE, DELETE, TRUNCATE ON "{table}" FROM {role}'))
