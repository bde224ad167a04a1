"""Webhook registrations and events.

:func:`emit_many` is the outbox: in the transaction of the change, one statement writes a delivery row for
every enabled webhook of the tenant subscribed to each event, and one `webhook` job per webhook touched (the
relay hands it to the workers, core.webhooks.delivery) unless one not yet handed over is waiting: it will
deliver this event too, since a job delivers whatever is due when it runs (a stream of saves shares jobs;
the sweep catches the rare event a job just missed). A rolled-back change writes neither. A tenant without
webhooks pays one short statement that writes nothing.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import TextClause, delete, select, text
from sqlalchemy.orm import Session

from core.crypto import encrypt_secret
from core.errors import BadRequest, Invalid, NotFound
from core.jobs.models import Job
from core.jobs.service import outbox_add
from core.tracing import job_context
from core.webhooks.models import EVENT_TYPES, Webhook, WebhookDelivery
from core.webhooks.urls import check_webhook_url

MAX_WEBHOOKS_PER_TENANT = 50
MAX_DESCRIPTION_CHARS = 1_000

# Above this many events, emit_many first asks which types the tenant's enabled webhooks listen to.
_PRECHECK_OVER = 20
_SUBSCRIBED = text("SELECT DISTINCT unnest(events) FROM webhooks WHERE tenant_id = :tenant AND state = 'enabled'")
# The events of a statement: `ev` with columns type, data (jsonb) and n (their order); here from a parameter.
_EVENTS_PARAM = """
    ev AS (
        SELECT e.pair ->> 0 AS type, CAST(e.pair -> 1 AS jsonb) AS data, e.n
        FROM json_array_elements(CAST(:events AS json)) WITH ORDINALITY AS e(pair, n)
    )"""
_DELIVERIES = """
    hooks AS (
        SELECT id, events FROM webhooks WHERE tenant_id = :tenant AND state = 'enabled'
    ), made AS (
        INSERT INTO webhook_deliveries (tenant_id, id, webhook_id, event_type, data)
        SELECT :tenant,
               'msg_' || lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000000)::bigint), 14, '0')
                      || substr(md5(random()::text || ev.n::text), 1, 16),
               hooks.id, ev.type, ev.data
        FROM ev JOIN hooks ON ev.type = ANY(hooks.events)
        ORDER BY hooks.id, ev.n
        RETURNING webhook_id
    )
"""
_EMIT_CTES = f"{_EVENTS_PARAM}, {_DELIVERIES}"
_EMIT_JOBS = """
    INSERT INTO jobs (id, tenant_id, kind, state, payload, attempts, attempt_errors, created_at, updated_at)
    SELECT replace(gen_random_uuid()::text, '-', ''), :tenant, 'webhook', 'queued',
           jsonb_build_object('webhook_id', touched.webhook_id) || CAST(:extra AS jsonb), 0, '[]', now(), now()
    FROM (SELECT DISTINCT webhook_id FROM made) AS touched
    WHERE NOT EXISTS (
        SELECT 1 FROM jobs j WHERE j.tenant_id = :tenant AND j.kind = 'webhook' AND j.state = 'queued'
        AND j.dispatched_at IS NULL AND j.payload ->> 'webhook_id' = touched.webhook_id
    )
    RETURNING id
"""
_EMIT = text(f"WITH {_EMIT_CTES} {_EMIT_JOBS}")


@dataclass(frozen=True)
class Companion:
    """Other work of the same write (its audit entries) run inside the event statement: one round trip."""

    ctes: str  # "name AS (...), ...", put before the event CTEs
    statement: str  # the same work alone, when there is no event to write
    params: dict[str, Any]  # shares :tenant with the events


@lru_cache(maxsize=16)
def _emit_with(ctes: str) -> TextClause:
    return text(f"WITH {ctes}, {_EMIT_CTES} {_EMIT_JOBS}")


def events_ctes(source: str) -> str:
    """CTEs writing the events of ``source`` inside another statement of the same write, when the events are
    only known there (a save's memory ids, reserved by the statement itself): ``source`` is a SELECT with
    columns type, data (jsonb) and n (their order), of types from EVENT_TYPES. Nothing is built for a tenant
    without an enabled webhook subscribed to them. The CTE ``webhook_jobs`` returns the ids of the jobs queued
    (the caller adds them to the session's outbox, as :func:`emit_many` does). Parameters: `:tenant` and
    `:extra` (:func:`event_params`)."""
    return f"ev AS ({source}), {_DELIVERIES}, webhook_jobs AS ({_EMIT_JOBS})"


def subscribed(event_type: str) -> str:
    """An SQL condition: the tenant (`:tenant`) has an enabled webhook subscribed to ``event_type`` (one of
    EVENT_TYPES), read in the statement's snapshot as :func:`events_ctes` reads them. A statement that writes
    events only when this holds may leave the events out (they would reach no one)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {event_type!r}")
    return (
        "EXISTS (SELECT 1 FROM webhooks AS w WHERE w.tenant_id = :tenant AND w.state = 'enabled'"
        f" AND '{event_type}' = ANY(w.events))"
    )


def event_params() -> dict[str, Any]:
    """The parameters of :func:`events_ctes` besides `:tenant`: the trace context the jobs carry."""
    context = job_context()
    return {"extra": json.dumps({"context": context} if context else {})}


def emit(session: Session, *, tenant_id: int, type: str, data: dict[str, Any]) -> None:  # noqa: A002 - the event's name
    """One event of the tenant, delivered to its subscribed webhooks if the session commits."""
    emit_many(session, tenant_id=tenant_id, events=[(type, data)])


def emit_many(
    session: Session,
    *,
    tenant_id: int,
    events: Sequence[tuple[str, dict[str, Any]]],
    companion: Companion | None = None,
) -> None:
    """Events ``(type, data)`` of one tenant, in one statement (a 1,000-item batch included).

    `companion` is other work of the same write (its audit entries), run as part of the same statement: it
    costs no round trip of its own.
    """
    if companion is not None and not events:
        session.execute(text(companion.statement), companion.params)
        return
    if not events:
        return
    _check_types(events)
    if len(events) > _PRECHECK_OVER:
        # A bulk write: ask first which types anyone listens to (most tenants: none), so the events nobody
        # wants are never serialised and sent.
        wanted = set(session.execute(_SUBSCRIBED, {"tenant": tenant_id}).scalars())
        events = [event for event in events if event[0] in wanted]
        if not events:
            if companion is not None:
                session.execute(text(companion.statement), companion.params)
            return
    statement, params = _emit(tenant_id=tenant_id, events=events, companion=companion)
    ids = list(session.execute(statement, params).scalars())
    if ids:
        outbox_add(session, ids)


def emit_statement(
    *, tenant_id: int, events: Sequence[tuple[str, dict[str, Any]]], companion: Companion | None = None
) -> tuple[TextClause, dict[str, Any]]:
    """The statement :func:`emit_many` runs for ``events`` (at least one) and ``companion``, with its
    parameters: for a write that sends it with its other statements (core.sql). Its rows are the ids of the
    webhook jobs it queued, for the session's outbox."""
    _check_types(events)
    return _emit(tenant_id=tenant_id, events=events, companion=companion)


def _emit(
    *, tenant_id: int, events: Sequence[tuple[str, dict[str, Any]]], companion: Companion | None
) -> tuple[TextClause, dict[str, Any]]:
    context = job_context()
    extra = {"context": context} if context else {}
    params = {
        "tenant": tenant_id,
        # One JSON text of [type, data] pairs, not arrays: see core.audit.service on array parameters.
        "events": json.dumps([[event_type, data] for event_type, data in events]),
        "extra": json.dumps(extra),
    }
    if companion is None:
        return _EMIT, params
    return _emit_with(companion.ctes), {**companion.params, **params}


def _check_types(events: Sequence[tuple[str, dict[str, Any]]]) -> None:
    for event_type, _ in events:
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown webhook event type {event_type!r}")


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _events(value: object) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise Invalid(f"events must be a non-empty list of: {', '.join(EVENT_TYPES)}", field="events")
    for i, name in enumerate(value):
        if name not in EVENT_TYPES:
            raise Invalid(f"unknown event {name[:100]!r}; known: {', '.join(EVENT_TYPES)}", field=f"events.{i}")
    return list(dict.fromkeys(value))


def _description(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION_CHARS:
        raise Invalid(
            f"description must be a string of at most {MAX_DESCRIPTION_CHARS} characters", field="description"
        )
    return value


def create_webhook(
    session: Session, *, tenant_id: int, url: object, events: object, description: object, created_by: str | None
) -> tuple[Webhook, str]:
    """A new enabled webhook and its secret (shown to the caller once)."""
    checked_events, checked_description = _events(events), _description(description)
    checked_url = check_webhook_url(url)
    count = len(session.scalars(select(Webhook.id).where(Webhook.tenant_id == tenant_id)).all())
    if count >= MAX_WEBHOOKS_PER_TENANT:
        raise BadRequest(f"a tenant has at most {MAX_WEBHOOKS_PER_TENANT} webhooks")
    secret = new_secret()
    now = datetime.now(UTC)
    webhook = Webhook(
        tenant_id=tenant_id,
        id="wh_" + uuid.uuid4().hex[:24],
        url=checked_url,
        events=checked_events,
        description=checked_description,
        secret_encrypted=encrypt_secret(secret),
        state="enabled",
        created_by=created_by,
        created_at=now,
        updated_at=now,
    )
    session.add(webhook)
    session.flush()
    return webhook, secret


def get_webhook(session: Session, *, webhook_id: str, lock: bool = False) -> Webhook:
    query = select(Webhook).where(Webhook.id == webhook_id)
    webhook = session.scalars(query.with_for_update() if lock else query).first()
    if webhook is None:
        raise NotFound(f"webhook {webhook_id[:100]!r} not found")
    return webhook


def list_webhooks(session: Session) -> list[Webhook]:
    return list(session.scalars(select(Webhook).order_by(Webhook.created_at, Webhook.id)).all())


def update_webhook(session: Session, *, webhook: Webhook, changes: dict[str, Any]) -> tuple[list[str], str | None]:
    """Apply a PATCH; returns the names of what changed and the new secret when one was issued."""
    changed: list[str] = []
    secret = None
    if "url" in changes:
        webhook.url = check_webhook_url(changes["url"])
        changed.append("url")
    if "events" in changes:
        webhook.events = _events(changes["events"])
        changed.append("events")
    if "description" in changes:
        webhook.description = _description(changes["description"])
        changed.append("description")
    if "enabled" in changes:
        enabled = changes["enabled"]
        if not isinstance(enabled, bool):
            raise Invalid("enabled must be true or false", field="enabled")
        webhook.state = "enabled" if enabled else "disabled"
        webhook.disabled_reason = None if enabled else "disabled by an admin"
        if enabled:  # a fresh start: its failures so far no longer count towards disabling it
            webhook.failing_since = webhook.paused_until = None
        changed.append("enabled" if enabled else "disabled")
    rotate = changes.get("rotate_secret", False)
    if not isinstance(rotate, bool):
        raise Invalid("rotate_secret must be true or false", field="rotate_secret")
    if rotate:
        secret = new_secret()
        webhook.secret_encrypted = encrypt_secret(secret)
        changed.append("secret")
    webhook.updated_at = datetime.now(UTC)
    return changed, secret


def delete_webhook(session: Session, *, webhook: Webhook) -> None:
    """The webhook and its deliveries (pending ones are never sent)."""
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook.id))
    session.delete(webhook)


def list_deliveries(
    session: Session, *, webhook_id: str, limit: int, cursor: str | None, state: str | None
) -> tuple[list[WebhookDelivery], str | None]:
    """A webhook's deliveries newest first; the cursor is the last id seen (ids are time-ordered)."""
    query = select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
    if cursor:
        if not _DELIVERY_ID.fullmatch(cursor):
            raise BadRequest("cursor is not one this API returned", field="cursor")
        query = query.where(WebhookDelivery.id < cursor)
    if state:
        query = query.where(WebhookDelivery.state == state)
    rows = list(session.scalars(query.order_by(WebhookDelivery.id.desc()).limit(limit + 1)).all())
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], next_cursor


_DELIVERY_ID = re.compile(r"msg_[0-9a-f]{30}")


def delivery_body(delivery: WebhookDelivery | Any) -> dict[str, Any]:
    """What every attempt of a delivery sends (the same bytes each time, so the same signature input)."""
    return {"type": delivery.event_type, "timestamp": delivery.created_at.isoformat(), "data": delivery.data}


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def webhook_to_dict(webhook: Webhook) -> dict[str, Any]:
    return {
        "id": webhook.id,
        "url": webhook.url,
        "events": list(webhook.events),
        "description": webhook.description,
        "state": webhook.state,
        "disabled_reason": webhook.disabled_reason,
        "failing_since": _iso(webhook.failing_since),
        "created_at": _iso(webhook.created_at),
        "updated_at": _iso(webhook.updated_at),
    }


def delivery_to_dict(delivery: WebhookDelivery) -> dict[str, Any]:
    return {
        "id": delivery.id,
        "type": delivery.event_type,
        "state": delivery.state,
        "attempts": [dict(a) for a in delivery.attempt_log or []],
        "next_attempt_at": _iso(delivery.next_attempt_at) if delivery.state == "pending" else None,
        "created_at": _iso(delivery.created_at),
        "finished_at": _iso(delivery.finished_at),
        "data": delivery.data,
    }


def emit_job_failed(session: Session, *, tenant_id: int, job_id: str, kind: str, error: str) -> None:
    """`job.failed` (and `ingest.failed` for an ingest) when a tenant's job failed for good, in the
    transaction that records the failure. A webhook job's own failure sends nothing (no loop)."""
    if kind == "webhook":
        return
    data = {"job_id": job_id, "kind": kind, "error": error[:2_000]}
    events: list[tuple[str, dict[str, Any]]] = [("job.failed", data)]
    if kind == "ingest":
        payload = session.scalar(select(Job.payload).where(Job.id == job_id)) or {}
        events.append(
            ("ingest.failed", {"job_id": job_id, "datasource": payload.get("datasource"), "error": data["error"]})
        )
    emit_many(session, tenant_id=tenant_id, events=events)
