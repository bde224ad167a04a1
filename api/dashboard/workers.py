"""Which Celery workers are alive and what each runs, asked over the broker with a short timeout.

A broadcast `inspect active` reaches every worker; each answers with the tasks it is executing, whose first
argument is the job id. The answer is cached for a few seconds and the broadcast waits at most
INSPECT_TIMEOUT_SECONDS, so the page (which polls) never waits long on a slow or absent broker. Workers that
stopped answering stay listed with the age of their last answer until they have been silent for
FORGET_AFTER_SECONDS, which is how an operator sees a worker die.
"""

from __future__ import annotations

import threading
import time
from typing import Any

INSPECT_TIMEOUT_SECONDS = 1.0
CACHE_SECONDS = 5.0
FORGET_AFTER_SECONDS = 600.0

_lock = threading.Lock()
_cache: tuple[float, dict[str, Any]] | None = None
# worker name -> (wall-clock time of its last answer, job ids it was running then)
_last_seen: dict[str, tuple[float, list[str]]] = {}


def _job_ids(tasks: object) -> list[str]:
    ids: list[str] = []
    for task in tasks if isinstance(tasks, list) else []:
        args = task.get("args") if isinstance(task, dict) else None
        if isinstance(args, list | tuple) and args and isinstance(args[0], str):
            ids.append(args[0])
    return ids


def _inspect() -> tuple[dict[str, list[str]] | None, str | None]:
    """{worker: [job ids]} from the workers that answered, or (None, why) when the broker is unreachable."""
    try:
        # Deferred: importing workers.celery_app builds the Celery app from the broker URL (raises without
        # one); inside the try, a missing broker is an answer (None, why), not an import error.
        from workers.celery_app import app

        replies = app.control.inspect(timeout=INSPECT_TIMEOUT_SECONDS).active() or {}
    except Exception as exc:  # an unreachable broker is a figure to show, not an error of the page
        return None, f"{type(exc).__name__}: {exc}"[:300]
    return {str(name): _job_ids(tasks) for name, tasks in replies.items()}, None


def workers() -> dict[str, Any]:
    """{"workers": [{"name", "alive", "last_seen_age_seconds", "job_ids"}], "broker_error"}."""
    global _cache
    with _lock:
        if _cache is not None and _cache[0] > time.monotonic():
            return _cache[1]
        answered, error = _inspect()
        current = time.time()
        for name, job_ids in (answered or {}).items():
            _last_seen[name] = (current, job_ids)
        for name in [n for n, (seen, _) in _last_seen.items() if current - seen > FORGET_AFTER_SECONDS]:
            del _last_seen[name]
        body = {
            "workers": [
                {
                    "name": name,
                    "alive": answered is not None and name in answered,
                    "last_seen_age_seconds": round(current - seen, 1),
                    "job_ids": job_ids,
                }
                for name, (seen, job_ids) in sorted(_last_seen.items())
            ],
            "broker_error": error,
        }
        _cache = (time.monotonic() + CACHE_SECONDS, body)
        return body


def forget() -> None:
    """Drop the cache and the remembered workers (tests)."""
    global _cache
    with _lock:
        _cache = None
        _last_seen.clear()
