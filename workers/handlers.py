"""What each job kind does: the one table the runner (workers.runner) reads.

Every kind is named here, explicitly; no handler registers itself by being imported. The table sits in
workers, above every domain it names, so no domain imports the code that runs its jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from core.audit.service import purge_tenant_audit
from core.config import get_settings
from core.db import scope_to_tenant, system_session

# The module, not the function: the embed tests swap factory.embedder_for_settings for a refusing provider.
from core.embeddings import factory
from core.embeddings.refresh import embed_docs
from core.entities import jobs as catalog_jobs
from core.jobs.models import Job
from core.jobs.service import PermanentJobError, enqueue
from core.lifecycle.prune import run_prune_job
from core.search.erasure import erase_tenant
from core.tenancy.purge import purge_tenant
from core.webhooks.delivery import run_webhook_job

Handler = Callable[[Session, Job], dict[str, Any] | None]
# Runs several jobs of a kind that share a batch key (core.jobs.batches) as one call.
BatchHandler = Callable[[Session, Sequence[Job]], dict[str, Any] | None]


def run_embed(session: Session, job: Job) -> dict[str, Any]:
    return run_embeds(session, [job])


def run_embeds(session: Session, jobs: Sequence[Job]) -> dict[str, Any]:
    """Embed the docs of these jobs (one tenant, one model: core.jobs.batches) together."""
    tenant_id = jobs[0].tenant_id
    if tenant_id is None:
        raise PermanentJobError("embed job without a tenant")
    settings = get_settings()
    doc_ids: list[str] = []
    for job in jobs:
        listed = job.payload.get("doc_ids")
        if not isinstance(listed, list):
            raise PermanentJobError("embed job payload has no doc_ids list")
        doc_ids += _split_embed_job(session, job, [str(d) for d in listed], size=max(1, settings.embed_job_max_docs))
    scope_to_tenant(session, tenant_id)
    return embed_docs(
        session,
        tenant_id=tenant_id,
        doc_ids=list(dict.fromkeys(doc_ids)),
        embedder=factory.embedder_for_settings(jobs[0].payload.get("model")),
        batch_size=settings.embedding_batch_size,
        # Suggestions (similar_existing) are for a sync_embed save's response: a job's result never shows them.
        suggestions=False,
    )


def _split_embed_job(session: Session, job: Job, doc_ids: list[str], *, size: int) -> list[str]:
    """Keep the first ``size`` docs for this job and queue the rest as jobs of ``size``; returns this job's docs.

    The split commits before anything is embedded, so a worker killed afterwards loses one chunk's work,
    and a retry of this job redoes only its own chunk.
    """
    if len(doc_ids) <= size:
        return doc_ids
    rest = doc_ids[size:]
    chunks = [rest[start : start + size] for start in range(0, len(rest), size)]
    for chunk in chunks:
        enqueue(
            session,
            tenant_id=job.tenant_id,
            kind="embed",
            payload={**job.payload, "doc_ids": chunk, "split_from": job.id},
        )
    job.payload = {**job.payload, "doc_ids": doc_ids[:size], "split_into": len(chunks) + 1}
    session.commit()
    return doc_ids[:size]


def run_prune(session: Session, job: Job) -> dict[str, Any]:
    return run_prune_job(session, job)


def run_purge_tenant(session: Session, job: Job) -> dict[str, Any]:
    """Offboarding (core.tenancy.purge): every row of the tenant, then its cached state and index here.
    The job keeps the tenant's name; its id is dropped from the payload once the tenant is gone."""
    tenant_id = job.payload.get("tenant_id")
    if not isinstance(tenant_id, int):
        return {"rows_removed": 0, "already_purged": True}
    result = purge_tenant(system_session, tenant_id=tenant_id, before_tenant_row=_remove_audit_entries(tenant_id))
    erase_tenant(tenant_id)
    job.payload = {key: value for key, value in job.payload.items() if key != "tenant_id"}
    return result


def _remove_audit_entries(tenant_id: int) -> Callable[[Session], dict[str, int]]:
    """The offboarded tenant's audit entries, through the owner's function (the service cannot delete them)."""

    def remove(session: Session) -> dict[str, int]:
        return {"audit_entries": purge_tenant_audit(session, tenant_id=tenant_id)}

    return remove


def run_webhook(session: Session, job: Job) -> dict[str, Any]:
    return run_webhook_job(session, job)


HANDLERS: dict[str, Handler] = {
    "embed": run_embed,
    "purge_tenant": run_purge_tenant,
    "prune": run_prune,
    # Bulk: deliveries to tenants' receivers (one webhook's at a time), never ahead of interactive work.
    "webhook": run_webhook,
    "ingest": catalog_jobs.run_ingest_job,
    "refresh_samples": catalog_jobs.run_refresh_samples_job,
    "ingest_cleanup": catalog_jobs.run_ingest_cleanup_job,
}
BATCH_HANDLERS: dict[str, BatchHandler] = {"embed": run_embeds}
