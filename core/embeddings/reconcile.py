"""Find embedding gaps (missing rows, changed content, another model) and queue embed jobs for them; once a
tenant has none, delete its vectors of retired models (a model swap ends with coverage back at 1.0 and no
rows of the old model left behind).

A tenant with embed jobs still queued or running is skipped: those jobs will converge it, and the outbox
re-dispatch covers their lost messages. So a converged corpus costs two indexed queries per tenant and
zero embedding calls.
"""

from __future__ import annotations

from sqlalchemy import select, update

from core.db import scope_to_tenant, system_session
from core.embeddings.coverage import fold_deltas, set_exact_count
from core.embeddings.reindex import REASON as REINDEX
from core.embeddings.reindex import tenants_with_other_models
from core.embeddings.store import catalog_gaps, drop_other_models, memory_gaps
from core.jobs.models import Job
from core.jobs.service import enqueue
from core.tenancy.models import Tenant
from core.tenancy.usage import embedding_quota_spent

GAP_JOB_SIZE = 500
MAX_GAPS_PER_RUN = 50_000


def reconcile_embeddings(*, model: str) -> dict[int, int]:
    """Queue embed jobs for every tenant's gaps; returns {tenant_id: docs queued} for tenants with gaps.

    A tenant is checked only if a write moved its change_seq (or the model changed) since the last check
    that found nothing missing, so a converged corpus costs one row read per tenant, not a hash of every
    memory.
    """
    with system_session() as session:
        tenants = session.execute(
            select(Tenant.id, Tenant.change_seq).where(
                (Tenant.embeddings_checked_seq != Tenant.change_seq)
                | (Tenant.embeddings_checked_model.is_distinct_from(model)),
                # A suspended tenant's embedding waits for its resumption; an offboarded one's never comes.
                Tenant.state == "active",
            )
        ).all()
        # Tenants that spent today's embedding_texts_per_day: their gaps wait for tomorrow.
        spent = embedding_quota_spent(session)
        busy = set(
            session.scalars(
                select(Job.tenant_id).where(Job.kind == "embed", Job.state.in_(("queued", "running"))).distinct()
            ).all()
        )
    with system_session() as session:
        fold_deltas(session)
        reindexing = tenants_with_other_models(session, model=model)
    queued: dict[int, int] = {}
    for tenant_id, change_seq in tenants:
        if tenant_id in busy or tenant_id in spent:
            continue
        with system_session() as session:
            scope_to_tenant(session, tenant_id)
            gaps = memory_gaps(session, model=model, limit=MAX_GAPS_PER_RUN) + catalog_gaps(session, model=model)
            for start in range(0, len(gaps), GAP_JOB_SIZE):
                enqueue(
                    session,
                    tenant_id=tenant_id,
                    kind="embed",
                    payload={
                        "doc_ids": gaps[start : start + GAP_JOB_SIZE],
                        "model": model,
                        # A tenant still on another model's vectors is being reindexed (paused, throttled).
                        "reason": REINDEX if tenant_id in reindexing else "reconcile",
                    },
                )
            if not gaps:
                # change_seq was read before the check: a write committed meanwhile is checked next time.
                # (The tenant row first, as every write of the tenant's data takes it first.)
                session.execute(
                    update(Tenant)
                    .where(Tenant.id == tenant_id)
                    .values(embeddings_checked_seq=change_seq, embeddings_checked_model=model)
                )
                drop_other_models(session, tenant_id=tenant_id, keep_model=model)
        if not gaps:
            # Converged: its coverage count is set from the rows (see core.embeddings.coverage).
            with system_session() as session:
                scope_to_tenant(session, tenant_id)
                set_exact_count(session, tenant_id=tenant_id, model=model)
        if gaps:
            queued[tenant_id] = len(gaps)
    return queued
