"""The outbox relay: hands committed job rows to the queue, woken by PostgreSQL notifications.

Writers (the API) only commit job rows; an AFTER INSERT trigger on `jobs` sends NOTIFY engram_jobs. Each
relay (one per worker process) LISTENs, claims undispatched rows with SKIP LOCKED (so two relays never
publish the same row), and publishes them. A row it cannot publish (broker down) is released and tried
again a second later; the write that made it never waited on the broker at all.

Jobs claimed together that may run together (core.jobs.batches) go out as one message. While writes keep
coming, the relay lets them gather for ``linger`` seconds after each round that published something: a
lone save is published at once, a stream of them in a few messages a second instead of one per save.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from sqlalchemy import text

from core.db import system_connection
from core.jobs.batches import HEAD_COLUMNS, JobHead, Message, plan_messages

log = logging.getLogger(__name__)
CHANNEL = "engram_jobs"
_BATCH = 500

# The claimed rows come back with what grouping and publishing need (the kind names the task, the stored
# request context its headers), so a round costs one statement.
_CLAIM = text(
    "UPDATE jobs SET dispatched_at = now() WHERE id IN ("
    " SELECT id FROM jobs WHERE state = 'queued' AND dispatched_at IS NULL"
    f" ORDER BY created_at LIMIT :n FOR UPDATE SKIP LOCKED) RETURNING {HEAD_COLUMNS}, payload -> 'context', created_at"
)
_RELEASE = text("UPDATE jobs SET dispatched_at = NULL WHERE id = ANY(:ids) AND state = 'queued'")
Publish = Callable[[list[Message]], None]


def relay_once(publish: Publish, *, max_docs: int = 100) -> int:
    """Claim and publish every undispatched queued job; returns how many jobs were published."""
    total = 0
    while True:
        with system_connection() as connection:
            rows = connection.execute(_CLAIM, {"n": _BATCH}).all()
        if not rows:
            return total
        rows = sorted(rows, key=lambda row: row[6])
        heads = [(JobHead(*row[:5]), row[5] if isinstance(row[5], dict) else None) for row in rows]
        try:
            publish(plan_messages(heads, max_docs=max_docs))
        except Exception:
            with system_connection() as connection:
                connection.execute(_RELEASE, {"ids": [row[0] for row in rows]})
            raise
        total += len(rows)


class OutboxRelay:
    """A daemon thread running relay_once whenever a job is committed (and every `interval` seconds)."""

    def __init__(self, *, dsn: str, publish: Publish, interval: float = 1.0, linger: float = 0.0, max_docs: int = 100):
        self._dsn = dsn
        self._publish = publish
        self._interval = interval
        self._linger = linger
        self._max_docs = max_docs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engram-outbox-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        listener: psycopg.Connection | None = None
        while not self._stop.is_set():
            try:
                if listener is None or listener.closed:
                    listener = psycopg.connect(self._dsn, autocommit=True)
                    listener.execute(f"LISTEN {CHANNEL}")
                published = relay_once(self._publish, max_docs=self._max_docs)
                if published and self._linger > 0:
                    # Writes are coming: let the next ones gather, then claim them together (the
                    # notifications they sent meanwhile are read and dropped: the claim sees their rows).
                    self._stop.wait(self._linger)
                    for _ in listener.notifies(timeout=0):
                        pass
                    continue
                for _ in listener.notifies(timeout=self._interval, stop_after=1):
                    pass
            except Exception as exc:  # broker or database down: try again shortly
                log.warning("outbox relay: %s", exc)
                if listener is not None:
                    listener.close()
                    listener = None
                self._stop.wait(self._interval)
