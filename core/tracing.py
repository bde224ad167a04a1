"""OpenTelemetry traces: on when an OTLP endpoint is configured, and then spanning API, database and jobs.

Off (the default), nothing here installs a provider, so OpenTelemetry's no-op API is all that runs: FastAPI's
native request tracing stays disabled, no SQL listener is attached, and the helpers below return at once.

On, FastAPI traces each request by itself (it uses the global provider), ``_instrument_sqlalchemy`` adds a
client span per SQL statement (core.sql one per round trip of the statements it sends on the driver's
connection), and the workers instrument Celery (workers.celery_app). A request's trace
continues into the jobs it causes although they are dispatched later, by a relay in another process: the
request's context (W3C ``traceparent`` and the request id) is stored on each job row (``job_context``), and
whoever publishes the job re-enters that context (``publishing_context``) so Celery's instrumentation puts it
in the message headers and the worker's task span joins the request's trace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from sqlalchemy import event
from sqlalchemy.engine import Engine

from core.config import get_settings

# The request a log line or a job belongs to (set per API request and per job; core.logging logs it).
REQUEST_ID: ContextVar[str | None] = ContextVar("engram_request_id", default=None)
_provider: Any = None  # the SDK TracerProvider once configured; the SDK is imported only then
_sql_listeners: list[tuple[str, Any]] = []


def current_request_id() -> str | None:
    return REQUEST_ID.get()


def tracing_enabled() -> bool:
    return _provider is not None


def _otlp_exporter(endpoint_setting: str) -> Any:
    """An OTLP/HTTP exporter when an endpoint is configured (engram's setting first, then OTEL_*), else None."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true" or os.environ.get("OTEL_TRACES_EXPORTER") == "none":
        return None
    from_env = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint_setting and not from_env:
        return None
    # Deferred: the exporter (protobuf, requests) loads only when an endpoint is configured; off, the start
    # path of every process imports OpenTelemetry's no-op API alone.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint_setting:
        base = endpoint_setting.rstrip("/")
        return OTLPSpanExporter(endpoint=base if base.endswith("/v1/traces") else f"{base}/v1/traces")
    return OTLPSpanExporter()  # reads the OTEL_EXPORTER_OTLP_* variables itself


def configure_tracing(*, service: str, exporter: Any = None) -> bool:
    """Install the process's tracer provider if an endpoint is configured (or ``exporter`` is given, as tests
    do with the SDK's in-memory exporter); returns whether tracing is on. A later call only adds ``exporter``."""
    global _provider

    if _provider is not None:
        if exporter is not None:
            # Deferred: the SDK loads only once tracing is on (see the module docstring).
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor

            _provider.add_span_processor(SimpleSpanProcessor(exporter))
        return True
    otlp = None if exporter is not None else _otlp_exporter(get_settings().otlp_endpoint)
    if exporter is None and otlp is None:
        return False
    # Deferred: the SDK loads only once tracing is on (see the module docstring).
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or f"engram-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    # Tests look at spans as they end; a real exporter gets them in batches off the request path.
    processor = SimpleSpanProcessor(exporter) if exporter is not None else BatchSpanProcessor(otlp)  # type: ignore[arg-type]
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _instrument_sqlalchemy()
    _provider = provider
    return True


def stop_tracing() -> None:
    """Export what is left and stop tracing in this process (the SQL listener detached; spans no longer kept).
    OpenTelemetry's global provider cannot be replaced, so tracing cannot be switched on again afterwards."""
    global _provider
    if _provider is None:
        return

    for name, listener in _sql_listeners:
        event.remove(Engine, name, listener)
    _sql_listeners.clear()
    _provider.shutdown()
    _provider = None


def flush_traces() -> None:
    """Export what is buffered (a process about to exit, a test about to look)."""
    if _provider is not None:
        _provider.force_flush()


def current_trace_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the active span, for log lines; None while tracing is off or outside a span."""
    if _provider is None:
        return None
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return trace.format_trace_id(span_context.trace_id), trace.format_span_id(span_context.span_id)


def job_context() -> dict[str, str]:
    """What a job row keeps of the request that enqueued it: its request id and, while tracing, its trace."""
    carrier: dict[str, str] = {}
    request_id = current_request_id()
    if request_id is not None:
        carrier["request_id"] = request_id
    if _provider is not None:
        propagate.inject(carrier)
    return carrier


@contextmanager
def publishing_context(carrier: dict[str, Any] | None) -> Iterator[None]:
    """Make a job's stored trace current while its message is published (no-op while tracing is off)."""
    if _provider is None or not carrier or "traceparent" not in carrier:
        yield
        return
    token = otel_context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


def _instrument_sqlalchemy() -> None:
    """A client span per SQL statement, child of whatever span is current (request, job)."""

    tracer = trace.get_tracer("engram.sqlalchemy")

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if context is None:
            return
        operation = statement.split(None, 1)[0].upper() if statement.strip() else "SQL"
        context._engram_span = tracer.start_span(
            operation,
            kind=trace.SpanKind.CLIENT,
            attributes={
                "db.system.name": conn.dialect.name,
                "db.operation.name": operation,
                # The statement with its placeholders, never the bound values.
                "db.query.text": statement[:2000],
            },
        )

    def after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        span = getattr(context, "_engram_span", None)
        if span is not None:
            span.end()
            context._engram_span = None

    def failed(exception_context: Any) -> None:
        span = getattr(exception_context.execution_context, "_engram_span", None)
        if span is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exception_context.original_exception).__name__))
            span.end()
            exception_context.execution_context._engram_span = None

    listeners = (("before_cursor_execute", before), ("after_cursor_execute", after), ("handle_error", failed))
    for name, listener in listeners:
        event.listen(Engine, name, listener)
        _sql_listeners.append((name, listener))
