"""The API's view of the broker: the Celery app it publishes jobs to, and a cheap reachability check."""

from __future__ import annotations

import threading
from functools import lru_cache

import redis

from core.config import get_settings
from core.jobs.service import set_job_queue
from core.runtime import resolve_redis_url
from workers.queue import CeleryJobQueue

_lock = threading.Lock()


@lru_cache(maxsize=1)
def _redis_client() -> redis.Redis:
    url = get_settings().redis_url or resolve_redis_url()
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)


def ping_broker() -> None:
    _redis_client().ping()


def install_job_queue() -> None:
    """Route committed outbox jobs of this process to Celery."""
    # Deferred: importing workers.celery_app builds the Celery app from the broker URL, which raises
    # ServiceNotRunning where none is configured; only processes that publish jobs need it.
    from workers.celery_app import app

    with _lock:
        set_job_queue(CeleryJobQueue(app))
