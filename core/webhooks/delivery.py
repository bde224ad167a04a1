"""Delivering webhook events: the `webhook` job and the sweep that schedules retries.

A `webhook` job delivers the due deliveries of one webhook, oldest first, each signed per Standard Webhooks
(``webhook-id`` is the delivery's id on every attempt, ``webhook-timestamp`` the attempt's time,
``webhook-signature`` from the `standardwebhooks` package). Per webhook one worker at a time: the job takes
a lease on the webhook row, so a second job for it ends at once and the holder delivers what is due. No
transaction stays open while a receiver answers, and every attempt has a timeout.

A failed attempt schedules that delivery again after an exponential backoff with jitter and pauses the
webhook until then (a failing receiver is not hammered with the rest of its queue); after
``webhook_max_attempts`` the delivery is given up. A webhook failing without a success for
``webhook_disable_after_seconds`` is disabled, and an entry in its tenant's audit log says so. Beat's sweep
queues a job for every webhook whose next attempt is due, which is how retries happen (and how a delivery
whose job was lost is found again).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook as Signer

from core.audit.service import Actor, record
from core.config import Settings, get_settings
from core.crypto import decrypt_secret
from core.db import scope_to_tenant
from core.jobs.models import Job
from core.jobs.service import PermanentJobError, enqueue
from core.webhooks.models import WebhookDelivery
from core.webhooks.service import delivery_body
from core.webhooks.urls import WebhookUrlRefused, checked_addresses, pinned_request

_BATCH = 20
# A host with several addresses: the next is tried when one refuses the connection.
_ADDRESSES_TRIED = 3
_ERROR_CHARS = 300

_CLAIM = text(
    "UPDATE webhooks SET delivering_until = now() + make_interval(secs => :lease)"
    " WHERE tenant_id = :tenant AND id = :webhook AND state = 'enabled'"
    " AND (paused_until IS NULL OR paused_until <= now())"
    " AND (delivering_until IS NULL OR delivering_until < now())"
    " RETURNING url, secret_encrypted"
)
_RELEASE = text("UPDATE webhooks SET delivering_until = NULL WHERE tenant_id = :tenant AND id = :webhook")
_SUCCEEDED = text(
    "WITH d AS (UPDATE webhook_deliveries SET state = 'succeeded', attempts = attempts + 1,"
    " attempt_log = attempt_log || CAST(:entry AS jsonb), finished_at = now()"
    " WHERE tenant_id = :tenant AND id = :delivery AND state = 'pending' RETURNING 1)"
    " UPDATE webhooks SET failing_since = NULL, paused_until = NULL,"
    " delivering_until = now() + make_interval(secs => :lease) WHERE tenant_id = :tenant AND id = :webhook"
)
_FAILED = text(
    "WITH d AS (UPDATE webhook_deliveries SET attempts = :attempts, attempt_log = attempt_log || CAST(:entry AS jsonb),"
    " state = CASE WHEN :final THEN 'failed' ELSE 'pending' END,"
    " next_attempt_at = now() + make_interval(secs => :delay),"
    " finished_at = CASE WHEN :final THEN now() END"
    " WHERE tenant_id = :tenant AND id = :delivery AND state = 'pending' RETURNING 1)"
    " UPDATE webhooks SET failing_since = coalesce(failing_since, now()),"
    " paused_until = now() + make_interval(secs => :delay), delivering_until = now() + make_interval(secs => :lease)"
    " WHERE tenant_id = :tenant AND id = :webhook RETURNING now() - failing_since >= make_interval(secs => :disable)"
)
_DISABLE = text(
    "UPDATE webhooks SET state = 'disabled', disabled_reason = :reason, updated_at = now()"
    " WHERE tenant_id = :tenant AND id = :webhook AND state = 'enabled'"
)
# Webhooks with a delivery due, free to deliver to, and no job of their own waiting.
_DUE = text(
    "SELECT DISTINCT d.tenant_id, d.webhook_id FROM webhook_deliveries d"
    " JOIN webhooks w ON w.tenant_id = d.tenant_id AND w.id = d.webhook_id"
    " WHERE d.state = 'pending' AND d.next_attempt_at <= now() AND w.state = 'enabled'"
    " AND (w.paused_until IS NULL OR w.paused_until <= now())"
    " AND (w.delivering_until IS NULL OR w.delivering_until < now())"
    " AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.tenant_id = d.tenant_id AND j.kind = 'webhook'"
    "  AND j.state = 'queued' AND j.payload ->> 'webhook_id' = d.webhook_id)"
    " LIMIT 1000"
)


@dataclass(frozen=True)
class Attempt:
    ok: bool
    status: int | None
    error: str | None
    duration_ms: float

    def log_entry(self, number: int) -> dict[str, Any]:
        return {
            "attempt": number,
            "at": datetime.now(UTC).isoformat(),
            "status": self.status,
            "error": self.error,
            "duration_ms": round(self.duration_ms, 1),
        }


def backoff_seconds(attempt: int, *, base: float, cap: float) -> float:
    """Wait after failed attempt `attempt` (1-based): base * 2^(attempt-1) capped, with equal jitter (a
    random point of the upper half), so deliveries that failed together spread out."""
    delay = min(cap, base * 2.0 ** min(max(attempt - 1, 0), 64))
    return random.uniform(delay / 2, delay)


def _lease_seconds(settings: Settings) -> float:
    """Long enough for one attempt and its bookkeeping; renewed after each attempt."""
    return settings.webhook_timeout_seconds * 2 + 30


def send(http: httpx.Client, *, url: str, signer: Signer, delivery_id: str, body: dict[str, Any]) -> Attempt:
    """One signed POST. The host is resolved and checked again first (a refused address fails the attempt),
    and the connection goes to an address that was checked (the next one when it refuses the connection)."""
    started = time.monotonic()
    try:
        addresses = checked_addresses(url)
    except WebhookUrlRefused as exc:
        return Attempt(ok=False, status=None, error=exc.message[:_ERROR_CHARS], duration_ms=0.0)
    payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    at = datetime.now(UTC)
    headers = {
        "content-type": "application/json",
        "user-agent": "engram-webhooks",
        "webhook-id": delivery_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signer.sign(msg_id=delivery_id, timestamp=at, data=payload),
    }
    error = "no address to connect to"
    for address in addresses[:_ADDRESSES_TRIED]:
        target, pinned_headers, extensions = pinned_request(url, address)
        try:
            # Only the status matters: the body is never read, so a receiver cannot hold a worker streaming it.
            with http.stream(
                "POST", target, content=payload.encode(), headers={**headers, **pinned_headers}, extensions=extensions
            ) as response:
                status = response.status_code
        except httpx.ConnectError as exc:
            error = f"ConnectError: {exc}"[:_ERROR_CHARS]
            continue
        except httpx.TimeoutException:
            return Attempt(ok=False, status=None, error="timed out", duration_ms=(time.monotonic() - started) * 1000)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
            return Attempt(ok=False, status=None, error=error, duration_ms=(time.monotonic() - started) * 1000)
        ok = 200 <= status < 300
        return Attempt(
            ok=ok,
            status=status,
            error=None if ok else f"HTTP {status}",
            duration_ms=(time.monotonic() - started) * 1000,
        )
    return Attempt(ok=False, status=None, error=error, duration_ms=(time.monotonic() - started) * 1000)


def _record(
    session: Session, *, tenant_id: int, webhook_id: str, delivery: Any, attempt: Attempt, settings: Settings
) -> None:
    number = delivery.attempts + 1
    params: dict[str, Any] = {
        "tenant": tenant_id,
        "webhook": webhook_id,
        "delivery": delivery.id,
        "entry": json.dumps([attempt.log_entry(number)]),
        "lease": _lease_seconds(settings),
    }
    if attempt.ok:
        session.execute(_SUCCEEDED, params)
        return
    delay = backoff_seconds(number, base=settings.webhook_retry_base_seconds, cap=settings.webhook_retry_max_seconds)
    overdue = session.scalar(
        _FAILED,
        {
            **params,
            "attempts": number,
            "final": number >= settings.webhook_max_attempts,
            "delay": delay,
            "disable": settings.webhook_disable_after_seconds,
        },
    )
    if overdue:
        hours = settings.webhook_disable_after_seconds / 3600
        reason = f"every delivery attempt failed for {hours:g} h (last: {attempt.error})"
        session.execute(_DISABLE, {"tenant": tenant_id, "webhook": webhook_id, "reason": reason[:1000]})
        system = Actor(tenant_id=tenant_id, user="system")
        record(session, caller_or_actor=system, action="webhook.disabled", target=f"webhook:{webhook_id}")


def deliver_due(session: Session, *, tenant_id: int, webhook_id: str, settings: Settings) -> dict[str, Any]:
    """Deliver the webhook's due deliveries until none is left, one fails, or the job's time is up."""
    lease = _lease_seconds(settings)
    claimed = session.execute(_CLAIM, {"tenant": tenant_id, "webhook": webhook_id, "lease": lease}).first()
    session.commit()
    if claimed is None:
        return {"skipped": "webhook disabled, paused, deleted, or being delivered to by another worker"}
    url, secret_encrypted = claimed
    signer = Signer(decrypt_secret(secret_encrypted))
    delivered = failed = 0
    more = False
    deadline = time.monotonic() + settings.webhook_job_seconds
    try:
        with httpx.Client(
            # No redirects (a 3xx could point past the host checks) and no proxy from the environment.
            timeout=settings.webhook_timeout_seconds,
            follow_redirects=False,
            trust_env=False,
        ) as http:
            while failed == 0:
                due = session.execute(
                    select(
                        WebhookDelivery.id,
                        WebhookDelivery.event_type,
                        WebhookDelivery.created_at,
                        WebhookDelivery.data,
                        WebhookDelivery.attempts,
                    )
                    .where(
                        WebhookDelivery.webhook_id == webhook_id,
                        WebhookDelivery.state == "pending",
                        WebhookDelivery.next_attempt_at <= func.now(),  # the database's clock, as it set them
                    )
                    .order_by(WebhookDelivery.id)
                    .limit(_BATCH)
                ).all()
                session.commit()  # no transaction stays open while a receiver answers
                if not due:
                    break
                for delivery in due:
                    if time.monotonic() > deadline:
                        more = True
                        break
                    attempt = send(http, url=url, signer=signer, delivery_id=delivery.id, body=delivery_body(delivery))
                    _record(
                        session,
                        tenant_id=tenant_id,
                        webhook_id=webhook_id,
                        delivery=delivery,
                        attempt=attempt,
                        settings=settings,
                    )
                    session.commit()
                    if not attempt.ok:
                        failed += 1
                        break
                    delivered += 1
                if more:
                    break
    finally:
        session.execute(_RELEASE, {"tenant": tenant_id, "webhook": webhook_id})
        session.commit()
    if more:  # the rest in a job of its own, so a slow receiver gives its worker slot back now and then
        enqueue(session, tenant_id=tenant_id, kind="webhook", payload={"webhook_id": webhook_id})
    return {"delivered": delivered, "failed_attempts": failed, "continued": more}


def run_webhook_job(session: Session, job: Job) -> dict[str, Any]:
    """The `webhook` job handler (registered in workers.handlers)."""
    webhook_id = job.payload.get("webhook_id")
    if job.tenant_id is None or not isinstance(webhook_id, str):
        raise PermanentJobError("webhook job without a tenant or a webhook_id")
    scope_to_tenant(session, job.tenant_id)
    return deliver_due(session, tenant_id=job.tenant_id, webhook_id=webhook_id, settings=get_settings())


def sweep_due_webhooks(session: Session) -> int:
    """Queue a `webhook` job for every webhook with a delivery due (retries, lost jobs); `session` is in
    system mode. Returns how many were queued."""
    rows = session.execute(_DUE).all()
    for tenant_id, webhook_id in rows:
        enqueue(session, tenant_id=tenant_id, kind="webhook", payload={"webhook_id": webhook_id})
    return len(rows)


_PRUNE = text(
    "DELETE FROM webhook_deliveries WHERE state <> 'pending' AND finished_at < now() - make_interval(secs => :age)"
)


def prune_deliveries(session: Session, *, retention_days: float) -> int:
    """Remove finished deliveries older than the retention (the prune job; `session` in system mode)."""
    result: Any = session.execute(_PRUNE, {"age": retention_days * 86400.0})
    return int(result.rowcount or 0)
