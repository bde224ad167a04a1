"""API keys of the caller's tenant (admin only)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Body, Depends
from pydantic import BaseModel, ConfigDict, Field

from api.auth import forget_tenant_callers, require_admin
from api.openapi import KeyIdPath, operation
from api.schemas import IssuedKeyOut, KeyList, KeyRevoked
from api.threads import Route
from core.audit.service import record
from core.db import tenant_session
from core.errors import Invalid
from core.memories.schemas import unknown_fields
from core.tenancy.context import Caller
from core.tenancy.models import ApiKey, Tenant
from core.tenancy.operations import announce
from core.tenancy.service import KeyBinding, issue_key, list_keys, revoke_key

router = APIRouter(prefix="/v1", tags=["keys"], route_class=Route)


class CreateKeyIn(BaseModel):
    """`POST /v1/keys`: a key for one user of the caller's tenant, optionally bound to an agent/persona."""

    model_config = ConfigDict(extra="forbid")

    user: str = Field(description="the key holder's email address", examples=["ana@example.com"])
    role: Literal["admin", "member"] = Field(default="member", description="admin keys manage keys and the catalog")
    agent_id: str | None = Field(default=None, description="the key acts as this agent, whatever a call names")
    persona: str | None = Field(default=None, description="the key acts under this persona, whatever a call names")
    read_only: bool = Field(default=False, description="every write with this key is refused (403)")


def _binding(body: dict[str, Any]) -> KeyBinding:
    for name in ("agent_id", "persona"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise Invalid(f"{name} must be a string", field=name)
    read_only = body.get("read_only", False)
    if not isinstance(read_only, bool):
        raise Invalid("read_only must be true or false", field="read_only")
    return KeyBinding(agent_id=body.get("agent_id"), persona=body.get("persona"), read_only=read_only)


def _key_out(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.id,
        "user": key.user_email,
        "role": key.role,
        "agent_id": key.agent_id,
        "persona": key.persona,
        "read_only": key.read_only,
        "created_at": key.created_at.isoformat() if key.created_at else None,
    }


@router.post(
    "/keys",
    status_code=201,
    **operation(
        summary="Issue an API key",
        body=CreateKeyIn,
        example={"user": "ana@example.com", "role": "member", "agent_id": "planner", "read_only": False},
        response=IssuedKeyOut,
        status=201,
        errors=(403, 415),
    ),
)
def create_key(body: Any = Body(default=None), caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """A new key of the caller's tenant for `user`; the secret `api_key` is shown only in this answer."""
    if not isinstance(body, dict):
        raise Invalid('body must be {"user": "...", "role": "member"}', field="user")
    unknown_fields(CreateKeyIn, body)
    user, role = body.get("user"), body.get("role", "member")
    if not isinstance(user, str):
        raise Invalid("user must be an email address", field="user")
    if not isinstance(role, str):
        raise Invalid("role must be admin or member", field="role")
    binding = _binding(body)
    with tenant_session(caller.tenant_id) as session:
        tenant = session.get(Tenant, caller.tenant_id)
        assert tenant is not None
        issued = issue_key(session, tenant=tenant, user=user, role=role, binding=binding)
        record(session, caller_or_actor=caller, action="key.create", target=f"key:{issued.id}")
    return {
        "api_key": issued.api_key,
        "id": issued.id,
        "user": issued.user,
        "role": issued.role,
        "tenant": issued.tenant,
        "agent_id": issued.agent_id,
        "persona": issued.persona,
        "read_only": issued.read_only,
    }


@router.get("/keys", **operation(summary="List API keys", response=KeyList, errors=(403,)))
def get_keys(caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """The tenant's live keys with their bindings (never the secret)."""
    with tenant_session(caller.tenant_id) as session:
        return {"keys": [_key_out(key) for key in list_keys(session, caller=caller)]}


@router.delete("/keys/{key_id}", **operation(summary="Revoke an API key", response=KeyRevoked, errors=(403, 404)))
def delete_key(key_id: KeyIdPath, caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """The key stops working at once on every API process."""
    with tenant_session(caller.tenant_id) as session:
        revoke_key(session, caller=caller, key_id=key_id)
        record(session, caller_or_actor=caller, action="key.revoke", target=f"key:{key_id}")
        announce(session, tenant_id=caller.tenant_id, event="keys")  # other replicas drop it at commit
    forget_tenant_callers(caller.tenant_id)
    return {"id": key_id, "revoked": True}
