"""Usage metering (CONTRACT section 9): per tenant and UTC day, durable in PostgreSQL, counted once.

Two ways in, by where the count arises:
- Requests, searches and saves arise in API processes, on the hot path. Each process adds them to an
  in-memory :class:`UsageBuffer` (a dict update under a lock) and a background thread flushes it every
  ``usage_flush_seconds`` in one statement. The flush carries an id that is recorded in ``usage_flushes`` in
  the same transaction: a flush whose commit went unanswered is retried with the same id and counted once.
  A process stopped cleanly flushes on exit; one killed outright loses at most its last interval's counts.
- Embedded texts and provider tokens arise in the embedding transaction (a worker's job, or a
  ``sync_embed`` save): they are added to the day's row in that transaction (:func:`record_embedding`).

The current figures (memories, datasources, storage) are read when asked: ``memories`` is the count the
database keeps on the tenant's row, ``storage_bytes`` what :func:`measure_storage` last found.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from core.config import get_settings
from core.db import system_session
from core.tenancy.rls import tenant_tables

log = logging.getLogger("engram.usage")

DAY_COUNTERS = ("requests", "searches", "saves", "embedded_texts", "embedding_tokens")
# Flushed by API processes; the embedding counters are written in the embedding's own transaction.
_BUFFERED = ("requests", "searches", "saves")


def today() -> date:
    return datetime.now(UTC).date()


_FLUSH = text(
    """
    WITH flush AS (
        INSERT INTO usage_flushes (id) VALUES (:flush_id) ON CONFLICT DO NOTHING RETURNING id
    )
    INSERT INTO tenant_usage (tenant_id, day, requests, searches, saves)
    SELECT r.tenant_id, r.day, r.requests, r.searches, r.saves
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(tenant_id bigint, day date, requests bigint, searches bigint,
                                                       saves bigint)
    WHERE EXISTS (SELECT 1 FROM flush) AND EXISTS (SELECT 1 FROM tenants t WHERE t.id = r.tenant_id)
    ORDER BY r.tenant_id, r.day
    ON CONFLICT (tenant_id, day) DO UPDATE SET
        requests = tenant_usage.requests + excluded.requests,
        searches = tenant_usage.searches + excluded.searches,
        saves = tenant_usage.saves + excluded.saves
    """
)


class UsageBuffer:
    """A process's unflushed counts, by (tenant, day)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._counts: dict[tuple[int, date], list[int]] = {}
        # A flush that failed: retried with the same id (and rows) before anything newer.
        self._pending: tuple[str, list[dict[str, Any]]] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def add(self, tenant_id: int, *, requests: int = 0, searches: int = 0, saves: int = 0) -> None:
        key = (tenant_id, today())
        with self._lock:
            counts = self._counts.get(key)
            if counts is None:
                counts = self._counts[key] = [0, 0, 0]
            counts[0] += requests
            counts[1] += searches
            counts[2] += saves
        if self._thread is None:
            self._start()

    def unflushed(self, tenant_id: int) -> dict[str, int]:
        """This process's counts for the tenant today that are not in the database yet."""
        with self._lock:
            counts = list(self._counts.get((tenant_id, today()), [0, 0, 0]))
        pending = self._pending
        if pending is not None:
            for row in pending[1]:
                if row["tenant_id"] == tenant_id and row["day"] == today().isoformat():
                    counts = [counts[i] + row[name] for i, name in enumerate(_BUFFERED)]
        return dict(zip(_BUFFERED, counts, strict=True))

    def flush(self) -> int:
        """Write the buffered counts (and any failed flush first); returns the rows written."""
        with self._flush_lock:
            written = 0
            if self._pending is not None:
                written += self._write_pending()
                if self._pending is not None:
                    return written
            with self._lock:
                counts, self._counts = self._counts, {}
            rows = [
                {"tenant_id": tenant_id, "day": day.isoformat(), **dict(zip(_BUFFERED, values, strict=True))}
                for (tenant_id, day), values in sorted(counts.items())
                if any(values)
            ]
            if rows:
                self._pending = (uuid.uuid4().hex, rows)
                written += self._write_pending()
            return written

    def _write_pending(self) -> int:
        assert self._pending is not None
        flush_id, rows = self._pending
        try:
            with system_session() as session:
                session.execute(_FLUSH, {"flush_id": flush_id, "rows": json.dumps(rows)})
        except Exception as exc:  # noqa: BLE001 - the database is away: keep the counts, retry with the same id
            log.warning("usage flush failed, kept for the next one: %s", exc)
            return 0
        self._pending = None
        return len(rows)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="engram-usage-flush", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        interval = get_settings().usage_flush_seconds
        while not self._stop.wait(interval):
            self.flush()

    def close(self) -> None:
        """Stop the flushing thread and write what is left (a clean stop loses no count)."""
        self._stop.set()
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - at exit, with the database maybe gone
            log.warning("final usage flush failed: %s", exc)


buffer = UsageBuffer()


_RECORD_EMBEDDING = text(
    """
    INSERT INTO tenant_usage (tenant_id, day, embedded_texts, embedding_tokens)
    VALUES (:tenant, :day, :texts, :tokens)
    ON CONFLICT (tenant_id, day) DO UPDATE SET
        embedded_texts = tenant_usage.embedded_texts + excluded.embedded_texts,
        embedding_tokens = tenant_usage.embedding_tokens + excluded.embedding_tokens
    """
)


def record_embedding(session: Session, *, tenant_id: int, texts: int, tokens: int) -> None:
    """Count texts sent to the embedding provider (and the tokens it reported) in the caller's transaction."""
    if texts or tokens:
        session.execute(_RECORD_EMBEDDING, {"tenant": tenant_id, "day": today(), "texts": texts, "tokens": tokens})


def embedding_allowance(session: Session, *, tenant_id: int) -> tuple[int | None, int]:
    """(embedding_texts_per_day, texts embedded today) for the tenant; the limit is None when unlimited."""
    row = session.execute(
        text(
            "SELECT (t.quotas ->> 'embedding_texts_per_day')::bigint AS quota, coalesce(u.embedded_texts, 0) AS used "
            "FROM tenants t LEFT JOIN tenant_usage u ON u.tenant_id = t.id AND u.day = :day WHERE t.id = :tenant"
        ),
        {"tenant": tenant_id, "day": today()},
    ).one_or_none()
    if row is None:
        return None, 0
    return (None if row.quota is None else int(row.quota)), int(row.used)


def embedding_quota_spent(session: Session) -> set[int]:
    """Tenants (system mode) that used up today's embedding_texts_per_day: embedding waits for tomorrow."""
    return set(
        session.execute(
            text(
                "SELECT t.id FROM tenants t JOIN tenant_usage u ON u.tenant_id = t.id AND u.day = :day "
                "WHERE t.quotas ? 'embedding_texts_per_day' "
                "AND u.embedded_texts >= (t.quotas ->> 'embedding_texts_per_day')::bigint"
            ),
            {"day": today()},
        ).scalars()
    )


def next_day_start() -> datetime:
    return datetime.combine(today() + timedelta(days=1), datetime.min.time(), tzinfo=UTC)


def _zero_day() -> dict[str, int]:
    return dict.fromkeys(DAY_COUNTERS, 0)


# What has the host's other API processes write the counts they have not written yet, before today's counters are
# read (set by the API when it runs routed, api.serve.routed; this process's own are added by the readers below).
_written_elsewhere: Callable[[], object] | None = None


def before_reading_today(write_elsewhere: Callable[[], object] | None) -> None:
    global _written_elsewhere
    _written_elsewhere = write_elsewhere


def _write_elsewhere() -> None:
    if _written_elsewhere is not None:
        _written_elsewhere()


def day_counters(session: Session, *, tenant_ids: Iterable[int], day: date) -> dict[int, dict[str, int]]:
    """Each tenant's counters on ``day`` (zeros where nothing was counted), every process's unflushed included."""
    ids = list(tenant_ids)
    found = {tenant_id: _zero_day() for tenant_id in ids}
    if not ids:
        return found
    if day == today():
        _write_elsewhere()
    rows = session.execute(
        text(
            "SELECT tenant_id, requests, searches, saves, embedded_texts, embedding_tokens FROM tenant_usage "
            "WHERE tenant_id = ANY(:ids) AND day = :day"
        ),
        {"ids": ids, "day": day},
    ).mappings()
    for row in rows:
        found[row["tenant_id"]] = {name: int(row[name]) for name in DAY_COUNTERS}
    if day == today():
        for tenant_id in ids:
            for name, value in buffer.unflushed(tenant_id).items():
                found[tenant_id][name] += value
    return found


def days(session: Session, *, tenant_id: int, first: date, last: date) -> list[dict[str, Any]]:
    """The tenant's counters for every day from ``first`` to ``last`` (inclusive), zeros where none."""
    if last >= today() >= first:
        _write_elsewhere()
    rows = session.execute(
        text(
            "SELECT day, requests, searches, saves, embedded_texts, embedding_tokens FROM tenant_usage "
            "WHERE tenant_id = :tenant AND day BETWEEN :first AND :last"
        ),
        {"tenant": tenant_id, "first": first, "last": last},
    ).mappings()
    by_day = {row["day"]: {name: int(row[name]) for name in DAY_COUNTERS} for row in rows}
    if last >= today() >= first:
        current = by_day.setdefault(today(), _zero_day())
        for name, value in buffer.unflushed(tenant_id).items():
            current[name] += value
    span = (last - first).days + 1
    return [
        {"date": (first + timedelta(days=i)).isoformat(), **by_day.get(first + timedelta(days=i), _zero_day())}
        for i in range(span)
    ]


def current_figures(session: Session, *, tenant_ids: Iterable[int]) -> dict[int, dict[str, int]]:
    """memories, datasources and storage_bytes of each tenant, as kept (no row is counted here)."""
    ids = list(tenant_ids)
    if not ids:
        return {}
    rows = session.execute(
        text(
            "SELECT t.id, t.memory_count, t.storage_bytes, "
            "(SELECT count(*) FROM catalog_datasources d WHERE d.tenant_id = t.id) AS datasources "
            "FROM tenants t WHERE t.id = ANY(:ids)"
        ),
        {"ids": ids},
    ).mappings()
    return {
        row["id"]: {
            "memories": int(row["memory_count"]),
            "datasources": int(row["datasources"]),
            "storage_bytes": int(row["storage_bytes"]),
        }
        for row in rows
    }


def usage_of(session: Session, *, tenant_ids: Iterable[int]) -> dict[int, dict[str, int]]:
    """The usage object of each tenant: its current figures and today's counters."""
    ids = list(tenant_ids)
    current = current_figures(session, tenant_ids=ids)
    counters = day_counters(session, tenant_ids=ids, day=today())
    return {tenant_id: {**current.get(tenant_id, {}), **counters[tenant_id]} for tenant_id in ids}


def _directory_bytes(path: Any) -> int:
    root = Path(path)
    if not root.is_dir():
        return 0
    return sum(entry.stat().st_size for entry in root.rglob("*") if entry.is_file())


def measure_storage(*, max_tenants: int = 200) -> int:
    """Measure what each tenant whose data changed since its last measurement takes now: its rows in every
    tenant table (as PostgreSQL stores them, vectors included) and its full-text index directory when this
    process can see it. Returns the tenants measured (at most ``max_tenants`` a run, least recently first)."""

    with system_session() as session:
        stale = session.execute(
            text(
                "SELECT id, change_seq FROM tenants WHERE state <> 'deleting' AND storage_seq <> change_seq "
                "ORDER BY storage_measured_at NULLS FIRST LIMIT :n"
            ),
            {"n": max_tenants},
        ).all()
        tables = tenant_tables(session.connection())
    index_dir = get_settings().index_dir
    for tenant_id, change_seq in stale:
        with system_session() as session:
            row_bytes = sum(
                int(
                    session.execute(
                        text(f'SELECT coalesce(sum(pg_column_size(x.*)), 0) FROM "{table}" x WHERE x.tenant_id = :t'),
                        {"t": tenant_id},
                    ).scalar_one()
                )
                for table in tables
            )
            total = row_bytes + _directory_bytes(index_dir / f"tenant-{tenant_id}")
            session.execute(
                text(
                    "UPDATE tenants SET storage_bytes = :bytes, storage_seq = :seq, storage_measured_at = now() "
                    "WHERE id = :t"
                ),
                {"bytes": total, "seq": change_seq, "t": tenant_id},
            )
    return len(stale)


def forget_old_flushes(*, older_than: timedelta = timedelta(days=2)) -> int:
    """Flush ids are needed only while a flush may still be retried: keep two days of them."""

    with system_session() as session:
        result = session.execute(text("DELETE FROM usage_flushes WHERE at < now() - :age"), {"age": older_than})
        return int(result.rowcount or 0)  # type: ignore[attr-defined]
