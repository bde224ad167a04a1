"""Time-bounded categories and run teardown.

* `daily` memories expire `daily_ttl_hours` (72) after their last write (`updated_at`);
* `conversation` memories expire `conversation_ttl_hours` (24) after their last write, or die with their
  run (DELETE /v1/runs/{run_id}).

Expired memories are purged, not soft-forgotten: expiry exists to bound what an agent accumulates, and a
forgotten row would still occupy storage and the agent's history forever. A run teardown is an explicit
request, so it behaves like DELETE /v1/memories/{id}: soft by default, purge on request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.changes import lock_tenant_writes
from core.lifecycle.removal import BATCH, remove_memories
from core.memories.models import Memory
from core.memories.visibility import may_modify, visible_clause
from core.tenancy.context import Caller

LIVE = ("active", "stale")


def expire_category(session: Session, *, tenant_id: int, category: str, ttl: timedelta, now: datetime) -> int:
    """Purge the tenant's live memories of `category` not written for `ttl`."""
    cutoff = now - ttl
    total = 0
    while True:
        ids = session.scalars(
            select(Memory.id)
            .where(
                Memory.tenant_id == tenant_id,
                Memory.category == category,
                Memory.status.in_(LIVE),
                Memory.updated_at < cutoff,
            )
            .order_by(Memory.updated_at, Memory.id)
            .limit(BATCH)
        ).all()
        if not ids:
            return total
        reason = f"expired: {category} memory not written for {ttl.total_seconds() / 3600:g} h"
        total += remove_memories(session, tenant_id=tenant_id, memory_ids=ids, reason=reason, purge=True)


@dataclass(frozen=True)
class RunTeardown:
    run_id: str
    status: str  # forgotten | purged
    count: int
    skipped: int  # visible memories of the run the caller may not change (another user's)

    def as_dict(self) -> dict[str, object]:
        return {"run_id": self.run_id, "status": self.status, "count": self.count, "skipped": self.skipped}


def end_run(session: Session, *, caller: Caller, run_id: str, all_categories: bool, purge: bool) -> RunTeardown:
    """Forget (or purge) the caller-visible memories of a run: its `conversation` memories, or with
    `all_categories` every category. Memories of another user that a member can see are skipped, as
    DELETE /v1/memories/{id} would refuse them."""
    lock_tenant_writes(session, tenant_id=caller.tenant_id)  # before the memory rows (one lock order)
    conditions = [Memory.run_id == run_id, visible_clause(caller)]
    if not all_categories:
        conditions.append(Memory.category == "conversation")
    if not purge:
        conditions.append(Memory.status != "forgotten")
    rows = session.scalars(select(Memory).where(*conditions).with_for_update()).all()
    allowed = [m.id for m in rows if may_modify(m, caller)]
    count = remove_memories(
        session, tenant_id=caller.tenant_id, memory_ids=allowed, reason=f"run {run_id} ended", purge=purge
    )
    return RunTeardown(
        run_id=run_id, status="purged" if purge else "forgotten", count=count, skipped=len(rows) - len(allowed)
    )
