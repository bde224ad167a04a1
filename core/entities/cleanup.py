"""Defense-in-depth cleanup after an ingest (memories.md, "Defense-in-depth cleanup at ingest").

Every memory reference rooted at the datasource is probed against the catalog: a definitive "not found"
is stripped, while a probe that fails (raises) keeps the reference, so an infrastructure hiccup never
drops data. A query-bearing memory whose attached query names a vanished entity is marked stale with a
reason; its query is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from core.changes import bump_change_seq
from core.entities.canonical import rooted_in
from core.entities.cascade import escape_like, mark_stale, query_mentions
from core.entities.store import load_snapshot
from core.memories.models import Memory

Probe = Callable[[str], bool]
"""True when the entity exists, False when it definitively does not; raising means "unknown"."""


def _intact(probe: Probe, entity: str) -> bool:
    try:
        return probe(entity)
    except Exception:  # a transient failure is not evidence that the entity is gone
        return True


def cleanup_datasource_refs(
    session: Session, *, tenant_id: int, datasource: str, probe: Probe | None = None
) -> dict[str, Any]:
    if probe is None:
        probe = load_snapshot(session, tenant_id).contains
    rooted = text(
        "EXISTS (SELECT 1 FROM unnest(memories.entities) AS e WHERE e = :cleanup_ds OR e LIKE :cleanup_pattern)"
    ).bindparams(cleanup_ds=datasource, cleanup_pattern=escape_like(datasource) + ".%")
    rows = session.execute(
        select(Memory.id, Memory.entities, Memory.query, Memory.status).where(Memory.tenant_id == tenant_id, rooted)
    )
    updates: list[tuple[str, list[str], list[str]]] = []
    for memory_id, entities, query, status in rows:
        gone = [e for e in entities if rooted_in(entity=e, datasource=datasource) and not _intact(probe, e)]
        if gone:
            stale = [e for e in gone if status == "active" and query_mentions(query, e)]
            updates.append((memory_id, [e for e in entities if e not in gone], stale))
    if not updates:
        return {"checked_datasource": datasource, "memories_updated": 0, "memories_marked_stale": 0}
    _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
    for memory_id, kept, stale in updates:
        session.execute(
            update(Memory)
            .where(Memory.id == memory_id)
            .values(entities=kept, change_seq=change_seq)
            .execution_options(synchronize_session=False)
        )
        if stale:
            mark_stale(session, memory_id=memory_id, vanished=stale, change_seq=change_seq)
    return {
        "checked_datasource": datasource,
        "memories_updated": len(updates),
        "memories_marked_stale": sum(1 for _, _, stale in updates if stale),
    }
