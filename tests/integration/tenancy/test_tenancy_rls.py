"""PostgreSQL itself refuses another tenant's rows (CONTRACT section 2): forced row-level security on
every tenant table, checked from the live catalog, with the service connected as a role that owns
nothing and cannot bypass it. Raw SQL here deliberately carries no tenant condition."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from core.db import APP_ROLE, get_engine, scope_to_tenant, system_connection, system_session, tenant_session
from core.tenancy.rls import SYSTEM_ROLE, not_leakproof


def _two_tenants_with_memories(client, make_tenant):  # type: ignore[no-untyped-def]
    a, b = make_tenant("rls-a"), make_tenant("rls-b")
    for tenant, count in ((a, 3), (b, 2)):
        for i in range(count):
            body = {"content": f"note {i} of {tenant.name}", "id": f"shared-{i}", "entities": []}
            assert client.post("/v1/memories", json=body, headers=tenant.headers()).status_code == 201
    return a, b


def test_service_role_owns_nothing_and_cannot_bypass(stack):
    with get_engine().connect() as connection:
        user, superuser, bypass = connection.execute(
            text("SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user")
        ).one()
        owned = connection.execute(
            text("SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE r.rolname = current_user")
        ).scalar()
        assert (user, superuser, bypass, owned) == (APP_ROLE, False, False, 0)
        with pytest.raises(DBAPIError, match="must be owner"):
            connection.execute(text("ALTER TABLE memories DISABLE ROW LEVEL SECURITY"))


def test_every_tenant_table_has_an_enabled_forced_policy(stack):
    """Enumerated from the catalog, so a table added later without its policy fails here."""
    with system_connection() as connection:
        rows = connection.execute(
            text(
                "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, "
                "(SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) "
                "FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' "
                "WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') "
                "UNION ALL SELECT relname, relrowsecurity, relforcerowsecurity, "
                "(SELECT count(*) FROM pg_policy p WHERE p.polrelid = 'tenants'::regclass) "
                "FROM pg_class WHERE oid = 'tenants'::regclass"
            )
        ).all()
    assert len(rows) >= 15  # memories, embeddings, jobs, the catalog tables, statistics, keys, ...
    unprotected = [name for name, enabled, forced, policies in rows if not (enabled and forced and policies)]
    assert unprotected == []


def test_raw_unfiltered_statements_see_one_tenant(client, make_tenant):
    a, b = _two_tenants_with_memories(client, make_tenant)
    with tenant_session(a.tenant_id) as session:
        tenants = session.execute(text("SELECT DISTINCT tenant_id FROM memories")).scalars().all()
        assert tenants == [a.tenant_id]
        assert session.execute(text("SELECT count(*) FROM memories")).scalar() == 3
        assert session.execute(text("SELECT count(*) FROM tenants")).scalar() == 1
        updated = session.execute(text("UPDATE memories SET importance = 0.11"))
        assert updated.rowcount == 3  # type: ignore[attr-defined]
        deleted = session.execute(text("DELETE FROM memories WHERE id = 'shared-0'"))
        assert deleted.rowcount == 1  # type: ignore[attr-defined]
    with tenant_session(b.tenant_id) as session:
        rows = session.execute(text("SELECT id, importance FROM memories ORDER BY id")).all()
        assert [(r[0], float(r[1]) != 0.11) for r in rows] == [("shared-0", True), ("shared-1", True)]


def test_writing_another_tenants_row_is_refused(client, make_tenant):
    a, b = _two_tenants_with_memories(client, make_tenant)
    with pytest.raises(DBAPIError, match="row-level security"), tenant_session(a.tenant_id) as session:
        session.execute(
            text("INSERT INTO tombstones (tenant_id, doc_id, change_seq) VALUES (:t, 'memory:x', 1)"),
            {"t": b.tenant_id},
        )


def test_no_tenant_means_no_rows(client, make_tenant):
    """A transaction that names neither a tenant nor system mode sees nothing (fail closed)."""
    _two_tenants_with_memories(client, make_tenant)
    with get_engine().connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM memories")).scalar() == 0
        assert connection.execute(text("SELECT count(*) FROM api_keys")).scalar() == 0
    with system_connection() as connection:
        assert connection.execute(text("SELECT count(*) FROM memories")).scalar() >= 5


def test_a_pooled_connection_carries_no_tenant_into_the_next_transaction(client, make_tenant):
    a, _ = _two_tenants_with_memories(client, make_tenant)
    engine = create_engine(get_engine().url, pool_size=1, max_overflow=0)  # one connection, reused
    try:
        with Session(engine) as session:
            session.info["tenant_id"] = a.tenant_id
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar()
            assert session.execute(text("SELECT current_setting('engram.tenant_id')")).scalar() == str(a.tenant_id)
            assert session.execute(text("SELECT count(*) FROM memories")).scalar() == 3
            session.commit()
        with engine.connect() as connection:
            assert connection.execute(text("SELECT pg_backend_pid()")).scalar() == pid
            setting = connection.execute(text("SELECT current_setting('engram.tenant_id', true)")).scalar()
            assert setting in ("", None)
            assert connection.execute(text("SELECT count(*) FROM memories")).scalar() == 0
    finally:
        engine.dispose()


def test_statistics_triggers_run_under_row_security(client, make_tenant):
    """Saves maintain the per-tenant corpus statistics through triggers, as the app role."""
    a, b = _two_tenants_with_memories(client, make_tenant)
    with system_connection() as connection:
        docs = dict(
            connection.execute(
                text(
                    "SELECT tenant_id, docs FROM search_corpus_stats WHERE scope = '' AND status = 'active' "
                    "AND tenant_id IN (:a, :b)"
                ),
                {"a": a.tenant_id, "b": b.tenant_id},
            ).all()
        )
    assert docs == {a.tenant_id: 3, b.tenant_id: 2}


def test_system_mode_is_a_role_the_app_role_does_not_inherit(client, make_tenant):
    """System mode takes both the system role and the setting: the app role alone, even with the setting
    on, sees no tenant's rows (it is a member of the system role that does not inherit its policy)."""
    _two_tenants_with_memories(client, make_tenant)
    with get_engine().connect() as connection:
        inherits, may_set = connection.execute(
            text("SELECT pg_has_role(:r, 'USAGE'), pg_has_role(:r, 'MEMBER')"), {"r": SYSTEM_ROLE}
        ).one()
        assert (inherits, may_set) == (False, True)
        connection.execute(text("SELECT set_config('engram.system', 'on', true)"))
        assert connection.execute(text("SELECT count(*) FROM memories")).scalar() == 0
        connection.rollback()
        # The role without the setting: nothing either.
        connection.execute(text("SELECT set_config('role', :r, true)"), {"r": SYSTEM_ROLE})
        assert connection.execute(text("SELECT count(*) FROM memories")).scalar() == 0
        connection.rollback()
    with system_connection() as connection:
        assert connection.execute(text("SELECT current_user")).scalar() == SYSTEM_ROLE
        assert connection.execute(text("SELECT count(*) FROM memories")).scalar() >= 5
    with system_connection() as connection:
        role = connection.execute(
            text("SELECT rolsuper OR rolbypassrls OR rolcanlogin FROM pg_roles WHERE rolname = :r"), {"r": SYSTEM_ROLE}
        )
        assert role.scalar() is False


def test_a_system_session_narrowed_to_a_tenant_leaves_the_system_role(client, make_tenant):
    a, _ = _two_tenants_with_memories(client, make_tenant)
    with system_session() as session:
        assert session.execute(text("SELECT count(DISTINCT tenant_id) FROM memories")).scalar() >= 2
        scope_to_tenant(session, a.tenant_id)  # mid-transaction, as a worker running one tenant's job
        assert session.execute(text("SELECT current_user")).scalar() == APP_ROLE
        assert session.execute(text("SELECT DISTINCT tenant_id FROM memories")).scalars().all() == [a.tenant_id]


def test_the_tenant_policy_is_checked_once_per_statement(client, make_tenant):
    """The policy's condition merges with the statement's own tenant condition into a one-time check:
    no per-row filter, no InitPlan, and the row estimate of the owner's plan (an OR in the policy, or a
    function call the planner must inline, would bring back what this costs; docs/benchmarks.md)."""
    a, _ = _two_tenants_with_memories(client, make_tenant)
    statement = text("EXPLAIN SELECT id FROM memories WHERE tenant_id = :t AND status = 'active'")
    with tenant_session(a.tenant_id) as session:
        plan = "\n".join(session.execute(statement, {"t": a.tenant_id}).scalars())
    assert "One-Time Filter" in plan and "current_setting" in plan, plan
    assert "InitPlan" not in plan and "SubPlan" not in plan, plan


def test_the_hot_conditions_are_leakproof(stack):
    """Under a policy PostgreSQL uses a condition as an index or join probe only if it is leakproof:
    `engram migrate` (as the embedded superuser) declares so the GIN array operators of the entity lookups
    and the `substr` of the dense channel's join to memories (`id = substr(canonical_id, 8)`), without
    which that join hashes the tenant's whole table (36 ms against 4.9 ms at 100k memories)."""
    with get_engine().connect() as connection:
        assert not_leakproof(connection) == []
