"""Tenants, users and API keys. Keys are shown once and stored as SHA-256."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql import func

from core.errors import Conflict, Invalid, NotFound, Unauthorized
from core.tenancy.context import Caller
from core.tenancy.models import ApiKey, Tenant, User
from core.tenancy.quotas import full_quotas

ROLES = ("admin", "member")
KEY_PREFIX = "egk_"
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+")


@dataclass(frozen=True)
class IssuedKey:
    id: str
    api_key: str
    tenant: str
    user: str
    role: str
    agent_id: str | None = None
    persona: str | None = None
    read_only: bool = False


@dataclass(frozen=True)
class KeyBinding:
    """What a key may act as: one agent and/or persona, and whether it may write."""

    agent_id: str | None = None
    persona: str | None = None
    read_only: bool = False

    def validate(self, *, role: str) -> None:
        for name, value in (("agent_id", self.agent_id), ("persona", self.persona)):
            if value is not None and (not value or len(value) > 200):
                raise Invalid(f"{name} must be a non-empty string of at most 200 characters", field=name)
        if role == "admin" and (self.agent_id is not None or self.persona is not None):
            # An admin sees everything in its tenant: an agent or persona binding would mean nothing.
            raise Invalid("an admin key cannot be bound to an agent or persona; use role member", field="role")


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def _new_key() -> tuple[str, str]:
    return "key_" + secrets.token_hex(8), KEY_PREFIX + secrets.token_urlsafe(32)


def create_tenant(session: Session, *, name: str, admin_user: str = "admin@localhost") -> IssuedKey:
    """Create a tenant with its first admin user and key."""
    if not _TENANT_NAME.fullmatch(name or ""):
        raise Invalid("tenant name: letters, digits, '_', '.', '-' (at most 200)", field="name")
    tenant = Tenant(name=name)
    session.add(tenant)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"tenant {name!r} already exists", field="name") from None
    return issue_key(session, tenant=tenant, user=admin_user, role="admin")


def get_tenant_by_name(session: Session, *, name: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.name == name))


def issue_key(
    session: Session, *, tenant: Tenant, user: str, role: str, binding: KeyBinding | None = None
) -> IssuedKey:
    """Issue a key for `user` (created on first use) with `role`, bound as `binding` says."""
    binding = binding or KeyBinding()
    if role not in ROLES:
        raise Invalid(f"role must be one of {', '.join(ROLES)}", field="role")
    binding.validate(role=role)
    if not _EMAIL.fullmatch(user or "") or len(user) > 320:
        raise Invalid("user must be an email address", field="user")
    existing = session.scalar(select(User).where(User.tenant_id == tenant.id, User.email == user))
    if existing is None:
        session.add(User(tenant_id=tenant.id, email=user))
    key_id, api_key = _new_key()
    session.add(
        ApiKey(
            id=key_id,
            tenant_id=tenant.id,
            user_email=user,
            role=role,
            key_hash=hash_key(api_key),
            agent_id=binding.agent_id,
            persona=binding.persona,
            read_only=binding.read_only,
        )
    )
    session.flush()
    return IssuedKey(
        id=key_id,
        api_key=api_key,
        tenant=tenant.name,
        user=user,
        role=role,
        agent_id=binding.agent_id,
        persona=binding.persona,
        read_only=binding.read_only,
    )


def list_keys(session: Session, *, caller: Caller) -> list[ApiKey]:
    """The tenant's live keys, oldest first."""
    return list(
        session.scalars(
            select(ApiKey)
            .where(ApiKey.tenant_id == caller.tenant_id, ApiKey.revoked_at.is_(None))
            .order_by(ApiKey.created_at, ApiKey.id)
        )
    )


def authenticate(session: Session, *, api_key: str) -> Caller:
    """The caller a key stands for; 401 when the key is unknown or revoked."""
    if not api_key.startswith(KEY_PREFIX):
        raise Unauthorized("invalid API key")
    row = session.execute(
        select(ApiKey, Tenant.name, Tenant.state, Tenant.quotas)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.key_hash == hash_key(api_key), ApiKey.revoked_at.is_(None), Tenant.state != "deleting")
    ).first()
    if row is None:
        raise Unauthorized("invalid API key")
    key, tenant_name, tenant_state, quotas = row
    return Caller(
        tenant_id=key.tenant_id,
        tenant_name=tenant_name,
        user=key.user_email,
        role=key.role,
        key_id=key.id,
        agent_id=key.agent_id,
        persona=key.persona,
        bound_agent_id=key.agent_id,
        bound_persona=key.persona,
        read_only=key.read_only,
        tenant_state=tenant_state,
        tenant_requests_per_minute=full_quotas(quotas)["requests_per_minute"],
    )


def revoke_key(session: Session, *, caller: Caller, key_id: str) -> None:
    result = session.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.tenant_id == caller.tenant_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=func.now())
    )
    if result.rowcount == 0:  # type: ignore[attr-defined]
        raise NotFound(f"key {key_id!r} not found")
