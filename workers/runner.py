"""Running jobs: claim their rows, call the handler of their kind, record the outcome and the retry schedule.

The runner sits above the domains: it reads the handler tables of workers.handlers, which name each
kind's function explicitly. Domains only add job rows (core.jobs.service.enqueue) and never import the
runner, so no import leads back from a job's handler to the code that runs it.

A message may carry several jobs (the outbox relay puts a tenant's embed jobs that queued together into
one). They are claimed in one statement; jobs that share a batch key (core.jobs.batches) run as one call of
their kind's batch handler in one transaction, every other job alone. Each job keeps its own row, attempts,
lease and history: a batch is only how they travel and run, never what an operator sees. A failed batch
whose jobs would all retry (an outage) waits one backoff together; one that would end a job for good (an
input the provider refuses, a last attempt) runs its jobs again one by one, so each ends by its own run.
"""

from __future__ import annotations

import logging
import random
import threading
import traceback
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import bindparam, literal, select, text, update
from sqlalchemy.dialects.postgresql import JSONB

from core.jobs.batches import HEAD_COLUMNS, JobHead, batch_key
from core.jobs.models import Job
from core.jobs.relay import claimable_tenants_condition
from core.jobs.service import PermanentJobError, now
from core.webhooks.service import emit_job_failed
from workers.handlers import BATCH_HANDLERS, HANDLERS

log = logging.getLogger(__name__)
_ATTEMPT_ERROR_CHARS = 2_000
_ATTEMPT_TRACEBACK_CHARS = 4_000

# Claim every job of the message that may run now, in one statement: queued and due (no retry waiting), or
# running past its lease (its worker died). A job running within its lease, finished, or waiting out a retry
# is left alone, so a duplicate message never runs a job twice at once or inflates its attempts. Row locks
# make a concurrent claim of the same row wait and then see the row this one wrote.
# A job of a suspended (or offboarded) tenant is not started, however its message came (the relay's claim
# skips them; a process publishing its own writes does not look): it is handed back to the relay instead.
_CLAIM = text(
    "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = :now, updated_at = :now"
    " WHERE id = ANY(:ids) AND ("
    "  (state = 'queued' AND (dispatched_at IS NULL OR dispatched_at <= :now))"
    "  OR (state = 'running' AND updated_at <= :lease_cutoff))"
    f" AND {claimable_tenants_condition('jobs')}"
    f" RETURNING {HEAD_COLUMNS}, attempts"
)
_HAND_BACK = text(
    "UPDATE jobs SET dispatched_at = NULL WHERE id = ANY(:ids) AND state = 'queued'"
    f" AND NOT {claimable_tenants_condition('jobs')}"
)
# A finished attempt frees its lane's slot: the relays (core.jobs.relay) are told at commit, so they refill
# the queue at once instead of at their next poll.
_FREED = text("SELECT pg_notify('engram_jobs', 'freed')")
# A batch's jobs succeed together, in one statement (one per job, through the ORM, was most of the statements
# PostgreSQL planned for the workers under a stream of saves).
_SUCCEEDED = text(
    "UPDATE jobs SET state = 'succeeded', result = :result, error = NULL, finished_at = :now, updated_at = :now"
    " WHERE id = ANY(:ids)"
).bindparams(bindparam("result", type_=JSONB))
# A heartbeat renews only the attempts it started (same state and attempt number).
_RENEW = text(
    "UPDATE jobs SET updated_at = :now FROM unnest(CAST(:ids AS text[]), CAST(:attempts AS integer[])) AS a(id, n)"
    " WHERE jobs.id = a.id AND jobs.attempts = a.n AND jobs.state = 'running'"
)


@dataclass(frozen=True)
class RunOutcome:
    state: str  # succeeded | retry | failed | skipped
    attempts: int  # the attempt this run was (0 when skipped)
    error: str | None = None
    retry_in: float = 0.0


@dataclass(frozen=True)
class _Claimed:
    head: JobHead
    attempts: int

    @property
    def id(self) -> str:
        return self.head.id

    @property
    def kind(self) -> str:
        return self.head.kind


def backoff_seconds(attempt: int, *, base: float, cap: float) -> float:
    """The wait before retrying after failed attempt number `attempt` (1-based).

    Exponential: base * 2^(attempt-1), capped at `cap`; with jitter from the upper half of that delay
    ("equal jitter"), so retries of jobs that failed together spread out while each job's waits still grow.
    """
    delay = min(cap, base * 2.0 ** min(max(attempt - 1, 0), 64))
    return random.uniform(delay / 2, delay)


def run_job(
    job_id: str,
    *,
    session_factory: Callable[[], Any],
    max_attempts: int,
    running_lease: timedelta = timedelta(seconds=20),
    retry_base_seconds: float = 2.0,
    retry_max_seconds: float = 4 * 3600.0,
) -> RunOutcome:
    """Run one job once (see :func:`run_jobs`)."""
    return run_jobs(
        [job_id],
        session_factory=session_factory,
        max_attempts=max_attempts,
        running_lease=running_lease,
        retry_base_seconds=retry_base_seconds,
        retry_max_seconds=retry_max_seconds,
    )[job_id]


def run_jobs(
    job_ids: list[str],
    *,
    session_factory: Callable[[], Any],
    max_attempts: int,
    running_lease: timedelta = timedelta(seconds=20),
    retry_base_seconds: float = 2.0,
    retry_max_seconds: float = 4 * 3600.0,
) -> dict[str, RunOutcome]:
    """Run these jobs once: claim the ones that may run, run them (batched where their kind allows), each
    batch in its own transaction, and record every job's outcome. Returns the outcome of every id.

    While a batch runs, a heartbeat renews its jobs' lease (``updated_at``) every quarter of it: jobs whose
    worker died stop renewing, and reconcile dispatches them again once the lease lapses.
    """
    job_ids = list(dict.fromkeys(job_ids))
    with session_factory() as session:
        at = now()
        rows = session.execute(_CLAIM, {"ids": job_ids, "now": at, "lease_cutoff": at - running_lease}).all()
        session.execute(_HAND_BACK, {"ids": job_ids})
    claimed = {row[0]: _Claimed(head=JobHead(*row[:5]), attempts=row[5]) for row in rows}
    policy = _Policy(session_factory, max_attempts, running_lease, retry_base_seconds, retry_max_seconds)
    return {
        **{job_id: RunOutcome(state="skipped", attempts=0) for job_id in job_ids},
        **_run_all(_batches([claimed[job_id] for job_id in job_ids if job_id in claimed]), policy),
    }


@dataclass(frozen=True)
class _Policy:
    """How a run's jobs are run: where their rows are, how long a lease lasts, how failures retry."""

    session_factory: Callable[[], Any]
    max_attempts: int
    running_lease: timedelta
    retry_base_seconds: float
    retry_max_seconds: float


def _run_all(batches: Iterable[list[_Claimed]], policy: _Policy) -> dict[str, RunOutcome]:
    outcomes: dict[str, RunOutcome] = {}
    for batch in batches:
        outcomes.update(_run_batch(batch, policy))
    return outcomes


def _batches(claimed: list[_Claimed]) -> Iterator[list[_Claimed]]:
    """The claimed jobs in the groups that run together: by batch key, else one by one."""
    groups: dict[Hashable, list[_Claimed]] = {}
    for job in claimed:
        key = batch_key(job.head)
        if key is None or job.kind not in BATCH_HANDLERS:
            yield [job]
        else:
            groups.setdefault(key, []).append(job)
    yield from groups.values()


def _run_batch(batch: list[_Claimed], policy: _Policy) -> dict[str, RunOutcome]:
    """Run one batch (jobs of one kind and batch key) in one transaction; record each job's outcome."""
    kind = batch[0].kind
    ids = [job.id for job in batch]
    heartbeat = _heartbeat(
        batch, session_factory=policy.session_factory, every=policy.running_lease.total_seconds() / 4
    )
    try:
        with heartbeat, policy.session_factory() as session:
            jobs = session.scalars(select(Job).where(Job.id.in_(ids))).all()
            if not jobs:  # deleted meanwhile (its tenant was): nothing left to run or record
                return {job_id: RunOutcome(state="skipped", attempts=0) for job_id in ids}
            jobs = sorted(jobs, key=lambda job: ids.index(job.id))
            result = _handle(session, kind, jobs)
            session.flush()  # (what the handler changed of its jobs, a split's payload say, before they finish)
            session.execute(
                _SUCCEEDED,
                {
                    "ids": [job.id for job in jobs],
                    "result": result if len(jobs) == 1 else {**(result or {}), "batch_jobs": len(jobs)},
                    "now": now(),
                },
            )
            session.execute(_FREED)
        return {job.id: RunOutcome(state="succeeded", attempts=job.attempts) for job in batch}
    except Exception as exc:
        if len(batch) > 1 and any(_ends_here(job, exc, policy.max_attempts) for job in batch):
            # A job is failed for good only by its own run: one bad doc (an input the provider refuses) must
            # not end its batch-mates, nor may their last attempt. Each runs again alone, in this attempt.
            log.warning("batch of %d %s jobs failed for good (%s); running them one by one", len(batch), kind, exc)
            return _run_all(([job] for job in batch), policy)
        return _record_failure(batch, exc, policy)


def _handle(session: Any, kind: str, jobs: list[Job]) -> dict[str, Any] | None:
    if len(jobs) > 1:
        return BATCH_HANDLERS[kind](session, jobs)
    fn = HANDLERS.get(kind)
    if fn is None:
        raise LookupError(f"no handler for job kind {kind!r}")
    (job,) = jobs
    return fn(session, job)


def _permanent(exc: Exception) -> bool:
    """An error retrying cannot fix: the job's own input or code, or a provider refusing the request."""
    return isinstance(exc, PermanentJobError | LookupError) or getattr(exc, "retryable", True) is False


def _ends_here(job: _Claimed, exc: Exception, max_attempts: int) -> bool:
    """Whether this failure would fail the job for good (an error retrying cannot fix, or its last attempt)."""
    return _permanent(exc) or job.attempts >= max_attempts


def _record_failure(batch: list[_Claimed], exc: Exception, policy: _Policy) -> dict[str, RunOutcome]:
    """Each job of a failed batch: failed for good (its last attempt, or an error retrying cannot fix), else
    queued again after its backoff. A batch's jobs wait the same backoff (of its furthest attempt), so the
    message that retries them finds them all due."""
    kind = batch[0].kind
    error = f"{type(exc).__name__}: {exc}"
    formatted = traceback.format_exc()
    log.warning("job(s) %s (%s) failed: %s", ", ".join(job.id for job in batch), kind, formatted)
    furthest = max(job.attempts for job in batch)
    retry_in = backoff_seconds(furthest, base=policy.retry_base_seconds, cap=policy.retry_max_seconds)
    outcomes: dict[str, RunOutcome] = {}
    at = now()
    due = at + timedelta(seconds=retry_in)
    with policy.session_factory() as session:
        for job in batch:
            final = _ends_here(job, exc, policy.max_attempts)
            failed = {
                "attempt": job.attempts,
                "error": error[:_ATTEMPT_ERROR_CHARS],
                "at": at.isoformat(),
                # The end of the stack is where it failed; operators read it on the dashboard's job page.
                "traceback": formatted[-_ATTEMPT_TRACEBACK_CHARS:],
            }
            # dispatched_at of a queued job is when its next delivery is due: reconcile leaves it alone
            # until then, and an early duplicate message is skipped.
            # Only this attempt's own row: if the job was re-dispatched meanwhile (lease expired) and another
            # attempt already finished it, a late failure here must not reopen it.
            recorded = session.execute(
                update(Job)
                .where(Job.id == job.id, Job.state == "running", Job.attempts == job.attempts)
                .values(
                    state="failed" if final else "queued",
                    error=error[:10_000],
                    # Every attempt's error, not only the last: an outage's story is in the sequence.
                    attempt_errors=Job.attempt_errors.op("||")(literal([failed], JSONB)),
                    updated_at=at,
                    dispatched_at=None if final else due,
                    finished_at=at if final else None,
                )
            )
            if final and recorded.rowcount == 1 and job.head.tenant_id is not None:  # tell the tenant's webhooks
                emit_job_failed(session, tenant_id=job.head.tenant_id, job_id=job.id, kind=kind, error=error)
            session.execute(_FREED)
            outcomes[job.id] = RunOutcome(
                state="failed" if final else "retry",
                attempts=job.attempts,
                error=error,
                retry_in=0.0 if final else retry_in,
            )
    return outcomes


@contextmanager
def _heartbeat(batch: list[_Claimed], *, session_factory: Callable[[], Any], every: float) -> Iterator[None]:
    """Renew the running attempts' lease every ``every`` seconds from a thread, until the block ends.

    Only these attempts' rows are touched (state running, same attempts), in a short transaction of its own
    that gives up on a row lock after 2 s: the handler's own transaction may hold the rows.
    """
    stop = threading.Event()
    ids = [job.id for job in batch]
    params = {"ids": ids, "attempts": [job.attempts for job in batch]}

    def beat() -> None:
        while not stop.wait(every):
            try:
                with session_factory() as session:
                    session.execute(text("SET LOCAL lock_timeout = '2s'"))
                    session.execute(_RENEW, {**params, "now": now()})
            except Exception:  # a missed beat only shortens the lease; the next one may land
                log.warning("heartbeat of job(s) %s failed", ", ".join(ids), exc_info=True)

    thread = threading.Thread(target=beat, name=f"job-heartbeat-{batch[0].id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
