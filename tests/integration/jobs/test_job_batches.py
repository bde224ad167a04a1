"""Jobs that travel and run together: the relay's messages, the runner's batches, and a real worker running
one message of several jobs. Each job keeps its own row, attempts and outcome."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import event, select, text

from core.embeddings.providers import Embedder, EmbeddingProviderError
from tests.helpers.processes import wait_for


def _head(kind: str = "embed", tenant: int | None = 1, model: str | None = None, docs: int | None = 1):  # type: ignore[no-untyped-def]
    from core.jobs.batches import JobHead

    return JobHead(id=uuid.uuid4().hex, kind=kind, tenant_id=tenant, model=model, docs=docs)


@pytest.mark.parametrize(
    ("heads", "expected"),
    [
        # A tenant's one-doc embed jobs share a message.
        ([_head(), _head(), _head()], [[0, 1, 2]]),
        # Tenants and models never mix (one scope, one embedder per batch).
        ([_head(tenant=1), _head(tenant=2), _head(tenant=1)], [[0, 2], [1]]),
        ([_head(model="a"), _head(model="b"), _head(model="a")], [[0, 2], [1]]),
        # At most max_docs (10 here) docs a message: the next job opens a new one.
        ([_head(docs=6), _head(docs=4), _head(docs=1)], [[0, 1], [2]]),
        # A job as big as the limit travels alone (it splits itself when it runs).
        ([_head(docs=10), _head(docs=1)], [[0], [1]]),
        # Other kinds, and embed jobs without a tenant or a doc list, each go alone.
        ([_head(kind="ingest", docs=None), _head(kind="ingest", docs=None)], [[0], [1]]),
        ([_head(tenant=None), _head(tenant=None)], [[0], [1]]),
        ([_head(docs=None), _head(docs=None)], [[0], [1]]),
    ],
)
def test_plan_messages_groups_what_may_run_together(heads, expected):  # type: ignore[no-untyped-def]
    """Rule: embed jobs of one tenant and model share a message up to the doc limit of one embed job;
    everything else is a message of its own; messages keep the order of their first job."""
    from core.jobs.batches import plan_messages

    contexts = [{"request_id": f"r{n}"} for n in range(len(heads))]
    messages = plan_messages(zip(heads, contexts, strict=True), max_docs=10)
    assert [[heads.index(next(h for h in heads if h.id == i)) for i in m.job_ids] for m in messages] == expected
    # The message carries its first job's request context.
    assert [m.context for m in messages] == [contexts[group[0]] for group in expected]


def _save(client, tenant, contents):  # type: ignore[no-untyped-def]
    ids = []
    for content in contents:
        response = client.post("/v1/memories", json={"content": content}, headers=tenant.headers())
        assert response.status_code == 201, response.text
        ids.append(response.json()["memory_id"])
    return ids


def _embed_jobs(tenant_id: int) -> list[str]:
    from core.db import system_session
    from core.jobs.models import Job

    with system_session() as session:
        return list(
            session.scalars(
                select(Job.id).where(Job.tenant_id == tenant_id, Job.kind == "embed").order_by(Job.created_at)
            ).all()
        )


def _embedded(tenant_id: int) -> set[str]:
    from core.db import system_connection

    with system_connection() as connection:
        rows = connection.execute(text("SELECT canonical_id FROM embeddings WHERE tenant_id = :t"), {"t": tenant_id})
        return {row[0] for row in rows}


def test_a_tenants_jobs_run_as_one_batch_and_each_keeps_its_outcome(client, tenant, stack):
    """Five saves' embed jobs run as one batch: one handler call embeds all five docs, and every job is
    succeeded with its own attempt and the batch's result."""
    from core.db import get_engine, system_session
    from core.jobs.models import Job
    from workers.runner import run_jobs

    memory_ids = _save(client, tenant, [f"the {t} table is refreshed nightly" for t in ("a", "b", "c", "d", "e")])
    job_ids = _embed_jobs(tenant.tenant_id)
    assert len(job_ids) == 5
    updates: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().startswith("UPDATE jobs"):
            updates.extend([statement] * (len(parameters) if executemany else 1))

    event.listen(get_engine(), "before_cursor_execute", count)
    try:
        outcomes = run_jobs(job_ids, session_factory=system_session, max_attempts=3)
    finally:
        event.remove(get_engine(), "before_cursor_execute", count)
    # The claim, the hand-back of a suspended tenant's jobs, and the batch's completion: one statement each.
    assert len(updates) == 3, updates
    assert {job_id: (o.state, o.attempts) for job_id, o in outcomes.items()} == {j: ("succeeded", 1) for j in job_ids}
    with system_session() as session:
        jobs = session.scalars(select(Job).where(Job.id.in_(job_ids))).all()
        assert {job.state for job in jobs} == {"succeeded"}
        assert all(job.result == {"embedded": 5, "unchanged": 0, "batch_jobs": 5} for job in jobs)
        assert all(job.attempts == 1 and job.finished_at is not None for job in jobs)
    assert _embedded(tenant.tenant_id) >= {f"memory:{m}" for m in memory_ids}
    # Delivered again (at least once): every job is skipped, nothing runs twice.
    again = run_jobs(job_ids, session_factory=system_session, max_attempts=3)
    assert {o.state for o in again.values()} == {"skipped"}


def test_a_batch_claims_only_the_jobs_that_may_run_now(client, tenant, stack):
    """A message's jobs that finished, run within their lease, or wait out a retry are skipped; the others
    run (a job past its lease, whose worker died, among them)."""
    from core.db import system_session
    from core.jobs.models import Job
    from core.jobs.service import now
    from workers.runner import run_jobs

    _save(client, tenant, [f"note {n} about the orders feed" for n in range(5)])
    done, running, waiting, abandoned, fresh = _embed_jobs(tenant.tenant_id)
    with system_session() as session:
        session.get(Job, done).state = "succeeded"
        row = session.get(Job, running)
        row.state, row.attempts, row.updated_at = "running", 1, now()
        row = session.get(Job, waiting)
        row.attempts, row.dispatched_at = 1, now() + timedelta(minutes=5)
        row = session.get(Job, abandoned)
        row.state, row.attempts, row.updated_at = "running", 1, now() - timedelta(minutes=5)
    outcomes = run_jobs(
        [done, running, waiting, abandoned, fresh],
        session_factory=system_session,
        max_attempts=3,
        running_lease=timedelta(seconds=20),
    )
    assert {job_id: o.state for job_id, o in outcomes.items()} == {
        done: "skipped",
        running: "skipped",
        waiting: "skipped",
        abandoned: "succeeded",
        fresh: "succeeded",
    }
    assert outcomes[abandoned].attempts == 2 and outcomes[fresh].attempts == 1
    with system_session() as session:
        assert session.get(Job, running).state == "running" and session.get(Job, waiting).state == "queued"
        assert session.get(Job, abandoned).result == {"embedded": 2, "unchanged": 0, "batch_jobs": 2}


def test_a_failed_batch_records_the_attempt_on_every_job(client, tenant, stack, monkeypatch):
    """A provider failure fails the batch's one call: each job records the attempt and waits the same
    backoff (so the retried message finds them all due); nothing is embedded."""
    from core.config import reset_settings_cache
    from core.db import system_session
    from core.jobs.models import Job
    from workers.runner import run_jobs

    _save(client, tenant, ["the refunds table lags by a day", "the carts table is append only"])
    job_ids = _embed_jobs(tenant.tenant_id)
    monkeypatch.setenv("ENGRAM_EMBEDDING_FAULT_RATE", "1")
    reset_settings_cache()
    try:
        outcomes = run_jobs(job_ids, session_factory=system_session, max_attempts=3)
    finally:
        monkeypatch.delenv("ENGRAM_EMBEDDING_FAULT_RATE")
        reset_settings_cache()
    assert {o.state for o in outcomes.values()} == {"retry"}
    assert len({o.retry_in for o in outcomes.values()}) == 1
    with system_session() as session:
        jobs = session.scalars(select(Job).where(Job.id.in_(job_ids))).all()
        assert {job.state for job in jobs} == {"queued"}
        assert len({job.dispatched_at for job in jobs}) == 1
        assert all(
            [e["attempt"] for e in job.attempt_errors] == [1] and "injected provider failure" in (job.error or "")
            for job in jobs
        )
    assert not _embedded(tenant.tenant_id)


def test_the_relay_gathers_a_stream_of_saves_into_few_messages(client, tenant, stack):
    """A lone save is published at once; saves that follow while the relay lingers go out together."""
    from core.db import get_engine, system_connection
    from core.jobs.batches import Message
    from core.jobs.relay import OutboxRelay

    published: list[Message] = []
    lock = threading.Lock()

    def publish(messages: list[Message]) -> None:
        with lock:
            published.extend(messages)

    dsn = get_engine().url.render_as_string(hide_password=False).replace("postgresql+psycopg://", "postgresql://")
    relay = OutboxRelay(dsn=dsn, publish=publish, linger=1.0, elect=False)  # (beside the stack's leader)
    relay.start()
    try:
        _save(client, tenant, ["the first note of a stream"])
        first = _embed_jobs(tenant.tenant_id)
        wait_for(lambda: any(first[0] in m.job_ids for m in published), timeout=30)
        _save(client, tenant, [f"note {n} of the stream" for n in range(5)])
        rest = [j for j in _embed_jobs(tenant.tenant_id) if j not in first]
        wait_for(lambda: all(any(j in m.job_ids for m in published) for j in rest), timeout=30)
    finally:
        relay.stop()
        relay.join(timeout=10)
        # This relay also claimed whatever earlier tests left queued: release those for the real relays.
        mine = set(_embed_jobs(tenant.tenant_id))
        others = [j for m in published for j in m.job_ids if j not in mine]
        if others:
            with system_connection() as connection:
                connection.execute(
                    text("UPDATE jobs SET dispatched_at = NULL WHERE id = ANY(:ids) AND state = 'queued'"),
                    {"ids": others},
                )
    ours = [m for m in published if set(m.job_ids) & mine]
    assert [m.job_ids for m in ours][0] == tuple(first)
    # The five that came while the relay lingered: in at most two messages (the linger may end among them).
    assert 1 <= len(ours[1:]) <= 2 and sorted(j for m in ours[1:] for j in m.job_ids) == sorted(rest)
    assert all(m.kind == "embed" for m in ours)

class _RefusingProvider(Embedder):
    """A provider that refuses any text naming ``marker`` as a bad request (as a hosted model refuses an input
    over its context length), and embeds everything else with the configured model."""

    def __init__(self, inner: Embedder, *, marker: str, retryable: bool) -> None:
        super().__init__()
        self.inner, self.name, self.marker, self.retryable = inner, inner.name, marker, retryable

    @property
    def dims(self) -> int:
        return self.inner.dims

    def embed_documents(self, texts):  # type: ignore[no-untyped-def]
        if any(self.marker in text for text in texts):
            raise EmbeddingProviderError("BadRequestError: input too long for the model", retryable=self.retryable)
        return self.inner.embed_documents(texts)


@pytest.mark.parametrize(
    ("retryable", "max_attempts"),
    [(False, 3), (True, 1)],
    ids=["an-input-the-provider-refuses", "a-last-attempt"],
)
def test_a_batch_failing_for_good_ends_only_the_job_that_failed(
    client, tenant, stack, monkeypatch, retryable, max_attempts
):  # type: ignore[no-untyped-def]
    """Three saves' jobs run as one batch and the provider refuses one doc: the failure would end a job for
    good (an error retrying cannot fix, or its last attempt), so the jobs run again one by one in the same
    attempt; the refused one fails alone, its batch-mates are embedded and succeed."""
    import core.embeddings.factory as factory
    from core.db import system_session
    from core.jobs.models import Job
    from workers.runner import run_jobs

    configured = factory.embedder_for_settings
    monkeypatch.setattr(
        factory,
        "embedder_for_settings",
        lambda model=None: _RefusingProvider(configured(model), marker="REFUSED", retryable=retryable),
    )
    ok_a, refused, ok_b = _save(
        client, tenant, ["the orders table is fine", "a REFUSED note far too long", "the refunds table is fine"]
    )
    job_ids = _embed_jobs(tenant.tenant_id)
    assert len(job_ids) == 3
    outcomes = run_jobs(job_ids, session_factory=system_session, max_attempts=max_attempts)
    with system_session() as session:
        jobs = {job.payload["doc_ids"][0]: job for job in session.scalars(select(Job).where(Job.id.in_(job_ids)))}
        states = {doc: (job.state, job.attempts) for doc, job in jobs.items()}
        refused_job = jobs[f"memory:{refused}"]
        assert "input too long" in (refused_job.error or "") and jobs[f"memory:{ok_a}"].error is None
    assert states == {
        f"memory:{ok_a}": ("succeeded", 1),
        f"memory:{refused}": ("failed", 1),
        f"memory:{ok_b}": ("succeeded", 1),
    }
    assert sorted(o.state for o in outcomes.values()) == ["failed", "succeeded", "succeeded"]
    assert _embedded(tenant.tenant_id) == {f"memory:{ok_a}", f"memory:{ok_b}"}



# Last in the module: its worker lives until the module ends and runs every message published from then on,
# so the tests above that run jobs in this process would race it.
def test_a_worker_runs_a_message_of_several_jobs(client, tenant, stack, worker):
    """Jobs committed together are claimed together, published as one message, and a real worker runs them
    as one batch."""
    from core.db import system_session
    from core.jobs.models import Job
    from core.jobs.service import enqueue, get_job_queue, set_job_queue

    memory_ids = _save(client, tenant, [f"the {t} feed arrives at noon" for t in ("ads", "crm", "erp")])

    def own_jobs_done() -> bool:
        with system_session() as session:
            states = session.scalars(select(Job.state).where(Job.tenant_id == tenant.tenant_id)).all()
            return bool(states) and set(states) == {"succeeded"}

    wait_for(own_jobs_done, timeout=60)
    # Stale vectors: the same docs embedded again by three jobs committed in one transaction.
    from core.db import system_connection

    with system_connection() as connection:
        connection.execute(text("DELETE FROM embeddings WHERE tenant_id = :t"), {"t": tenant.tenant_id})
    previous = get_job_queue()
    set_job_queue(None)  # nothing publishes at commit (an earlier module may have set one): the relay does
    try:
        with system_session() as session:
            batch = [
                enqueue(session, tenant_id=tenant.tenant_id, kind="embed", payload={"doc_ids": [f"memory:{m}"]}).id
                for m in memory_ids
            ]
    finally:
        set_job_queue(previous)

    def batch_done():  # type: ignore[no-untyped-def]
        with system_session() as session:
            jobs = session.scalars(select(Job).where(Job.id.in_(batch))).all()
            return jobs if {job.state for job in jobs} == {"succeeded"} else None

    jobs = wait_for(batch_done, timeout=60)
    assert all(job.result == {"embedded": 3, "unchanged": 0, "batch_jobs": 3} for job in jobs)  # type: ignore[union-attr]
    assert _embedded(tenant.tenant_id) == {f"memory:{m}" for m in memory_ids}

