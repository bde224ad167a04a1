"""Embedding helpers: run a tenant's queued jobs in the test's process, and read its coverage."""

from __future__ import annotations

from sqlalchemy import select

from tests.helpers.processes import wait_for


def run_pending_jobs(tenant_id: int) -> int:
    """Run the tenant's queued jobs in-process, as a worker would (used where no worker is needed)."""
    from core.db import system_session
    from core.jobs.models import Job
    from workers.runner import run_job

    with system_session() as session:
        ids = session.scalars(select(Job.id).where(Job.tenant_id == tenant_id, Job.state == "queued")).all()
    for job_id in ids:
        run_job(job_id, session_factory=system_session, max_attempts=3)
    return len(ids)


def coverage_by_kind(client, tenant):  # type: ignore[no-untyped-def]
    response = client.get("/v1/ops/coverage", headers=tenant.headers())
    assert response.status_code == 200, response.text
    return {(r["doc_kind"], r["model"]): r for r in response.json()["coverage"]}


def converge(client, tenant, model: str) -> dict:  # type: ignore[no-untyped-def]
    """Run queued jobs in-process until the tenant's memory coverage for `model` is complete (a session
    worker may be running some of them at the same time)."""
    def complete():  # type: ignore[no-untyped-def]
        run_pending_jobs(tenant.tenant_id)
        row = coverage_by_kind(client, tenant)[("memory", model)]
        return row if row["ratio"] == 1.0 else None

    return wait_for(complete, timeout=60)  # type: ignore[return-value]
