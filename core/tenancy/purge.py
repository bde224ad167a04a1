"""Offboarding's purge job: remove every row an offboarded tenant left, table by table, then the tenant.

The tables are read from the live catalog (every table with a ``tenant_id`` column), so a table a later
migration adds is purged without anyone listing it. Rows go in chunks, each its own transaction, children
before the tables they reference: a worker killed midway leaves fewer rows, and the job's next run (it is
at-least-once) goes on from there. The tenant's own row goes last, in one transaction that also takes
whatever a request racing the offboarding managed to write (every foreign key to ``tenants`` cascades).
Once done, the job keeps the tenant's name and the counts, never its id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from core.config import get_settings
from core.tenancy.rls import APPEND_ONLY_TABLES, tenant_tables

log = logging.getLogger("engram.tenancy")

SessionFactory = Callable[[], AbstractContextManager[Session]]


def purge_order(connection: Connection) -> list[str]:
    """Every tenant table, each before the tables its foreign keys reference: no row is deleted while a row of
    another tenant table still points at it."""
    tables = tenant_tables(connection)
    references: dict[str, set[str]] = {table: set() for table in tables}
    for child, parent in connection.execute(
        text(
            "SELECT c.conrelid::regclass::text, c.confrelid::regclass::text FROM pg_constraint c "
            "WHERE c.contype = 'f' AND c.connamespace = current_schema()::regnamespace"
        )
    ):
        child, parent = child.strip('"'), parent.strip('"')
        if child in references and parent in references and child != parent:
            references[child].add(parent)
    ordered: list[str] = []
    placed: set[str] = set()

    def visit(table: str, path: frozenset[str]) -> None:
        if table in placed or table in path:
            return
        for child in sorted(t for t, parents in references.items() if table in parents):
            visit(child, path | {table})
        placed.add(table)
        ordered.append(table)

    for table in sorted(tables):
        visit(table, frozenset())
    return ordered


def _delete_chunks(session_factory: SessionFactory, *, table: str, tenant_id: int) -> Iterator[int]:
    chunk = get_settings().purge_chunk_rows
    while True:
        with session_factory() as session:
            deleted = session.execute(
                text(
                    f'DELETE FROM "{table}" WHERE ctid = ANY(ARRAY('
                    f'SELECT ctid FROM "{table}" WHERE tenant_id = :tenant LIMIT {int(chunk)}))'
                ),
                {"tenant": tenant_id},
            ).rowcount  # type: ignore[attr-defined]
        yield int(deleted or 0)
        if not deleted:
            return


def purge_tenant(
    session_factory: SessionFactory,
    *,
    tenant_id: int,
    before_tenant_row: Callable[[Session], dict[str, int] | None] | None = None,
) -> dict[str, Any]:
    """Remove every row of ``tenant_id`` (system mode sessions from ``session_factory``); idempotent.

    ``before_tenant_row`` runs in the final transaction, before the tenant's row is deleted (rows that only
    the schema's owner may delete, such as the audit log's, are removed there through the owner's function);
    it returns what it removed per table.
    """
    with session_factory() as session:
        state = session.execute(text("SELECT state FROM tenants WHERE id = :t"), {"t": tenant_id}).scalar()
        order = purge_order(session.connection())
    if state is None:
        return {"rows_removed": 0, "tables": 0, "already_purged": True}
    if state != "deleting":
        raise RuntimeError(f"tenant {tenant_id} is {state}, not being offboarded: refusing to purge it")
    removed: dict[str, int] = {}
    for table in order:
        if table == "jobs":
            continue  # the tenant's jobs go with its row (the purge's own job has no tenant)
        if table in APPEND_ONLY_TABLES:
            continue  # the service may not delete from them: before_tenant_row removes them as the owner
        count = sum(_delete_chunks(session_factory, table=table, tenant_id=tenant_id))
        if count:
            removed[table] = count
    with session_factory() as session:
        # What the chunks' own triggers (or a request racing the offboarding) wrote after its table was
        # passed, gone in the transaction that removes the tenant: a handful of rows, never the bulk.
        for table in order:
            if table != "jobs" and table not in APPEND_ONLY_TABLES:
                late = session.execute(text(f'DELETE FROM "{table}" WHERE tenant_id = :t'), {"t": tenant_id})
                if late.rowcount:  # type: ignore[attr-defined]
                    removed[table] = removed.get(table, 0) + int(late.rowcount)  # type: ignore[attr-defined]
        if before_tenant_row is not None:
            removed.update({table: n for table, n in (before_tenant_row(session) or {}).items() if n})
        jobs = session.execute(text("DELETE FROM jobs WHERE tenant_id = :t"), {"t": tenant_id}).rowcount  # type: ignore[attr-defined]
        session.execute(text("DELETE FROM tenants WHERE id = :t AND state = 'deleting'"), {"t": tenant_id})
    if jobs:
        removed["jobs"] = int(jobs)
    log.info("purged offboarded tenant %s: %s", tenant_id, removed)
    return {"rows_removed": sum(removed.values()), "tables": len(removed), "by_table": removed}


def left_behind(session: Session, *, tenant_id: int) -> dict[str, int]:
    """Rows of ``tenant_id`` still in any tenant table (system mode): what a verified erasure finds empty."""
    found: dict[str, int] = {}
    for table in tenant_tables(session.connection()):
        count = session.execute(text(f'SELECT count(*) FROM "{table}" WHERE tenant_id = :t'), {"t": tenant_id}).scalar()
        if count:
            found[table] = int(count)
    if session.execute(text("SELECT 1 FROM tenants WHERE id = :t"), {"t": tenant_id}).scalar():
        found["tenants"] = 1
    return found
