"""Who is calling: the identity every core service receives instead of raw request data.

A key may be bound to an agent and/or a persona, and may be read-only. The binding is enforced here and
nowhere else: every path that turns a call's named agent/persona into the acting identity goes through
:meth:`Caller.acting_as` (and :meth:`Caller.stamp` for per-item identities), and every write through
:meth:`Caller.require_write`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from core.errors import Forbidden


@dataclass(frozen=True)
class Caller:
    tenant_id: int
    tenant_name: str
    user: str
    role: str
    key_id: str
    agent_id: str | None = None
    persona: str | None = None
    bound_agent_id: str | None = None
    bound_persona: str | None = None
    read_only: bool = False
    # The tenant's operating state and its requests_per_minute quota, as authentication read them.
    tenant_state: str = "active"
    tenant_requests_per_minute: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def sees_all(self) -> bool:
        """An admin call that names no agent and no persona sees the whole tenant; an admin call naming one
        sees what that agent/persona sees (a filter), and may still change anything."""
        return self.is_admin and self.agent_id is None and self.persona is None

    def acting_as(self, *, agent_id: str | None, persona: str | None) -> Caller:
        """The same key, naming the agent and persona it acts for on this call (its binding, if bound)."""
        agent_id, persona = self._bound(agent_id=agent_id, persona=persona)
        if agent_id == self.agent_id and persona == self.persona:
            return self  # frozen: the same identity needs no copy (most calls name none)
        return replace(self, agent_id=agent_id, persona=persona)

    def stamp(self, *, agent_id: str | None, persona: str | None) -> dict[str, str | None]:
        """The agent and persona a saved item carries: what it names, else the acting ones; a bound key
        cannot stamp another agent or persona."""
        agent_id, persona = self._bound(agent_id=agent_id, persona=persona)
        return {
            "agent_id": agent_id if agent_id is not None else self.agent_id,
            "persona": persona if persona is not None else self.persona,
        }

    def require_write(self) -> None:
        if self.read_only:
            raise Forbidden("this API key is read-only")

    def _bound(self, *, agent_id: str | None, persona: str | None) -> tuple[str | None, str | None]:
        for name, named, bound in (
            ("agent_id", agent_id, self.bound_agent_id),
            ("persona", persona, self.bound_persona),
        ):
            if bound is not None and named is not None and named != bound:
                raise Forbidden(f"this API key is bound to {name} {bound!r}", field=name)
        return (
            self.bound_agent_id if self.bound_agent_id is not None else agent_id,
            self.bound_persona if self.bound_persona is not None else persona,
        )
