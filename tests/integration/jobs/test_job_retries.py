"""Job retries survive real outages: exponential backoff with jitter up to hours, every attempt's error
kept, the next attempt's time shown (GET /v1/jobs/{id}); proven with real workers."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from core.config import Settings
from tests.helpers.processes import WorkerProcess, wait_for
from workers.runner import backoff_seconds

CONTRACT_FIELDS = {"id", "kind", "state", "attempts", "error", "created_at", "updated_at"}


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "low", "high"),
    [(1, 2.0, 14400.0, 1.0, 2.0), (2, 2.0, 14400.0, 2.0, 4.0), (10, 2.0, 14400.0, 512.0, 1024.0),
     (13, 2.0, 14400.0, 4096.0, 8192.0), (14, 2.0, 14400.0, 7200.0, 14400.0), (40, 2.0, 14400.0, 7200.0, 14400.0),
     (1000, 0.5, 60.0, 30.0, 60.0)],
)  # fmt: skip
def test_backoff_doubles_to_its_cap_with_jitter_in_the_upper_half(attempt, base, cap, low, high):
    draws = [backoff_seconds(attempt, base=base, cap=cap) for _ in range(200)]
    assert all(low <= d <= high for d in draws)
    assert len(set(draws)) > 1  # jittered, not a fixed schedule


def test_default_schedule_rides_out_half_a_day():
    """With the default settings a failing job keeps being retried for at least 12 hours (the shortest
    draw of every wait) before it fails for good."""
    settings = Settings()
    waits = [
        min(settings.job_retry_max_seconds, settings.job_retry_base_seconds * 2 ** (n - 1)) / 2
        for n in range(1, settings.job_max_attempts)
    ]
    assert sum(waits) > 12 * 3600


def _job_of(client, tenant):  # type: ignore[no-untyped-def]
    jobs = client.get("/v1/jobs", params={"kind": "embed"}, headers=tenant.headers()).json()["jobs"]
    return jobs[0]["id"]


def test_a_real_worker_keeps_every_attempt_error_then_fails(stack, client, tenant):
    """A provider that always fails: the job is tried max_attempts times, each error is kept, then it fails."""
    assert client.post("/v1/memories", json={"content": "retried note"}, headers=tenant.headers()).status_code == 201
    job_id = _job_of(client, tenant)
    env = {
        "ENGRAM_EMBEDDING_FAULT_RATE": "1.0",
        "ENGRAM_JOB_MAX_ATTEMPTS": "3",
        "ENGRAM_JOB_RETRY_BASE_SECONDS": "0.2",
        "ENGRAM_JOB_RETRY_MAX_SECONDS": "0.5",
    }
    worker = WorkerProcess(stack, extra_env=env)
    try:
        job = wait_for(
            lambda: (j := client.get(f"/v1/jobs/{job_id}", headers=tenant.headers()).json())["state"] == "failed" and j,
            timeout=60,
        )
    finally:
        worker.stop()
    assert isinstance(job, dict) and CONTRACT_FIELDS <= set(job)
    assert job["attempts"] == 3 and job["next_attempt_at"] is None
    assert [e["attempt"] for e in job["attempt_errors"]] == [1, 2, 3]
    assert all("injected provider failure" in e["error"] for e in job["attempt_errors"])
    assert job["error"].endswith(job["attempt_errors"][-1]["error"])
    times = [datetime.fromisoformat(e["at"]) for e in job["attempt_errors"]]
    assert times == sorted(times)


def test_a_long_backoff_is_shown_as_the_next_attempt_time(stack, client, tenant):
    """With an hour-scale schedule the failed attempt leaves the job queued, its next attempt an hour away."""
    assert client.post("/v1/memories", json={"content": "slow retry"}, headers=tenant.headers()).status_code == 201
    job_id = _job_of(client, tenant)
    env = {"ENGRAM_EMBEDDING_FAULT_RATE": "1.0", "ENGRAM_JOB_RETRY_BASE_SECONDS": "3600"}
    worker = WorkerProcess(stack, extra_env=env)
    try:
        job = wait_for(
            lambda: (j := client.get(f"/v1/jobs/{job_id}", headers=tenant.headers()).json())["attempts"] == 1
            and j["state"] == "queued"
            and j,
            timeout=60,
        )
    finally:
        worker.stop()
    assert isinstance(job, dict) and len(job["attempt_errors"]) == 1
    due = datetime.fromisoformat(job["next_attempt_at"]) - datetime.fromisoformat(job["attempt_errors"][0]["at"])
    assert timedelta(minutes=29) <= due <= timedelta(hours=1, seconds=1)
    # The worker's restart (or any duplicate delivery) before that time does not run it early.
    listed = client.get("/v1/jobs", params={"kind": "embed", "state": "queued"}, headers=tenant.headers()).json()
    assert job_id in [j["id"] for j in listed["jobs"]]


def test_an_attempt_whose_worker_died_is_recorded(tenant):
    """Reconcile re-queues a running job past its lease and keeps that lost attempt among the errors."""
    from sqlalchemy import update

    from core.db import system_session
    from core.jobs.models import Job
    from core.jobs.service import WORKER_LOST, enqueue, jobs_to_redispatch, now

    with system_session() as session:
        job = enqueue(session, tenant_id=tenant.tenant_id, kind="prune", payload={})
        job_id = job.id
    with system_session() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(state="running", attempts=2, updated_at=now() - timedelta(hours=1), attempt_errors=[])
        )
    with system_session() as session:
        requeued = jobs_to_redispatch(session, older_than=timedelta(minutes=5), running_lease=timedelta(minutes=1))
    assert job_id in requeued
    with system_session() as session:
        row = session.get(Job, job_id)
        assert row is not None and row.state == "queued" and row.error == WORKER_LOST
        assert [(e["attempt"], e["error"]) for e in row.attempt_errors] == [(2, WORKER_LOST)]
        assert datetime.fromisoformat(row.attempt_errors[0]["at"]) > now() - timedelta(minutes=5)
        session.execute(update(Job).where(Job.id == job_id).values(state="failed", error="test cleanup"))
