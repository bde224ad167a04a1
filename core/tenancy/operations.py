"""Operating tenants (CONTRACT section 9): provision, list, suspend and resume, set quotas, offboard.

These run for the operator, across tenants, in the named system mode. A change that other API replicas
must apply at once (a suspension, new quotas, an offboarding) is announced with ``NOTIFY engram_tenants``
in the same transaction, so it reaches them when it commits (api.tenant_events drops their cached keys,
and for an offboarding the tenant's cached search state and index directory).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from core.audit.service import Actor, record_many, record_operator
from core.errors import Invalid, NotFound
from core.jobs.service import enqueue
from core.tenancy.models import ApiKey, Tenant
from core.tenancy.quotas import default_quotas, full_quotas, stored_form, validate_quotas
from core.tenancy.service import IssuedKey, create_tenant
from core.tenancy.usage import usage_of

CHANNEL = "engram_tenants"
STATES = ("active", "suspended")
MAX_PAGE = 200


@dataclass(frozen=True)
class Provisioned:
    tenant: Tenant
    key: IssuedKey


def announce(session: Session, *, tenant_id: int, event: str) -> None:
    """Tell every API process, when this transaction commits, that the tenant's state, quotas or keys moved."""
    session.execute(
        text("SELECT pg_notify(:channel, :payload)"),
        {"channel": CHANNEL, "payload": json.dumps({"tenant_id": tenant_id, "event": event})},
    )


def provision(session: Session, *, name: str, quotas: Any = None, admin_user: str = "admin@localhost") -> Provisioned:
    """A new tenant with its first admin key; quotas it does not name take the deployment's defaults."""
    chosen = default_quotas()
    if quotas is not None:
        chosen.update(validate_quotas(quotas))
    key = create_tenant(session, name=name, admin_user=admin_user)
    tenant = session.scalars(select(Tenant).where(Tenant.name == name)).one()
    tenant.quotas = stored_form(chosen)
    session.flush()
    return Provisioned(tenant=tenant, key=key)


def live_tenant(session: Session, *, name: str, lock: bool = False) -> Tenant:
    """The tenant called ``name`` that is not being offboarded; 404 otherwise."""
    statement = select(Tenant).where(Tenant.name == name, Tenant.state != "deleting")
    if lock:
        statement = statement.with_for_update()
    tenant = session.scalars(statement).one_or_none()
    if tenant is None:
        raise NotFound(f"tenant {name!r} not found")
    return tenant


def tenant_view(tenant: Tenant, *, usage: dict[str, int]) -> dict[str, Any]:
    return {
        "tenant": tenant.name,
        "state": tenant.state,
        "quotas": full_quotas(tenant.quotas),
        "usage": usage,
        "created_at": tenant.created_at.isoformat() if tenant.created_at else None,
    }


def tenant_quotas(session: Session, *, tenant_id: int) -> dict[str, int | None]:
    stored = session.execute(select(Tenant.quotas).where(Tenant.id == tenant_id)).scalar_one_or_none()
    return full_quotas(stored)


def describe(session: Session, *, name: str) -> dict[str, Any]:
    tenant = live_tenant(session, name=name)
    return tenant_view(tenant, usage=usage_of(session, tenant_ids=[tenant.id])[tenant.id])


def _cursor_after(cursor: str | None) -> tuple[str, int] | None:
    if not cursor:
        return None
    try:
        name, tenant_id = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        return str(name), int(tenant_id)
    except (ValueError, TypeError, UnicodeError):
        raise Invalid("cursor is not one this API handed out", field="cursor") from None


def _cursor_of(tenant: Tenant) -> str:
    return base64.urlsafe_b64encode(json.dumps([tenant.name, tenant.id]).encode()).decode("ascii")


def list_tenants(
    session: Session, *, limit: int = 50, cursor: str | None = None, state: str | None = None, prefix: str | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """Tenants by name, a page at a time, with their usage; ``prefix`` finds names starting with it."""
    if not 1 <= limit <= MAX_PAGE:
        raise Invalid(f"limit must be between 1 and {MAX_PAGE}", field="limit")
    if state is not None and state not in STATES:
        raise Invalid(f"state must be one of {', '.join(STATES)}", field="state")
    statement = select(Tenant).where(Tenant.state != "deleting")
    if state is not None:
        statement = statement.where(Tenant.state == state)
    if prefix:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        statement = statement.where(Tenant.name.like(escaped + "%", escape="\\"))
    after = _cursor_after(cursor)
    if after is not None:
        statement = statement.where(func.row(Tenant.name, Tenant.id) > func.row(*after))
    tenants = list(session.scalars(statement.order_by(Tenant.name, Tenant.id).limit(limit + 1)))
    more = len(tenants) > limit
    tenants = tenants[:limit]
    usage = usage_of(session, tenant_ids=[t.id for t in tenants])
    page = [tenant_view(t, usage=usage[t.id]) for t in tenants]
    return page, (_cursor_of(tenants[-1]) if more and tenants else None)


def count_tenants(session: Session) -> dict[str, int]:
    """How many tenants are in each state (offboarding ones included)."""
    return {state: int(n) for state, n in session.execute(select(Tenant.state, func.count()).group_by(Tenant.state))}


def update_tenant(session: Session, *, name: str, state: Any = None, quotas: Any = None) -> tuple[Tenant, list[str]]:
    """Suspend or resume a tenant and/or change its quotas (the ones named; null: unlimited).
    Returns the tenant and what changed (``suspended``, ``resumed``, ``quotas``)."""
    if state is not None and state not in STATES:
        raise Invalid(f"state must be one of {', '.join(STATES)}", field="state")
    checked = validate_quotas(quotas) if quotas is not None else None
    tenant = live_tenant(session, name=name, lock=True)
    changes: list[str] = []
    if state is not None and state != tenant.state:
        tenant.state = state
        changes.append("suspended" if state == "suspended" else "resumed")
    if checked:
        merged = {**full_quotas(tenant.quotas), **checked}
        if stored_form(merged) != dict(tenant.quotas or {}):
            tenant.quotas = stored_form(merged)
            changes.append("quotas")
    if changes:
        announce(session, tenant_id=tenant.id, event=",".join(changes))
        _record_operator_action(session, tenant=tenant, name=name, actions=[f"tenant.{c}" for c in changes])
    session.flush()
    return tenant, changes


def _record_operator_action(session: Session, *, tenant: Tenant, name: str, actions: list[str]) -> None:
    """In the tenant's audit log (it sees what the operator did to it) and in the operator's own trail."""

    operator = Actor(tenant_id=tenant.id, user="operator")
    record_many(session, caller_or_actor=operator, entries=[(action, f"tenant:{name}") for action in actions])
    for action in actions:
        detail = {"quotas": dict(tenant.quotas or {})} if action == "tenant.quotas" else {}
        record_operator(session, action=action, tenant_name=name, actor="operator", detail=detail)


def offboard(session: Session, *, name: str, requested_by: str = "operator") -> tuple[Tenant, str]:
    """Start offboarding: revoke every key at once, free the name (a new tenant may take it at once), and
    queue the purge job that removes every row of the tenant. Returns the tenant and the job's id."""
    tenant = live_tenant(session, name=name, lock=True)
    session.execute(
        update(ApiKey).where(ApiKey.tenant_id == tenant.id, ApiKey.revoked_at.is_(None)).values(revoked_at=func.now())
    )
    tenant.state = "deleting"
    # The name is free at once: the row that is being purged goes by a name no tenant can be given.
    tenant.name = f"~offboarded~{tenant.id}"
    # A system job (no tenant_id): the job and its record outlive the tenant they removed.
    job = enqueue(
        session,
        tenant_id=None,
        kind="purge_tenant",
        payload={"tenant_id": tenant.id, "tenant": name, "requested_by": requested_by},
    )
    announce(session, tenant_id=tenant.id, event="deleted")
    # The operator's trail keeps the offboarding (by name); the tenant's own log goes with its purge.

    record_operator(
        session, action="tenant.offboard", tenant_name=name, actor=requested_by, detail={"purge_job_id": job.id}
    )
    session.flush()
    return tenant, job.id
