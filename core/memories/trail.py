"""What a memory write leaves behind besides itself: its audit entries and its webhook events.

Each function runs in the write's own session (the route's ``tenant_session``), so both commit or roll back
with the change; a batch or an import costs one INSERT of entries and one statement of events, whatever its
size. Events name the memory and who wrote it, never its content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from core.audit.service import INSERT_CTES, INSERT_SQL, insert_params
from core.memories.schemas import SaveMemoryIn, SaveResult
from core.refs import memory_ref
from core.tenancy.context import Caller
from core.webhooks.service import Companion, emit_many

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
    params = insert_params(caller_or_actor=caller, entries=entries)
    companion = Companion(ctes=INSERT_CTES, statement=INSERT_SQL, params=params)
    emit_many(session, tenant_id=caller.tenant_id, events=events, companion=companion)


def _event(caller: Caller, memory_id: str, **extra: Any) -> dict[str, Any]:
    return {"memory_id": memory_id, "user": caller.user, "agent_id": caller.agent_id, **extra}


def memories_saved(
    session: Session,
    *,
    caller: Caller,
    items: Sequence[SaveMemoryIn | Exception],
    results: Sequence[SaveResult | Exception],
    action: str = "memory.save",
) -> None:
    """Entries and events of the saved items of a save, a batch or an import (failed items leave none)."""
    updated: set[str] = session.info.get(UPDATED_IDS, set())
    saved = [
        (item, result)
        for item, result in zip(items, results, strict=True)
        if isinstance(result, SaveResult) and isinstance(item, SaveMemoryIn)
    ]
    if not saved:
        return
    entries = [(action, memory_ref(r.memory_id)) for _, r in saved]
    events = [
        (
            "memory.updated" if result.memory_id in updated else "memory.created",
            _event(caller, result.memory_id, kind=item.kind, category=item.category),
        )
        for item, result in saved
    ]
    _write(session, caller=caller, entries=entries, events=events)


def memory_updated(session: Session, *, caller: Caller, memory_id: str) -> None:
    entries = [("memory.update", memory_ref(memory_id))]
    _write(session, caller=caller, entries=entries, events=[("memory.updated", _event(caller, memory_id))])


def memory_forgotten(session: Session, *, caller: Caller, memory_id: str, purged: bool) -> None:
    action, event = ("memory.purge", "memory.purged") if purged else ("memory.forget", "memory.forgotten")
    _write(
        session, caller=caller, entries=[(action, memory_ref(memory_id))], events=[(event, _event(caller, memory_id))]
    )


def memories_imported(session: Session, *, caller: Caller, memory_ids: Sequence[str]) -> None:
    """An import's entries (`memory.import`, one per memory) and events, in bulk."""
    if not memory_ids:
        return
    updated: set[str] = session.info.get(UPDATED_IDS, set())
    entries = [("memory.import", memory_ref(i)) for i in memory_ids]
    events = [("memory.updated" if i in updated else "memory.created", _event(caller, i)) for i in memory_ids]
    _write(session, caller=caller, entries=entries, events=events)
