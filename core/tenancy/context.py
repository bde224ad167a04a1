"""Who is calling: the identity every core service receives instead of raw request data."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Caller:
    tenant_id: int
    tenant_name: str
    user: str
    role: str
    key_id: str
    agent_id: str | None = None
    persona: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def acting_as(self, *, agent_id: str | None, persona: str | None) -> Caller:
        """The same key, naming the agent and persona it acts for on this call."""
        return replace(self, agent_id=agent_id, persona=persona)
