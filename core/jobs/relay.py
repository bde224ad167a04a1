"""The outbox relay: hands committed job rows to the queue, woken by PostgreSQL notifications.

Writers (the API) only commit job rows; an AFTER INSERT trigger on `jobs` sends NOTIFY engram_jobs. Each
relay (one per worker process) LISTENs, claims undispatched rows with SKIP LOCKED (so two relays never
publish the same row), and publishes them. A row it cannot publish (broker down) is released and tried
again a second later; the write that made it never waited on the broker at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import text

from core.db import system_connection

log = logging.getLogger(__name__)
CHANNEL = "engram_jobs"
_BATCH = 500

# The claimed rows come back with what publishing needs (the kind names the task, the stored request
# context its headers), so a batch costs one statement, not a claim and a lookup.
_CLAIM = text(
    "UPDATE jobs SET dispatched_at = now() WHERE id IN ("
    " SELECT id FROM jobs WHERE state = 'queued' AND dispatched_at IS NULL"
    " ORDER BY created_at LIMIT :n FOR UPDATE SKIP LOCKED) RETURNING id, kind, payload -> 'context'"
)
# job id -> (kind, stored request context)
Routes = dict[str, tuple[str, dict[str, Any] | None]]
_RELEASE = text("UPDATE jobs SET dispatched_at = NULL WHERE id = ANY(:ids) AND state = 'queued'")


def relay_once(publish: Callable[[list[str], Routes], None]) -> int:
    """Claim and publish every undispatched queued job; returns how many were published."""
    total = 0
    while True:
        with system_connection() as connection:
            rows = connection.execute(_CLAIM, {"n": _BATCH}).all()
        if not rows:
            return total
        ids = [row[0] for row in rows]
        routes: Routes = {row[0]: (row[1], row[2] if isinstance(row[2], dict) else None) for row in rows}
        try:
            publish(ids, routes)
        except Exception:
            with system_connection() as connection:
                connection.execute(_RELEASE, {"ids": ids})
            raise
        total += len(ids)


class OutboxRelay:
    """A daemon thread running relay_once whenever a job is committed (and every `interval` seconds)."""

    def __init__(self, *, dsn: str, publish: Callable[[list[str], Routes], None], interval: float = 1.0):
        self._dsn = dsn
        self._publish = publish
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engram-outbox-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        listener: psycopg.Connection | None = None
        while not self._stop.is_set():
            try:
                if listener is None or listener.closed:
                    listener = psycopg.connect(self._dsn, autocommit=True)
                    listener.execute(f"LISTEN {CHANNEL}")
                relay_once(self._publish)
                for _ in listener.notifies(timeout=self._interval, stop_after=1):
                    pass
            except Exception as exc:  # broker or database down: try again shortly
                log.warning("outbox relay: %s", exc)
                if listener is not None:
                    listener.close()
                    listener = None
                self._stop.wait(self._interval)
