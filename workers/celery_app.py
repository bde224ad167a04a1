"""The Celery application: Redis broker, at-least-once delivery, beat schedule."""

from __future__ import annotations

import sys

from celery import Celery
from celery.signals import setup_logging

from core.config import get_settings
from core.logging import configure_logging
from core.runtime import resolve_redis_url
from core.tracing import configure_tracing


def make_celery() -> Celery:
    settings = get_settings()
    broker = settings.redis_url or resolve_redis_url()
    app = Celery("engram", broker=broker, include=["workers.tasks"])
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # At-least-once: a message is acknowledged only after its task ran, and comes back if the
        # worker process dies mid-task. Handlers are idempotent, so a second run is harmless.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout_seconds,
            "socket_connect_timeout": 2,
            "socket_timeout": 5,
        },
        broker_connection_timeout=2,
        task_default_queue="engram",
        worker_hijack_root_logger=False,
        beat_schedule={
            "reconcile": {
                "task": "engram.reconcile",
                "schedule": settings.reconcile_interval_seconds,
            },
            "prune": {
                "task": "engram.prune",
                "schedule": settings.prune_interval_seconds,
            },
            "meter": {
                "task": "engram.meter",
                "schedule": settings.usage_storage_interval_seconds,
            },
            "webhooks": {
                "task": "engram.webhooks",
                "schedule": settings.webhook_sweep_interval_seconds,
            },
        },
    )
    return app


@setup_logging.connect
def _configure_logging(**_: object) -> None:
    """Celery leaves logging alone when this signal has a receiver: worker and beat log as the API does."""

    configure_logging(process="beat" if "beat" in sys.argv else "worker")


def instrument_celery() -> None:
    """Trace task publishing and execution when tracing is on (the context travels in message headers)."""
    if configure_tracing(service="worker"):
        # Deferred: the Celery instrumentation loads only when tracing is on.
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        instrumentor = CeleryInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument()


app = make_celery()
instrument_celery()
