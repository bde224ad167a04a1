"""The JobQueue that core's outbox hands committed job ids to: Celery messages, sent off the request path."""

from __future__ import annotations

import logging
import queue
import threading
import time

from celery import Celery
from sqlalchemy import select

from core.config import get_settings
from core.db import system_session
from core.jobs.batches import Message
from core.jobs.lanes import lane_of, queue_for
from core.jobs.models import Job
from core.tracing import publishing_context

log = logging.getLogger(__name__)
# The generic task (still accepted for messages published before per-kind names existed).
RUN_JOB_TASK = "engram.run_job"
# The message header carrying the enqueuing request's id to the worker's log lines.
REQUEST_ID_HEADER = "engram_request_id"


def job_task_name(kind: str) -> str:
    """One Celery task name per job kind (engram.job.embed, ...), so Flower and the broker tell them apart."""
    return f"engram.job.{kind}"


def _single_messages(job_ids: list[str]) -> list[Message]:
    """One message per job, with its kind (the task name) and stored request context, read in one query."""
    max_docs = get_settings().interactive_max_docs
    with system_session() as session:
        rows = session.execute(select(Job.id, Job.kind, Job.payload).where(Job.id.in_(job_ids))).all()
    found = {
        job_id: (
            kind,
            context if isinstance(context := (payload or {}).get("context"), dict) else None,
            lane_of(kind, payload, interactive_max_docs=max_docs),
        )
        for job_id, kind, payload in rows
    }
    messages = []
    for job_id in job_ids:
        # A row not (yet) visible goes under the generic name; the worker skips it if it never lands.
        kind, context, lane = found.get(job_id, ("", None, "bulk"))
        messages.append(Message(kind=kind, job_ids=(job_id,), context=context, lane=lane))
    return messages


class CeleryJobQueue:
    """Publishes in a background thread so a slow or absent broker never delays a write.

    A message that cannot be published is dropped here on purpose: its job row is still `queued`, and the
    reconciler on beat publishes it again.
    """

    def __init__(self, app: Celery, *, background: bool = True):
        self._app = app
        self._background = background
        self._pending: queue.Queue[list[str]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, job_ids: list[str]) -> None:
        """Publish these jobs, one message each (their kinds and contexts are looked up)."""
        if not self._background:
            self.publish(_single_messages(job_ids))
            return
        self._ensure_thread()
        self._pending.put(job_ids)

    def publish(self, messages: list[Message]) -> None:
        """Publish these messages now: a message of one job carries its id, of several the list of them."""
        with self._app.producer_or_acquire() as producer:
            for message in messages:
                name = job_task_name(message.kind) if message.kind else RUN_JOB_TASK
                request_id = (message.context or {}).get("request_id")
                argument: str | list[str] = message.job_ids[0] if len(message.job_ids) == 1 else list(message.job_ids)
                with publishing_context(message.context):
                    self._app.send_task(
                        name,
                        args=[argument],
                        producer=producer,
                        queue=queue_for(message.lane),
                        retry=False,
                        headers={REQUEST_ID_HEADER: request_id} if request_id else None,
                    )

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="engram-outbox", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            job_ids = self._pending.get()
            try:
                self.publish(_single_messages(job_ids))
            except Exception as exc:
                log.warning("could not publish %d job(s) (%s); reconcile will", len(job_ids), exc)

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until queued publications are attempted (tests, shutdown)."""

        deadline = time.monotonic() + timeout
        while not self._pending.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
