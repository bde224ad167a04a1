"""Importance decay: every memory but `identity` loses half its importance per `importance_half_life_days`.

Decay is materialised, not computed at read time, because importance is read by many paths that rank by
it in SQL (search's `important` mode, listing by importance, eviction) and they must all agree. To avoid
rewriting every row every few minutes, the prune job applies it at most once per
`importance_decay_interval_hours` (24 h by default): each live memory's importance is multiplied by
0.5 ^ (elapsed / half_life), where elapsed runs from the previous pass, or from the memory's last write if
that is later (a write sets importance afresh). The time of the previous pass is recorded in the prune
job's result, committed in the same transaction as the decay itself, so a pass is never applied twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, literal, select, update
from sqlalchemy.orm import Session

from core.jobs.models import Job
from core.lifecycle.expiry import LIVE
from core.memories.models import Memory

EXEMPT_KINDS = ("identity",)


def last_pass(session: Session) -> datetime | None:
    """When decay was last applied (from the newest prune job that applied or anchored it)."""
    applied_at = session.scalar(
        select(Job.result["decay"]["applied_at"].as_string())
        .where(Job.kind == "prune", Job.state == "succeeded", Job.result["decay"]["applied_at"].is_not(None))
        .order_by(Job.finished_at.desc())
        .limit(1)
    )
    return datetime.fromisoformat(applied_at) if applied_at else None


def apply_decay(
    session: Session,
    *,
    now: datetime,
    half_life_days: float,
    interval: timedelta,
    previous: datetime | None,
    tenant_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Decay importance (of every tenant, or of `tenant_ids`) if a pass is due since `previous`; the
    returned dict goes into the prune job's result, which is what `last_pass` reads next time."""
    if previous is None:
        # First run: anchor the clock; nothing has a known age yet.
        return {"applied_at": now.isoformat(), "memories": 0, "anchored": True}
    if now - previous < interval:
        return {"due_at": (previous + interval).isoformat(), "memories": 0}
    since = func.greatest(literal(previous), Memory.updated_at)
    elapsed_days = func.extract("epoch", literal(now) - since) / 86400.0
    scope = [] if tenant_ids is None else [Memory.tenant_id.in_(list(tenant_ids))]
    result = session.execute(
        update(Memory)
        .where(*scope, Memory.status.in_(LIVE), Memory.kind.not_in(EXEMPT_KINDS), Memory.updated_at < now)
        .values(importance=Memory.importance * func.power(0.5, func.greatest(elapsed_days, 0) / half_life_days))
        .execution_options(synchronize_session=False)
    )
    return {"applied_at": now.isoformat(), "memories": int(result.rowcount or 0)}  # type: ignore[attr-defined]
