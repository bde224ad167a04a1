"""The lifecycle on beat: `engram.prune` (scheduled by beat) queues a `prune` job, and a real worker runs it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from tests.helpers.processes import wait_for


def test_beat_schedules_prune(stack):
    from workers.celery_app import make_celery

    schedule = make_celery().conf.beat_schedule
    assert schedule["prune"]["task"] == "engram.prune"


def _prune_jobs():  # type: ignore[no-untyped-def]
    from core.db import system_session
    from core.jobs.models import Job

    with system_session() as session:
        return session.scalars(select(Job).where(Job.kind == "prune").order_by(Job.created_at)).all()


def test_prune_task_runs_a_prune_job_on_a_worker(client, tenant, worker):
    """The task beat sends queues one prune job; the worker runs it, expiring an old daily memory, and the
    job result records what it did (and the decay anchor)."""
    from core.db import tenant_session
    from core.memories.models import Memory
    from workers.celery_app import app

    mid = client.post("/v1/memories", json={"content": "old", "category": "daily"}, headers=tenant.headers()).json()[
        "memory_id"
    ]
    with tenant_session(tenant.tenant_id) as session:
        session.execute(
            update(Memory).where(Memory.id == mid).values(updated_at=datetime.now(UTC) - timedelta(hours=100))
        )
    before = {j.id for j in _prune_jobs()}
    app.send_task("engram.prune")

    def finished():  # type: ignore[no-untyped-def]
        new = [j for j in _prune_jobs() if j.id not in before]
        return new[0] if new and new[0].state in ("succeeded", "failed") else None

    job = wait_for(finished, timeout=60)
    assert job.state == "succeeded", job.error
    assert job.tenant_id is None
    assert job.result["daily_expired"] >= 1 and tenant.name in job.result["tenants"]
    assert "decay" in job.result and str(tenant.tenant_id) in job.result["watched"]
    assert client.get(f"/v1/memories/{mid}", headers=tenant.headers()).status_code == 404
    from tests.helpers.api import OPERATOR

    listed = client.get("/v1/jobs", params={"kind": "prune"}, headers=OPERATOR).json()["jobs"]
    assert job.id in [j["id"] for j in listed]


def test_prune_is_not_queued_twice_while_one_is_pending(stack):
    from core.db import system_session
    from core.jobs.models import Job
    from core.jobs.service import get_job_queue, set_job_queue
    from core.lifecycle.prune import enqueue_prune

    queue = get_job_queue()
    set_job_queue(None)  # keep the row queued: nothing dispatches it
    try:
        with system_session() as session:
            first = enqueue_prune(session)
        with system_session() as session:
            assert enqueue_prune(session) is None
    finally:
        set_job_queue(queue)
        with system_session() as session:
            session.execute(update(Job).where(Job.id == first.id).values(state="failed", error="test cleanup"))
