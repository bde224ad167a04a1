"""The tenant's change sequence: every write to tenant data takes the next value.

Derived indexes (full-text, entity statistics, vector matrices) remember the last ``change_seq`` they
reflect and catch up on rows stamped with a larger one. Catalog, memory and lifecycle writes all bump it,
so it lives here, below those domains, rather than in any of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Executable, and_, bindparam, func, select, update
from sqlalchemy.orm import Session

from core import sql
from core.errors import Unauthorized
from core.tenancy.models import Tenant

# A change feed reads the rows stamped after a point: ``change_seq > :since AND change_seq <= :upto`` with
# ``upto`` past every seq. Open-ended, the range is one PostgreSQL estimates, without the values, as a third of
# the tenant's rows, so its plan had to be made for each call's values (a sequential scan otherwise): 50-160
# microseconds of planning a statement, more than running it, at every search while saves stream in. Bounded
# on both sides it is estimated narrow whatever the values, so a feed runs on one generic plan (core.sql), a
# range scan of the (tenant_id, change_seq) index (a sequential scan while the table is a few pages).
FEED_END = 2**63 - 1


def feed_range(column: str) -> str:
    """SQL: ``column`` (a change seq) after ``:since``, up to ``:upto`` (see :data:`FEED_END`)."""
    return f"{column} > :since AND {column} <= :upto"


def feed_condition(column: Any) -> ColumnElement[bool]:
    """:func:`feed_range` as a SQLAlchemy condition on ``column``."""
    return and_(column > bindparam("since"), column <= bindparam("upto"))


def feed_values(tenant_id: int, since: int) -> dict[str, int]:
    """The values of a feed statement written with :func:`feed_range`: ``tenant``, ``since``, ``upto``."""
    return {"tenant": tenant_id, "since": since, "upto": FEED_END}


def bump_change_seq(session: Session, *, tenant_id: int, auto_ids: int = 0, supplied_max: int = 0) -> tuple[int, int]:
    """Advance the tenant's change sequence (and reserve `auto_ids` memory ids) under its row lock.

    Returns (memory_seq, change_seq) after the update; the reserved ids are
    memory_seq - auto_ids + 1 .. memory_seq. The row lock also orders concurrent writers of one tenant,
    so change_seq values become visible in commit order.
    """
    row = session.execute(
        update(Tenant)
        .where(Tenant.id == tenant_id)
        .values(
            memory_seq=func.greatest(Tenant.memory_seq, supplied_max) + auto_ids,
            change_seq=Tenant.change_seq + 1,
        )
        .returning(Tenant.memory_seq, Tenant.change_seq)
    ).one_or_none()
    if row is None:
        # The tenant was offboarded (its row purged) by a request racing this one: its keys are revoked.
        raise Unauthorized("invalid API key")
    return int(row[0]), int(row[1])


def lock_tenant_writes(session: Session, *, tenant_id: int) -> None:
    """Take the tenant's write lock first, before any memory row: the one lock order of every write.

    Every write ends by bumping the tenant's sequences (a row lock on ``tenants``); a write that locked a
    memory row before that (an upsert's ownership check, a PATCH, a forget) waited for the tenant row while
    holding the memory row, and a save of the same id in the other order (tenant row, then the upsert's lock
    on the memory row it found taken) closed the cycle: PostgreSQL's ``deadlock detected``. Taken first, the
    tenant row orders the tenant's writers before they touch anything else. The same lock the bump takes
    (FOR NO KEY UPDATE), so the bump later in the transaction does not wait again, and readers and foreign
    keys to the tenant are not blocked.
    """
    session.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update(key_share=True))


def advance_query(tenant_id: int) -> sql.Query:
    """The tenant's change seq advanced (its row locked as :func:`bump_change_seq` locks it), as a statement a
    write sends first, with the reads it locks next (core.sql): its one row holds the new change seq; no row
    when the tenant is gone (:func:`advanced` says so)."""
    return sql.Query(("advance-change-seq",), _advance_statement, {"tenant": tenant_id}, generic=True)


def _advance_statement() -> Executable:
    return (
        update(Tenant)
        .where(Tenant.id == bindparam("tenant", type_=BigInteger))
        .values(change_seq=Tenant.change_seq + 1)
        .returning(Tenant.change_seq)
    )


def advanced(rows: Sequence[Any]) -> int:
    """The change seq of :func:`advance_query`'s rows; Unauthorized when the tenant's row is gone (offboarded by a
    request racing this one: its keys are revoked)."""
    if not rows:
        raise Unauthorized("invalid API key")
    return int(rows[0][0])
