"""Which memories a caller may see (CONTRACT section 2), as one SQL predicate and one Python check."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Text, and_, bindparam, or_, true

from core.errors import Invalid, NotFound
from core.memories.ids import validate_memory_id
from core.memories.models import Memory
from core.tenancy.context import Caller

# Categories scoped to the agent that wrote them; `workspace` is shared by every agent of the tenant.
AGENT_SCOPED = ("core", "daily", "conversation")


def visible_clause(caller: Caller, *, bound: bool = False) -> ColumnElement[bool]:
    """The predicate for ``caller``. ``bound``: the caller's persona and agent are the parameters
    ``caller_persona`` and ``caller_agent`` (see :func:`visible_values`), so a statement compiled once serves
    every caller of the same shape (:func:`visible_shape`)."""
    if caller.sees_all:
        return true()
    persona: Any = bindparam("caller_persona", caller.persona) if bound else caller.persona
    agent: Any = bindparam("caller_agent", caller.agent_id) if bound else caller.agent_id
    persona_ok: ColumnElement[bool] = Memory.persona.is_(None)
    if caller.persona is not None:
        persona_ok = or_(persona_ok, Memory.persona == persona)
    # Comparisons, not NOT IN: an expanding IN is re-rendered for every statement, which keeps the statement
    # out of SQLAlchemy's compiled cache (measured on every GET by id).
    not_agent_scoped = and_(*(Memory.category != category for category in AGENT_SCOPED))
    agent_ok: ColumnElement[bool] = or_(Memory.agent_id.is_(None), not_agent_scoped)
    if caller.agent_id is not None:
        agent_ok = or_(agent_ok, Memory.agent_id == agent)
    return and_(persona_ok, agent_ok)


def visible_shape(caller: Caller) -> tuple[bool, bool, bool]:
    """What the form of ``visible_clause(caller, bound=True)`` depends on."""
    return caller.sees_all, caller.persona is not None, caller.agent_id is not None


def visible_values(caller: Caller) -> dict[str, Any]:
    """The parameters of ``visible_clause(caller, bound=True)``."""
    return {"caller_persona": caller.persona, "caller_agent": caller.agent_id}


def is_visible(memory: Memory, caller: Caller) -> bool:
    if caller.sees_all:
        return True
    if memory.persona is not None and memory.persona != caller.persona:
        return False
    if memory.agent_id is not None and memory.category in AGENT_SCOPED:
        return memory.agent_id == caller.agent_id
    return True


def may_modify(memory: Memory, caller: Caller) -> bool:
    return caller.is_admin or memory.created_by == caller.user


def possible_id(memory_id: str) -> None:
    """NotFound for an id no memory can have."""
    try:
        validate_memory_id(memory_id)
    except Invalid:  # no memory can have an id outside the charset (e.g. a NUL byte from the URL)
        raise NotFound(f"memory {memory_id[:200]!r} not found") from None


def visible_by_id(caller: Caller, include_forgotten: bool) -> list[ColumnElement[bool]]:
    """Where the memory ``id`` of the tenant is, if a caller of ``caller``'s shape sees it (a forgotten one only
    when asked for): the conditions of the generic statements that read or lock one memory (parameters: tenant,
    id, the caller's: :func:`visible_values`)."""
    conditions = [
        Memory.tenant_id == bindparam("tenant", type_=BigInteger),
        Memory.id == bindparam("id", type_=Text),
        visible_clause(caller, bound=True),
    ]
    if not include_forgotten:
        conditions.append(Memory.status != "forgotten")
    return conditions
