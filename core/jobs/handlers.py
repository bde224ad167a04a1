"""What each job kind does. Importing this module registers the handlers (workers do so at start)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from core.config import get_settings
from core.db import scope_to_tenant
from core.jobs.models import Job
from core.jobs.service import PermanentJobError, enqueue, handler


@handler("embed")
def run_embed(session: Session, job: Job) -> dict[str, Any]:
    from core.embeddings.chaos import embedder_for_settings
    from core.embeddings.refresh import embed_docs

    if job.tenant_id is None:
        raise PermanentJobError("embed job without a tenant")
    doc_ids = job.payload.get("doc_ids")
    if not isinstance(doc_ids, list):
        raise PermanentJobError("embed job payload has no doc_ids list")
    settings = get_settings()
    doc_ids = _split_embed_job(session, job, [str(d) for d in doc_ids], size=max(1, settings.embed_job_max_docs))
    scope_to_tenant(session, job.tenant_id)
    return embed_docs(
        session,
        tenant_id=job.tenant_id,
        doc_ids=doc_ids,
        embedder=embedder_for_settings(job.payload.get("model")),
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


@handler("prune")
def run_prune(session: Session, job: Job) -> dict[str, Any]:
    from core.lifecycle.prune import run_prune_job

    return run_prune_job(session, job)


import core.entities.jobs  # noqa: E402,F401 - registers ingest, refresh_samples and ingest_cleanup
