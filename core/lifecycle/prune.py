"""The `prune` job: one pass of the whole lifecycle over every tenant.

Each tenant's expiry, eviction and staleness check run in their own transaction (a large tenant does not
hold locks on the others; every step is idempotent, so a pass cut short is simply finished by the next).
Decay runs last in the job's own transaction, so it commits together with the job result that records
it. A transaction-scoped advisory lock keeps two passes from overlapping: a second one finds the lock
taken and ends at once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from core.audit.service import prune_audit
from core.config import Settings, get_settings
from core.db import tenant_session
from core.jobs.models import Job
from core.jobs.service import enqueue, now
from core.lifecycle.decay import apply_decay, last_pass
from core.lifecycle.eviction import evict_over_cap
from core.lifecycle.expiry import expire_category
from core.lifecycle.staleness import tenant_change_seq, watch_tenant
from core.tenancy.models import Tenant
from core.webhooks.delivery import prune_deliveries

PRUNE_LOCK_KEY = 7_402_911_338


def previous_watermarks(session: Session) -> dict[str, int]:
    """Per tenant, the change_seq the staleness watcher last checked (from the newest prune result)."""
    watch = session.scalar(
        select(Job.result["watched"])
        .where(Job.kind == "prune", Job.state == "succeeded", Job.result["watched"].is_not(None))
        .order_by(Job.finished_at.desc())
        .limit(1)
    )
    return {str(k): int(v) for k, v in (watch or {}).items()}


def prune_tenant(*, tenant_id: int, settings: Settings, watermark: int | None, change_seq: int) -> dict[str, int]:
    """Expiry and eviction for one tenant, then the staleness check if the tenant changed since the last
    one. Returns counts and, under "change_seq", the watermark to record for the next pass."""
    current = now()
    with tenant_session(tenant_id) as session:
        counts = {
            "daily_expired": expire_category(
                session,
                tenant_id=tenant_id,
                category="daily",
                ttl=timedelta(hours=settings.daily_ttl_hours),
                now=current,
            ),
            "conversation_expired": expire_category(
                session,
                tenant_id=tenant_id,
                category="conversation",
                ttl=timedelta(hours=settings.conversation_ttl_hours),
                now=current,
            ),
            "evicted": evict_over_cap(
                session,
                tenant_id=tenant_id,
                cap=settings.agent_entry_cap,
                now=current,
                half_life_days=settings.importance_half_life_days,
            ),
        }
    counts["marked_stale"], counts["change_seq"] = 0, change_seq
    if watermark != change_seq:
        with tenant_session(tenant_id) as session:
            # Read before checking: a write committed meanwhile has a higher seq and is checked next pass.
            counts["change_seq"] = tenant_change_seq(session, tenant_id=tenant_id)
            counts["marked_stale"] = watch_tenant(session, tenant_id=tenant_id)
    return counts


def run_prune(session: Session, *, settings: Settings) -> dict[str, Any]:
    """One lifecycle pass; `session` is the job's cross-tenant session and commits with the result."""
    if not session.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": PRUNE_LOCK_KEY}):
        return {"skipped": "another prune pass is running"}
    watermarks = previous_watermarks(session)
    tenants = session.execute(select(Tenant.id, Tenant.name, Tenant.change_seq).order_by(Tenant.id)).all()
    totals = dict.fromkeys(("daily_expired", "conversation_expired", "evicted", "marked_stale"), 0)
    per_tenant: dict[str, dict[str, int]] = {}
    watched: dict[str, int] = {}
    for tenant_id, name, change_seq in tenants:
        counts = prune_tenant(
            tenant_id=tenant_id, settings=settings, watermark=watermarks.get(str(tenant_id)), change_seq=change_seq
        )
        watched[str(tenant_id)] = counts.pop("change_seq")
        for key in totals:
            totals[key] += counts[key]
        if any(counts.values()):
            per_tenant[name] = counts
    decay = apply_decay(
        session,
        now=now(),
        half_life_days=settings.importance_half_life_days,
        interval=timedelta(hours=settings.importance_decay_interval_hours),
        previous=last_pass(session),
    )
    # Audit entries past their retention, through the owner's function (the service's role cannot delete them).
    audit_removed = prune_audit(session, retention_days=settings.audit_retention_days)
    deliveries_removed = prune_deliveries(session, retention_days=settings.webhook_delivery_retention_days)
    return {
        **totals,
        "tenants": per_tenant,
        "decay": decay,
        "watched": watched,
        "audit_removed": audit_removed,
        "webhook_deliveries_removed": deliveries_removed,
    }


def run_prune_job(session: Session, job: Job) -> dict[str, Any]:
    """The `prune` job handler (registered in workers.handlers)."""

    return run_prune(session, settings=get_settings())


def enqueue_prune(session: Session) -> Job | None:
    """Queue a prune pass unless one is already queued or running (beat must not pile them up)."""

    pending = session.scalar(select(Job.id).where(Job.kind == "prune", Job.state.in_(("queued", "running"))).limit(1))
    if pending is not None:
        return None
    return enqueue(session, tenant_id=None, kind="prune", payload={})
