"""Webhooks of the caller's tenant (admin keys): registrations and their deliveries."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from api.auth import require_admin
from api.openapi import WebhookIdPath, operation
from api.schemas import WebhookCreated, WebhookDeleted, WebhookDeliveryPage, WebhookList, WebhookOut, WebhookUpdated
from api.threads import Route
from core.audit.service import record, record_many
from core.db import tenant_session
from core.memories.schemas import parse_model
from core.tenancy.context import Caller
from core.webhooks import service
from core.webhooks.models import EVENT_TYPES

router = APIRouter(prefix="/v1", tags=["webhooks"], route_class=Route)

_EXAMPLE = {"url": "https://hooks.example.com/engram", "events": ["memory.created", "ingest.failed"]}


class CreateWebhookIn(BaseModel):
    """`POST /v1/webhooks`: where to deliver which events."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="an http(s) URL; hosted servers refuse loopback, private and metadata hosts")
    events: list[str] = Field(description=f"any of: {', '.join(EVENT_TYPES)}")
    description: str | None = Field(default=None, description="a note for the tenant's admins")


class PatchWebhookIn(BaseModel):
    """`PATCH /v1/webhooks/{id}`: change the given fields; `rotate_secret` issues a new secret."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(default=None, description="a new URL (checked as at creation)")
    events: list[str] | None = Field(default=None, description="the new list of events")
    description: str | None = Field(default=None, description="a new note")
    enabled: StrictBool | None = Field(default=None, description="false pauses deliveries; true resumes them")
    rotate_secret: StrictBool = Field(default=False, description="issue a new signing secret (shown once)")


@router.post(
    "/webhooks",
    status_code=201,
    **operation(
        summary="Register a webhook",
        body=CreateWebhookIn,
        example=_EXAMPLE,
        response=WebhookCreated,
        status=201,
        errors=(400, 403, 415),
    ),
)
def create_webhook(body: Any = Body(default=None), caller: Caller = Depends(require_admin)) -> JSONResponse:
    """Deliveries of the listed events start with the next change. The answer carries the signing `secret`
    (Standard Webhooks), shown only here: receivers verify `webhook-signature` with it."""
    parsed: CreateWebhookIn = parse_model(CreateWebhookIn, body)
    with tenant_session(caller.tenant_id) as session:
        webhook, secret = service.create_webhook(
            session,
            tenant_id=caller.tenant_id,
            url=parsed.url,
            events=parsed.events,
            description=parsed.description,
            created_by=caller.user,
        )
        record(session, caller_or_actor=caller, action="webhook.create", target=f"webhook:{webhook.id}")
        out = {**service.webhook_to_dict(webhook), "secret": secret}
    return JSONResponse(out, status_code=201)


@router.get("/webhooks", **operation(summary="List webhooks", response=WebhookList, errors=(403,)))
def list_webhooks(caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """The tenant's webhooks (never their secrets), oldest first."""
    with tenant_session(caller.tenant_id) as session:
        return {"webhooks": [service.webhook_to_dict(w) for w in service.list_webhooks(session)]}


@router.get("/webhooks/{webhook_id}", **operation(summary="Get a webhook", response=WebhookOut, errors=(403, 404)))
def get_webhook(webhook_id: WebhookIdPath, caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """One webhook: its URL, events and state (`disabled` after failing for too long, with the reason)."""
    with tenant_session(caller.tenant_id) as session:
        return service.webhook_to_dict(service.get_webhook(session, webhook_id=webhook_id))


@router.patch(
    "/webhooks/{webhook_id}",
    **operation(
        summary="Change a webhook or rotate its secret",
        body=PatchWebhookIn,
        example={"events": ["memory.created"], "rotate_secret": True},
        response=WebhookUpdated,
        errors=(403, 404, 415),
    ),
)
def patch_webhook(
    webhook_id: WebhookIdPath, body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> dict[str, Any]:
    """Change the given fields. `rotate_secret: true` issues a new secret, returned once in `secret`;
    `enabled: true` resumes a disabled webhook (its pending deliveries go out again)."""
    parsed: PatchWebhookIn = parse_model(PatchWebhookIn, body)
    changes = parsed.model_dump(exclude_unset=True)
    with tenant_session(caller.tenant_id) as session:
        webhook = service.get_webhook(session, webhook_id=webhook_id, lock=True)
        changed, secret = service.update_webhook(session, webhook=webhook, changes=changes)
        target = f"webhook:{webhook.id}"
        actions = [
            ("webhook.rotate_secret" if name == "secret" else f"webhook.{_verb(name)}", target) for name in changed
        ]
        record_many(session, caller_or_actor=caller, entries=list(dict.fromkeys(actions)))
        out = service.webhook_to_dict(webhook)
    return {**out, "secret": secret} if secret else out


def _verb(changed: str) -> Literal["enable", "disable", "update"]:
    return "enable" if changed == "enabled" else "disable" if changed == "disabled" else "update"


@router.delete(
    "/webhooks/{webhook_id}", **operation(summary="Delete a webhook", response=WebhookDeleted, errors=(403, 404))
)
def delete_webhook(webhook_id: WebhookIdPath, caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """Stops its deliveries at once; its delivery history goes with it."""
    with tenant_session(caller.tenant_id) as session:
        webhook = service.get_webhook(session, webhook_id=webhook_id, lock=True)
        service.delete_webhook(session, webhook=webhook)
        record(session, caller_or_actor=caller, action="webhook.delete", target=f"webhook:{webhook_id}")
    return {"id": webhook_id, "deleted": True}


@router.get(
    "/webhooks/{webhook_id}/deliveries",
    **operation(
        summary="List a webhook's deliveries",
        response=WebhookDeliveryPage,
        errors=(400, 403, 404),
        query={
            "limit": ({"type": "integer", "minimum": 1, "maximum": 200}, "page size (at most 200)"),
            "cursor": ({"type": "string"}, "the `next_cursor` of the previous page"),
            "state": ({"type": "string", "enum": ["pending", "succeeded", "failed"]}, "only deliveries in this state"),
        },
    ),
)
def list_deliveries(
    webhook_id: WebhookIdPath,
    limit: int = Query(default=50, ge=1, le=200, include_in_schema=False),
    cursor: str | None = Query(default=None, include_in_schema=False),
    state: Literal["pending", "succeeded", "failed"] | None = Query(default=None, include_in_schema=False),
    caller: Caller = Depends(require_admin),
) -> dict[str, Any]:
    """Newest first, each with its event `type`, `data`, `state` and every attempt (time, HTTP status or
    error, duration); the delivery's `id` is the `webhook-id` header of each attempt."""
    with tenant_session(caller.tenant_id) as session:
        service.get_webhook(session, webhook_id=webhook_id)
        rows, next_cursor = service.list_deliveries(
            session, webhook_id=webhook_id, limit=limit, cursor=cursor, state=state
        )
        return {"deliveries": [service.delivery_to_dict(d) for d in rows], "next_cursor": next_cursor}
