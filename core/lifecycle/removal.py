"""Removing many memories of one tenant at once, with the same consequences as DELETE /v1/memories/{id}.

One call is one change: the tenant's change_seq moves once, every `memory:<id>` reference to a removed
memory is stripped from the others (exact match; each stripped memory gets a new revision), and a purge
deletes embeddings, revisions and associations and leaves tombstones so derived indexes drop the docs: the
statements of DELETE /v1/memories/{id} (core.memories.edits.removal_queries), for many memories at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from core import sql
from core.changes import bump_change_seq
from core.memories.edits import removal_queries, removed_at

# Who a lifecycle change is recorded as (revisions, forgotten_by): the engine, not a key's user.
ENGINE_USER = "engram"

BATCH = 500


def remove_memories(session: Session, *, tenant_id: int, memory_ids: Sequence[str], reason: str, purge: bool) -> int:
    """Forget (status `forgotten`, with `reason`) or purge `memory_ids`; returns how many were removed. The
    statements are a DELETE's (core.memories.edits.removal_queries), for up to BATCH memories at a time."""
    session.flush()  # (the statements go out on the session's connection, past the ORM's unit of work)
    removed = 0
    ids = list(dict.fromkeys(memory_ids))
    for start in range(0, len(ids), BATCH):
        _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
        queries = removal_queries(
            tenant_id=tenant_id,
            memory_ids=ids[start : start + BATCH],
            change_seq=change_seq,
            changed_by=ENGINE_USER,
            reason=reason,
            purge=purge,
        )
        removed += len(sql.run_many(session, queries)[removed_at(purge=purge)])
    return removed
