"""API keys of the caller's tenant (admin only)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Body, Depends
from pydantic import BaseModel, ConfigDict, Field

from api.auth import forget_cached_keys, require_admin
from api.openapi import BEARER, operation
from api.schemas import IssuedKeyOut, KeyRevoked
from core.db import system_session
from core.errors import Invalid
from core.memories.schemas import unknown_fields
from core.tenancy.context import Caller
from core.tenancy.models import Tenant
from core.tenancy.service import issue_key, revoke_key

router = APIRouter(prefix="/v1", tags=["keys"], dependencies=[Depends(BEARER)])


class CreateKeyIn(BaseModel):
    """`POST /v1/keys`: a key for one user of the caller's tenant."""

    model_config = ConfigDict(extra="forbid")

    user: str = Field(description="the key holder's email address", examples=["ana@example.com"])
    role: Literal["admin", "member"] = Field(default="member", description="admin keys manage keys and the catalog")


@router.post(
    "/keys",
    status_code=201,
    **operation(
        summary="Issue an API key",
        body=CreateKeyIn,
        example={"user": "ana@example.com", "role": "member"},
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
    with system_session() as session:
        tenant = session.get(Tenant, caller.tenant_id)
        assert tenant is not None
        issued = issue_key(session, tenant=tenant, user=user, role=role)
    return {
        "api_key": issued.api_key,
        "id": issued.id,
        "user": issued.user,
        "role": issued.role,
        "tenant": issued.tenant,
    }


@router.delete("/keys/{key_id}", **operation(summary="Revoke an API key", response=KeyRevoked, errors=(403, 404)))
def delete_key(key_id: str, caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """The key stops working at once on every API process."""
    with system_session() as session:
        revoke_key(session, caller=caller, key_id=key_id)
    forget_cached_keys()
    return {"id": key_id, "revoked": True}
