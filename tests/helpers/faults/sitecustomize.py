"""Loaded by every Python process started with this directory first on PYTHONPATH (a test's workers).

With ENGRAM_TEST_CONSUMER_CRASH_MARKER set, the Celery consumer of the first worker process to start raises
at start-up, as kombu's restore of unacknowledged messages did when Redis went away: an exception escaping
the worker's blueprint, which Celery logs as "Unrecoverable error" and ends the worker with. The marker
file makes it happen once: the worker started after it runs normally.
"""

from __future__ import annotations

import os

_marker = os.environ.get("ENGRAM_TEST_CONSUMER_CRASH_MARKER")

if _marker:
    from celery.worker.consumer.consumer import Consumer

    _start = Consumer.start

    def _crash_once(self):  # type: ignore[no-untyped-def]
        try:
            fd = os.open(_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return _start(self)
        os.close(fd)
        raise AttributeError("'NoneType' object has no attribute 'hostname'")

    Consumer.start = _crash_once  # type: ignore[method-assign]

if os.environ.get("ENGRAM_TEST_BEAT_CRASH"):
    from celery.beat import Service

    def _crash(self, embedded_process=False):  # type: ignore[no-untyped-def]
        raise ConnectionError("the scheduler lost its broker for good")

    Service.start = _crash  # type: ignore[method-assign]
