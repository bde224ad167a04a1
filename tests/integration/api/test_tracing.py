"""A save is one trace from the API request to the worker's embed job, across the outbox relay.

The job is published by the relay (as in production: after commit, from another thread with no request in
it), so the trace can only continue through what the job row kept. Spans go to the SDK's in-memory exporter;
the Celery worker runs in this process (Celery's test worker) on the suite's real Redis.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from core.tracing import configure_tracing, flush_traces, stop_tracing, tracing_enabled
from tests.helpers.processes import wait_for


@pytest.fixture
def exporter(stack) -> Iterator[InMemorySpanExporter]:  # type: ignore[no-untyped-def]
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    spans = InMemorySpanExporter()
    assert configure_tracing(service="test", exporter=spans)
    from workers.celery_app import instrument_celery

    instrument_celery()
    try:
        yield spans
    finally:
        CeleryInstrumentor().uninstrument()
        stop_tracing()
        spans.clear()


def test_tracing_is_off_without_an_endpoint(stack, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert not tracing_enabled()
    assert configure_tracing(service="test") is False
    assert not tracing_enabled()


def test_a_save_is_one_trace_spanning_api_and_worker(client, tenant, exporter):
    from celery.contrib.testing.worker import start_worker

    import workers.tasks  # noqa: F401 - registers the tasks (and sets a job queue, replaced below)
    from core.db import system_session
    from core.jobs.models import Job
    from core.jobs.relay import relay_once
    from core.jobs.service import get_job_queue, set_job_queue
    from workers.celery_app import app as celery_app
    from workers.queue import CeleryJobQueue

    previous = get_job_queue()
    set_job_queue(None)  # nothing publishes at commit: the relay does, as in production
    try:
        from core.jobs.lanes import QUEUES

        # Both lanes' queues: a single save's embed job travels in the interactive one.
        queues = ",".join(QUEUES.values())
        with start_worker(celery_app, pool="solo", perform_ping_check=False, shutdown_timeout=30, queues=queues):
            response = client.post(
                "/v1/memories",
                json={"content": "traces follow the save into its embed job"},
                headers={**tenant.headers(), "X-Request-ID": "trace-me-1"},
            )
            assert response.status_code == 201, response.text
            with system_session() as session:
                job = session.query(Job).filter(Job.tenant_id == tenant.tenant_id, Job.kind == "embed").one()
                job_id, context = job.id, job.payload["context"]
            assert context["request_id"] == "trace-me-1" and context["traceparent"]
            relay_once(CeleryJobQueue(celery_app, background=False).publish)

            def finished() -> bool:
                with system_session() as session:
                    return session.get(Job, job_id).state == "succeeded"  # type: ignore[union-attr]

            wait_for(finished, timeout=60)
    finally:
        set_job_queue(previous)
    flush_traces()
    spans = exporter.get_finished_spans()
    server = [s for s in spans if s.kind == SpanKind.SERVER and "/v1/memories" in s.name]
    assert len(server) == 1, [s.name for s in spans]
    trace_id = server[0].context.trace_id
    # (The relay also publishes jobs earlier tests left queued: each of those is its own request's trace.)
    consumer = [
        s
        for s in spans
        if s.kind == SpanKind.CONSUMER and "engram.job.embed" in s.name and s.context.trace_id == trace_id
    ]
    assert len(consumer) == 1, [(s.name, s.context.trace_id) for s in spans if s.kind == SpanKind.CONSUMER]
    publish = [s for s in spans if s.kind == SpanKind.PRODUCER and s.context.trace_id == trace_id]
    assert len(publish) == 1 and consumer[0].parent.span_id == publish[0].context.span_id
    # The job's own SQL runs inside the task's span, in the request's trace.
    task_span_ids = {s.context.span_id for s in consumer}
    job_sql = [s for s in spans if s.kind == SpanKind.CLIENT and s.parent and s.parent.span_id in task_span_ids]
    assert job_sql and {s.context.trace_id for s in job_sql} == {trace_id}
    # The request's own statements (the save) are in it too.
    assert any(
        s.kind == SpanKind.CLIENT and s.context.trace_id == trace_id and s.attributes.get("db.operation.name") == "WITH"
        for s in spans
    )


def test_an_engram_endpoint_exports_over_otlp_http(monkeypatch):
    from core.tracing import _otlp_exporter

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert _otlp_exporter("") is None
    exporter = _otlp_exporter("http://collector:4318/")
    assert exporter._endpoint == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318")
    assert _otlp_exporter("")._endpoint == "http://otel:4318/v1/traces"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert _otlp_exporter("http://collector:4318") is None


def test_each_job_kind_has_its_own_task_name_and_the_old_name_still_runs(stack):
    from core.jobs.models import JOB_KINDS
    from core.jobs.service import get_job_queue, set_job_queue

    previous = get_job_queue()
    try:
        import workers.tasks  # noqa: F401 - registers the tasks
        from workers.celery_app import app
        from workers.queue import job_task_name
    finally:
        set_job_queue(previous)
    for kind in JOB_KINDS:
        assert job_task_name(kind) == f"engram.job.{kind}" and job_task_name(kind) in app.tasks
    assert "engram.run_job" in app.tasks
