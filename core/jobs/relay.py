"""The outbox relay: hands committed job rows to the queues, fairly across tenants.

Writers (the API) only commit job rows; an AFTER INSERT trigger on `jobs` sends NOTIFY engram_jobs, and so
does every finished job (workers.runner). Every worker process runs a relay, and one of them leads (see
OutboxRelay): it LISTENs and, per lane (core.jobs.lanes), keeps at most a lane's in-flight limit of jobs
published but unfinished over the whole cluster. Whenever a slot frees it claims undispatched rows
**round-robin over tenants** (each tenant's oldest job first, then each one's second, ...), so one tenant's
backlog stays in PostgreSQL, where the next tenant's fresh job can pass it, instead of in a Redis list it
would have to wait through. The jobs table stays the only source of truth: Redis holds no more than the
in-flight few.

Claims are serialised by a transaction-level advisory lock per lane (the in-flight count and the claim must
not interleave between relays: one leads, but a leader that lost its lock may still be in a round, and
``relay_once`` may be called from elsewhere); SKIP LOCKED still keeps a claim from waiting on rows a runner holds. A row
the relay cannot publish (broker down) is released and tried again a second later; a relay killed between
its claim and its publish leaves rows stamped ``dispatched_at``, which reconcile re-queues after
``outbox_redispatch_seconds`` (they count as in flight until then).

Jobs claimed together that may run together (core.jobs.batches) go out as one message. After a round that
published interactive work the relay lets fresh saves gather for ``linger`` seconds before it claims that
lane again: a lone save goes out at once, a stream of them in a few messages a second. Bulk refills never
linger: they follow the finished jobs that free their slots.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg
from sqlalchemy import Connection, TextClause, text

from core.config import get_settings
from core.db import system_connection
from core.jobs.batches import HEAD_COLUMNS, JobHead, Message, plan_messages
from core.jobs.lanes import LANES, Lane, lane_sql
from core.jobs.reindex_gate import WINDOW_USED_SQL, is_reindex_sql, paused_reindex_condition, reindex_budget

log = logging.getLogger(__name__)
CHANNEL = "engram_jobs"
_BATCH = 500
# Advisory lock keys of the claims (one per lane), in a key space of their own.
_CLAIM_LOCK_SPACE = 0x6A6F6273
_CLAIM_LOCK = {"interactive": 1, "bulk": 2}
# The leading relay's session-level lock (OutboxRelay), in the same key space.
_LEADER_LOCK = 0
_TRY_LEAD = "SELECT pg_try_advisory_lock(%s, %s)"
Publish = Callable[[list[Message]], None]

# A job whose message is out (or which runs): it takes a lane's slot. A retry waiting out its backoff
# (dispatched_at in the future) takes none until it is due. One whose message looks lost (dispatched longer
# ago than reconcile's re-dispatch age, :stale_s) or whose worker looks dead (lease lapsed, :lease_s) takes
# none either: reconcile queues it again, and until then it must not hold a slot (nor, without a beat, for
# ever).
IN_FLIGHT = (
    "((state = 'running' AND updated_at > now() - make_interval(secs => :lease_s))"
    " OR (state = 'queued' AND dispatched_at <= now()"
    " AND dispatched_at > now() - make_interval(secs => :stale_s)))"
)


@dataclass(frozen=True)
class RelayLimits:
    """How much of each lane may be in flight, which jobs are interactive, and per-tenant caps by kind."""

    interactive_inflight: int = 200
    bulk_inflight: int = 6
    interactive_max_docs: int = 1
    tenant_kind_caps: dict[str, int] = field(default_factory=lambda: {"ingest": 1, "refresh_samples": 1})
    # Texts the reindex jobs dispatched in the last 10 s may carry (None: unthrottled).
    reindex_budget: int | None = None
    # When a published job's message counts as lost, and a running job's worker as dead (the settings
    # reconcile uses): such jobs hold no slot.
    stale_after_s: float = 30.0
    lease_s: float = 20.0

    @classmethod
    def from_settings(cls) -> RelayLimits:
        s = get_settings()
        return cls(
            reindex_budget=reindex_budget(s.reindex_max_texts_per_second),
            stale_after_s=s.outbox_redispatch_seconds,
            lease_s=s.job_running_lease_seconds,
            interactive_inflight=max(1, s.relay_interactive_inflight),
            bulk_inflight=max(1, s.relay_bulk_inflight),
            interactive_max_docs=s.interactive_max_docs,
            tenant_kind_caps={
                "ingest": max(1, s.tenant_ingest_concurrency),
                "refresh_samples": max(1, s.tenant_refresh_concurrency),
            },
        )

    def inflight(self, lane: Lane) -> int:
        return self.interactive_inflight if lane == "interactive" else self.bulk_inflight


def claimable_tenants_condition(alias: str = "j") -> str:
    """Which tenants' jobs may be claimed at all, as a condition on ``j`` (a ``jobs`` row): system jobs, and
    the jobs of active tenants. A suspended tenant's jobs wait, queued, until it is resumed; an offboarded
    tenant's wait for its purge, which removes them."""
    return (
        f"({alias}.tenant_id IS NULL OR {alias}.tenant_id IN (SELECT t.id FROM tenants AS t WHERE t.state = 'active'))"
    )


def claim_statement(caps: dict[str, int]) -> str:
    """The claim of one lane: up to ``:n`` undispatched jobs, round-robin over tenants.

    ``turn`` ranks each tenant's undispatched jobs by age; the claim takes every tenant's first turn before
    anyone's second; a reindex job waits while its reindex is paused or throttled (core.embeddings.reindex).
    Kinds with a per-tenant cap (ingest, sample refresh) are taken only while the tenant's
    running and published jobs of that kind, plus the ones claimed before them in this round, stay within
    it. The claimed rows come back with what grouping and publishing need (the kind names the task, the
    stored request context its headers) and their turn, which orders the messages.
    """
    capped = ", ".join(f"'{kind}'" for kind in sorted(caps)) or "''"
    cap_of = " ".join(f"WHEN '{kind}' THEN {int(cap)}" for kind, cap in sorted(caps.items()))
    cap_case = f"CASE r.kind {cap_of} END" if caps else "NULL"
    docs = "CASE WHEN jsonb_typeof(j.payload -> 'doc_ids') = 'array' THEN jsonb_array_length(j.payload -> 'doc_ids')"
    return f"""
    WITH ranked AS (
        SELECT j.id, j.tenant_id, j.kind, j.created_at,
               row_number() OVER (PARTITION BY j.tenant_id ORDER BY j.created_at, j.id) AS turn,
               row_number() OVER (PARTITION BY j.tenant_id, j.kind ORDER BY j.created_at, j.id) AS kind_turn,
               {is_reindex_sql("j")} AS reindex, coalesce({docs} END, 1) AS docs
        FROM jobs AS j
        WHERE j.state = 'queued' AND j.dispatched_at IS NULL AND {lane_sql()} = :lane
          AND {claimable_tenants_condition()}
          AND NOT {paused_reindex_condition()}
    ), ordered AS (
        -- The reindex texts claimed before each row in claim order: the throttle's running total.
        SELECT r.*, sum(CASE WHEN r.reindex THEN r.docs ELSE 0 END)
                    OVER (ORDER BY r.turn, r.created_at, r.id) AS reindex_docs
        FROM ranked AS r
    ), busy AS (
        SELECT tenant_id, kind, count(*) AS n FROM jobs
        WHERE kind IN ({capped}) AND {IN_FLIGHT}
        GROUP BY tenant_id, kind
    ), chosen AS (
        SELECT r.id AS chosen_id, r.turn AS chosen_turn FROM ordered AS r
        LEFT JOIN busy AS b ON b.tenant_id IS NOT DISTINCT FROM r.tenant_id AND b.kind = r.kind
        WHERE (r.kind NOT IN ({capped}) OR r.kind_turn + coalesce(b.n, 0) <= {cap_case})
          -- A reindex job starts while the window's budget is not spent before it.
          AND (NOT r.reindex OR CAST(:reindex_budget AS bigint) IS NULL
               OR {WINDOW_USED_SQL} + r.reindex_docs - r.docs < CAST(:reindex_budget AS bigint))
        ORDER BY r.turn, r.created_at, r.id
        LIMIT :n
    ), locked AS (
        SELECT j.id FROM jobs AS j
        WHERE j.id IN (SELECT chosen_id FROM chosen) AND j.state = 'queued' AND j.dispatched_at IS NULL
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs SET dispatched_at = now()
    FROM chosen
    WHERE jobs.id = chosen.chosen_id AND jobs.id IN (SELECT id FROM locked)
    RETURNING {HEAD_COLUMNS}, payload -> 'context', chosen.chosen_turn, created_at
    """


_IN_FLIGHT_COUNT = text(f"SELECT count(*) FROM jobs WHERE {IN_FLIGHT} AND {lane_sql()} = :lane")
_RELEASE = text("UPDATE jobs SET dispatched_at = NULL WHERE id = ANY(:ids) AND state = 'queued'")


# The claim and the in-flight count are the same for every tenant (no tenant id among their parameters), so
# they run on the generic plan of their prepared statement (psycopg prepares a statement on its fifth run on a
# connection) instead of being planned afresh at every round as tenant statements are (core.db): planning
# the claim cost ~0.9 ms of PostgreSQL's CPU a round, ~0.3 ms per request under the load mix
# (pg_stat_statements, `engram bench load`), against ~0.06 ms to run it. Transaction-local, with the lock.
_LOCK_CLAIM = text(
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), pg_advisory_xact_lock(:space, :key)"
)


@functools.lru_cache(maxsize=8)
def _claim_clause(caps: tuple[tuple[str, int], ...]) -> TextClause:
    """The claim statement for these caps, built once (a relay claims many times a second under load)."""
    return text(claim_statement(dict(caps)))


def claim_lane(lane: Lane, *, limits: RelayLimits, most: int = _BATCH) -> list[tuple[JobHead, dict | None, int]]:
    """Claim (commit ``dispatched_at``) up to the lane's free slots, at most ``most``; returns each claimed
    job's head, stored request context and turn, in the order their messages should go out."""
    with system_connection() as connection:
        return claim_in(connection, lane, limits=limits, most=most)


def claim_in(
    connection: Connection, lane: Lane, *, limits: RelayLimits, most: int = _BATCH
) -> list[tuple[JobHead, dict | None, int]]:
    """:func:`claim_lane` in the system transaction of ``connection`` (committed by the caller)."""
    claim = _claim_clause(tuple(sorted(limits.tenant_kind_caps.items())))
    params = {
        "lane": lane,
        "interactive_max_docs": limits.interactive_max_docs,
        "reindex_budget": limits.reindex_budget,
        "stale_s": limits.stale_after_s,
        "lease_s": limits.lease_s,
    }
    connection.execute(_LOCK_CLAIM, {"space": _CLAIM_LOCK_SPACE, "key": _CLAIM_LOCK[lane]})
    busy = int(connection.execute(_IN_FLIGHT_COUNT, params).scalar_one())
    free = min(limits.inflight(lane) - busy, most)
    if free <= 0:
        return []
    rows = connection.execute(claim, {**params, "n": free}).all()
    rows = sorted(rows, key=lambda row: (row[6], row[7]))
    return [(JobHead(*row[:5]), row[5] if isinstance(row[5], dict) else None, int(row[6])) for row in rows]


def relay_once(
    publish: Publish,
    *,
    max_docs: int = 100,
    limits: RelayLimits | None = None,
    lanes: Sequence[Lane] = LANES,
) -> dict[Lane, int]:
    """Claim and publish, per lane, as many undispatched jobs as its free slots allow; returns how many jobs
    each lane published."""
    limits = limits or RelayLimits.from_settings()
    published: dict[Lane, int] = {}
    for lane in lanes:
        while True:
            claimed = claim_lane(lane, limits=limits)
            if not claimed:
                break
            try:
                messages = plan_messages([(head, context) for head, context, _ in claimed], max_docs=max_docs)
                publish([Message(kind=m.kind, job_ids=m.job_ids, context=m.context, lane=lane) for m in messages])
            except Exception:
                with system_connection() as connection:
                    connection.execute(_RELEASE, {"ids": [head.id for head, _, _ in claimed]})
                raise
            published[lane] = published.get(lane, 0) + len(claimed)
            if len(claimed) < _BATCH:
                # Fewer than asked for: the lane has nothing more to claim now, or no free slot left (what is
                # committed or finished meanwhile notifies the next round). Another claim would be a
                # transaction, under the claim lock, that finds nothing.
                break
    return published


class OutboxRelay:
    """A daemon thread running relay_once whenever a job is committed or finished (and every `interval`).

    Rounds start at most every ``spacing`` seconds: under a stream of saves every commit notifies, and a
    round per notification (a claim transaction per lane, in each worker process's relay, in turns under the
    claim lock) cost PostgreSQL and the workers more than the jobs it found; the notifications that arrive
    in between are answered by the next round, which claims every row they announced.

    ``elect``: of the relays of one database (one per worker process, on every replica) only the one holding
    the leader's advisory lock, on its listening connection, runs rounds; the others stand by and try for the
    lock every ``interval``. Two relays' rounds claimed the same rows in turns, each a transaction under the
    claim lock that mostly found nothing left. A leader that stops, dies, loses its connection or fails a
    round (its broker down, say) lets the lock go with its connection, and a standby takes over."""

    def __init__(
        self,
        *,
        dsn: str,
        publish: Publish,
        interval: float = 1.0,
        linger: float = 0.0,
        spacing: float = 0.0,
        max_docs: int = 100,
        limits: RelayLimits | None = None,
        elect: bool = True,
    ):
        self._dsn = dsn
        self._elect = elect
        self._publish = publish
        self._interval = interval
        self._linger = linger
        self._spacing = spacing
        self._max_docs = max_docs
        self._limits = limits
        self._stop = threading.Event()
        self._listener: psycopg.Connection | None = None
        self._leading = self._listening = False
        self._thread = threading.Thread(target=self._run, name="engram-outbox-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            if self._listener is not None:
                self._listener.close()  # (a leader's lock goes with it)

    def leads(self) -> bool:
        """Whether this relay runs rounds now (it holds the leader's lock, or is not elected)."""
        return self._leading

    def _lead(self, listener: psycopg.Connection) -> bool:
        """Whether this relay may run rounds: take the leader's lock if it is free (held by ``listener``'s
        session until it closes)."""
        if not self._leading:
            row = listener.execute(_TRY_LEAD, (_CLAIM_LOCK_SPACE, _LEADER_LOCK)).fetchone()
            self._leading = bool(row and row[0])
            if self._leading:
                log.info("outbox relay: leading")
        return self._leading

    def _loop(self) -> None:
        interactive_due = 0.0  # monotonic time before which interactive work is left to gather
        next_round = 0.0  # monotonic time before which no round starts (notifications meanwhile are one)
        limits = self._limits or RelayLimits.from_settings()
        while not self._stop.is_set():
            try:
                listener = self._listener
                if listener is None or listener.closed:
                    self._leading, self._listening = not self._elect, False
                    listener = self._listener = psycopg.connect(self._dsn, autocommit=True)
                if not self._lead(listener):
                    self._stop.wait(self._interval)
                    continue
                if not self._listening:
                    listener.execute(f"LISTEN {CHANNEL}")
                    self._listening = True
                if (early := next_round - time.monotonic()) > 0:
                    self._stop.wait(early)
                    for _ in listener.notifies(timeout=0):
                        pass
                next_round = time.monotonic() + self._spacing
                lanes: list[Lane] = ["bulk"]
                if time.monotonic() >= interactive_due:
                    lanes.insert(0, "interactive")
                published = relay_once(self._publish, max_docs=self._max_docs, limits=limits, lanes=lanes)
                if published.get("interactive") and self._linger > 0:
                    interactive_due = time.monotonic() + self._linger
                wait = self._interval
                if interactive_due > time.monotonic():
                    wait = min(wait, interactive_due - time.monotonic())
                # One notification is enough to look again: the claim sees every row the others announced.
                for _ in listener.notifies(timeout=max(wait, 0.0), stop_after=1):
                    pass
                for _ in listener.notifies(timeout=0):
                    pass
            except Exception as exc:  # broker or database down: try again shortly (a standby may lead meanwhile)
                log.warning("outbox relay: %s", exc)
                self._leading = False
                if self._listener is not None:
                    self._listener.close()
                    self._listener = None
                self._stop.wait(self._interval)
