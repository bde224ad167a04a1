"""Removing many memories of one tenant at once, with the same consequences as DELETE /v1/memories/{id}.

One call is one change: the tenant's change_seq moves once, every `memory:<id>` reference to a removed
memory is stripped from the others (exact match, as core.memories.edits.forget_memory does for one;
each stripped memory gets a new revision), and a purge deletes embeddings and associations and leaves
tombstones so derived indexes drop the docs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Text, bindparam, delete, text, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from core.changes import bump_change_seq
from core.entities.cascade import write_tombstones
from core.memories.history import record_versions
from core.memories.models import Association, Memory
from core.refs import memory_ref
from core.vectors import Embedding

# Who a lifecycle change is recorded as (revisions, forgotten_by): the engine, not a key's user.
ENGINE_USER = "engram"

BATCH = 500


def _strip_refs(session: Session, *, tenant_id: int, refs: list[str], change_seq: int) -> None:
    kept = text("array(SELECT e FROM unnest(memories.entities) AS e WHERE e <> ALL(:removed_refs))").bindparams(
        bindparam("removed_refs", refs, type_=ARRAY(Text))
    )
    stripped = session.scalars(
        update(Memory)
        .where(Memory.tenant_id == tenant_id, Memory.entities.overlap(refs))
        .values(entities=kept, change_seq=change_seq, updated_at=datetime.now(UTC))
        .returning(Memory.id)
        .execution_options(synchronize_session=False)
    ).all()
    record_versions(session, tenant_id=tenant_id, memory_ids=list(stripped), changed_by=ENGINE_USER)


def remove_memories(session: Session, *, tenant_id: int, memory_ids: Sequence[str], reason: str, purge: bool) -> int:
    """Forget (status `forgotten`, with `reason`) or purge `memory_ids`; returns how many were removed."""
    removed = 0
    ids = list(dict.fromkeys(memory_ids))
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        refs = [memory_ref(i) for i in chunk]
        _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
        _strip_refs(session, tenant_id=tenant_id, refs=refs, change_seq=change_seq)
        mine = (Memory.tenant_id == tenant_id) & Memory.id.in_(chunk)
        if purge:
            session.execute(delete(Embedding).where(Embedding.tenant_id == tenant_id, Embedding.canonical_id.in_(refs)))
            session.execute(
                delete(Association).where(
                    Association.tenant_id == tenant_id,
                    Association.source_id.in_(chunk) | Association.target_id.in_(chunk),
                )
            )
            result = session.execute(delete(Memory).where(mine).execution_options(synchronize_session=False))
            write_tombstones(session, tenant_id=tenant_id, doc_ids=refs, change_seq=change_seq)
        else:
            result = session.execute(
                update(Memory)
                .where(mine, Memory.status != "forgotten")
                .values(
                    status="forgotten",
                    forget_reason=reason,
                    forgotten_by=ENGINE_USER,
                    forgotten_at=datetime.now(UTC),
                    change_seq=change_seq,
                    updated_at=datetime.now(UTC),
                )
                .execution_options(synchronize_session=False)
            )
        removed += int(result.rowcount or 0)  # type: ignore[attr-defined]
    return removed
