"""The JobQueue that core's outbox hands committed job ids to: Celery messages, sent off the request path."""

from __future__ import annotations

import logging
import queue
import threading

from celery import Celery

log = logging.getLogger(__name__)
RUN_JOB_TASK = "engram.run_job"


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
        if not self._background:
            self._publish(job_ids)
            return
        self._ensure_thread()
        self._pending.put(job_ids)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="engram-outbox", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            job_ids = self._pending.get()
            try:
                self._publish(job_ids)
            except Exception as exc:
                log.warning("could not publish %d job(s) (%s); reconcile will", len(job_ids), exc)

    def _publish(self, job_ids: list[str]) -> None:
        with self._app.producer_or_acquire() as producer:
            for job_id in job_ids:
                self._app.send_task(RUN_JOB_TASK, args=[job_id], producer=producer, retry=False)

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until queued publications are attempted (tests, shutdown)."""
        import time

        deadline = time.monotonic() + timeout
        while not self._pending.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
