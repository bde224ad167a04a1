"""What a memory write leaves behind besides itself: its audit entries and its webhook events.

Everything here runs in the write's own transaction (the route's ``tenant_session``), so both commit or roll
back with the change. A save or a batch writes its entries and events in the save's own statement (from
:data:`SAVED_ENTRIES` and :data:`SAVED_EVENTS`: the statement alone knows the ids it reserves); a patch or a
forget sends one statement of its entry and event with its other statements (:func:`updated_query`,
:func:`forgotten_query`); an import writes one statement of entries and events, whatever its size. Each saved
item has an entry (`memory.save`) and a `memory.created` event, or `memory.updated` when it upserted a memory
that existed. Events name the memory and who wrote it (and a save's kind and category), never its content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from core import sql
from core.audit.service import INSERT_CTES, INSERT_SQL, actor_params, entries_ctes, insert_params
from core.refs import MEMORY_PREFIX, memory_ref
from core.tenancy.context import Caller
from core.webhooks.service import Companion, emit_many, emit_statement, event_params, events_ctes, subscribed

# save_memories leaves the ids it upserted (they existed before) here, in the session's info.
UPDATED_IDS = "memories_upserted"


def _write(
    session: Session,
    *,
    caller: Caller,
    entries: Sequence[tuple[str, str | None]],
    events: Sequence[tuple[str, dict[str, Any]]],
) -> None:
    """Entries and events in one statement (one round trip on a single save)."""
    emit_many(session, tenant_id=caller.tenant_id, events=events, companion=_entries(caller, entries))


def _entries(caller: Caller, entries: Sequence[tuple[str, str | None]]) -> Companion:
    """The audit entries of a write, to run inside its event statement."""
    params = insert_params(caller_or_actor=caller, entries=entries)
    return Companion(ctes=INSERT_CTES, statement=INSERT_SQL, params=params)


def _event(caller: Caller, memory_id: str, **extra: Any) -> dict[str, Any]:
    return {"memory_id": memory_id, "user": caller.user, "agent_id": caller.agent_id, **extra}


# A save's entries and events as CTEs of the save's own statement (core.memories.service), which alone knows
# the ids it reserves: from its CTE `trail`, one row per saved item in input order (columns n = 1, 2, ...,
# memory_id, updated, kind, category), written only if its CTE `seq` has a row. An event's data: memory_id,
# user, agent_id (the caller's), kind, category.
SAVED_ENTRIES = entries_ctes("trail", target=f"'{MEMORY_PREFIX}' || e.memory_id", guard="seq")
SAVED_EVENTS = events_ctes(
    "SELECT CASE WHEN updated THEN 'memory.updated' ELSE 'memory.created' END AS type,"
    " jsonb_build_object('memory_id', memory_id, 'user', CAST(:user AS text),"
    " 'agent_id', CAST(:agent AS text), 'kind', kind, 'category', category) AS data, n FROM trail"
)
# Saves of new memories only have memory.created events: when no enabled webhook of the tenant is subscribed to
# it (most tenants), the statement may leave SAVED_EVENTS out (a third of a single save's time in PostgreSQL,
# planning them), provided it writes nothing when this condition holds after all.
NEW_ONLY_SUBSCRIBED = subscribed("memory.created")


def saved_params(caller: Caller, *, action: str, count: int) -> dict[str, Any]:
    """The parameters of :data:`SAVED_ENTRIES` and :data:`SAVED_EVENTS`: `:tenant`, who acted, `:action`,
    `:count` (the saved items), the jobs' trace context."""
    return {**actor_params(caller), **event_params(), "action": action, "count": count}


def updated_query(caller: Caller, memory_id: str) -> sql.Query:
    """A patch's entry (`memory.update`) and event (`memory.updated`), as a statement the patch sends with its
    others (core.memories.edits); its rows are the webhook jobs it queued, for the session's outbox."""
    return _query(caller, "memory.update", "memory.updated", memory_id)


def forgotten_query(caller: Caller, memory_id: str, *, purged: bool) -> sql.Query:
    """A forget's entry and event (`memory.forget` / `memory.forgotten`, or `memory.purge` / `memory.purged`),
    as :func:`updated_query`."""
    action, event = ("memory.purge", "memory.purged") if purged else ("memory.forget", "memory.forgotten")
    return _query(caller, action, event, memory_id)


def _query(caller: Caller, action: str, event: str, memory_id: str) -> sql.Query:
    entries = _entries(caller, [(action, memory_ref(memory_id))])
    statement, values = emit_statement(
        tenant_id=caller.tenant_id, events=[(event, _event(caller, memory_id))], companion=entries
    )
    # One entry and one event, whatever their values: planned once per connection (core.sql).
    return sql.Query(("memory-trail",), lambda: statement, values, generic=True)


def memories_imported(session: Session, *, caller: Caller, memory_ids: Sequence[str]) -> None:
    """An import's entries (`memory.import`, one per memory) and events, in bulk."""
    if not memory_ids:
        return
    updated: set[str] = session.info.get(UPDATED_IDS, set())
    entries = [("memory.import", memory_ref(i)) for i in memory_ids]
    events = [("memory.updated" if i in updated else "memory.created", _event(caller, i)) for i in memory_ids]
    _write(session, caller=caller, entries=entries, events=events)
