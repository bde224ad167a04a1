"""Celery tasks: thin wrappers over core.jobs."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

from celery.signals import task_postrun, task_prerun, worker_init, worker_ready

import core.schema  # noqa: F401 - every table known to the ORM
from core.config import get_settings
from core.db import get_engine, system_session
from core.embeddings.factory import embedder_for_settings
from core.embeddings.hnsw import ensure_hnsw_indexes
from core.embeddings.providers import get_embedder
from core.embeddings.reconcile import reconcile_embeddings
from core.heap import settle_heap
from core.jobs.models import JOB_KINDS
from core.jobs.relay import OutboxRelay, RelayLimits
from core.jobs.service import jobs_to_redispatch, set_job_queue
from core.lifecycle.prune import enqueue_prune
from core.native import single_threaded_blas
from core.tenancy.usage import forget_old_flushes, measure_storage
from core.tracing import REQUEST_ID
from core.webhooks.delivery import sweep_due_webhooks
from workers.celery_app import app
from workers.queue import REQUEST_ID_HEADER, RUN_JOB_TASK, CeleryJobQueue, job_task_name
from workers.runner import run_jobs

log = logging.getLogger(__name__)
# Jobs that workers enqueue (split chunks, ingest's sample refresh, reconcile's gaps) are left to the relay
# like every other: publishing them here would put them in the queue past the fair claim (core.jobs.relay).
set_job_queue(None)


def single_threaded_native_pools() -> None:
    """Keep numpy's BLAS and the tokenizer to the calling thread in a worker (core.native): a worker runs
    several jobs at once next to the database and often the API on few cores, where the libraries' own
    pools only compete with them. An explicit TOKENIZERS_PARALLELISM / OPENBLAS_NUM_THREADS wins."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # read by tokenizers at each batch
    single_threaded_blas()


@worker_init.connect
def warm_embedding_path(**_: object) -> None:
    """Load the configured embedding model and the embed job's modules before the worker says it is ready,
    so the first job does not pay for them (the static model takes ~0.4 s to load, the full MiniLM ~8 s).
    Prefork children inherit them. A model that cannot load is only logged: its jobs fail and retry as they
    would anyway.

    Then the heap is settled as the API's is (core.heap): what is loaded so far is moved out of the garbage
    collector's sight, and the young generation is collected less often."""
    single_threaded_native_pools()
    try:
        embedder_for_settings().warm()
    except Exception as exc:
        log.warning("could not load the embedding model at start: %s", exc)
    settle_heap()


@worker_ready.connect
def start_outbox_relay(**_: object) -> None:
    """Publish the job rows writers commit (the API never talks to the broker on a write)."""
    dsn = get_engine().url.render_as_string(hide_password=False).replace("postgresql+psycopg://", "postgresql://")
    settings = get_settings()
    OutboxRelay(
        dsn=dsn,
        publish=CeleryJobQueue(app, background=False).publish,
        linger=settings.outbox_linger_seconds,
        spacing=settings.outbox_relay_spacing_seconds,
        max_docs=max(1, settings.embed_job_max_docs),
        limits=RelayLimits.from_settings(),
    ).start()


@task_prerun.connect
def _enter_request_context(task: Any = None, **_: object) -> None:
    """Log lines of a job (Celery's own included) carry the id of the request that enqueued it."""
    REQUEST_ID.set(task.request.get(REQUEST_ID_HEADER) if task is not None else None)


@task_postrun.connect
def _leave_request_context(**_: object) -> None:
    REQUEST_ID.set(None)


def _run_job(task: Any, job_ids: str | list[str]) -> str:
    """Run the job (or the jobs, when the relay batched them) a message carries."""
    settings = get_settings()
    outcomes = run_jobs(
        [job_ids] if isinstance(job_ids, str) else list(job_ids),
        session_factory=system_session,
        max_attempts=settings.job_max_attempts,
        running_lease=timedelta(seconds=settings.job_running_lease_seconds),
        retry_base_seconds=settings.job_retry_base_seconds,
        retry_max_seconds=settings.job_retry_max_seconds,
    )
    # A short wait rides on a delayed message; a long one (hours) is left to reconcile, which dispatches the
    # job when its retry is due (dispatched_at): the broker would redeliver a message held that long anyway.
    # The retried message carries every job again; those that finished meanwhile are skipped.
    waits = [outcome.retry_in for outcome in outcomes.values() if outcome.state == "retry"]
    if waits and min(waits) < settings.broker_visibility_timeout_seconds / 2:
        raise task.retry(countdown=min(waits))
    states = sorted({outcome.state for outcome in outcomes.values()})
    return ",".join(states)


_JOB_TASK_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "max_retries": None,
}
# One task per job kind; every one runs the job row it is given (the kind only names the message).
JOB_TASKS = {kind: app.task(name=job_task_name(kind), **_JOB_TASK_OPTIONS)(_run_job) for kind in JOB_KINDS}
# Messages published under the generic name before per-kind names existed still run.
run_job_task = app.task(name=RUN_JOB_TASK, **_JOB_TASK_OPTIONS)(_run_job)


@app.task(name="engram.reconcile", acks_late=True)
def reconcile_task() -> int:
    settings = get_settings()
    with system_session() as session:
        job_ids = jobs_to_redispatch(
            session,
            older_than=timedelta(seconds=settings.outbox_redispatch_seconds),
            running_lease=timedelta(seconds=settings.job_running_lease_seconds),
        )
    if job_ids:
        log.info("reconcile re-dispatched %d job(s)", len(job_ids))

    gaps = reconcile_embeddings(model=get_embedder(settings.embedding_model).name)
    if gaps:
        log.info("reconcile queued embeddings for %d doc(s) in %d tenant(s)", sum(gaps.values()), len(gaps))

    built = ensure_hnsw_indexes(threshold=settings.dense_exact_max_docs)
    if built:
        log.info("reconcile built HNSW indexes for %s dimensions", built)
    return len(job_ids) + sum(gaps.values())


@app.task(name="engram.prune", acks_late=True)
def prune_task() -> str | None:
    """Queue a lifecycle pass as a `prune` job, so it is retried, listed and shown like any other job."""
    with system_session() as session:
        job = enqueue_prune(session)
        return job.id if job is not None else None


@app.task(name="engram.meter", acks_late=True)
def meter_task() -> int:
    """Measure the storage of tenants whose data changed (usage's storage_bytes), and forget old flush ids."""
    measured = measure_storage()
    forget_old_flushes()
    return measured


@app.task(name="engram.webhooks", acks_late=True)
def webhooks_task() -> int:
    """Queue delivery jobs for webhooks whose next attempt is due (retries after a backoff, lost jobs)."""
    with system_session() as session:
        return sweep_due_webhooks(session)
