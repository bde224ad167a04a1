"""The staleness watcher: an active memory that links a catalog entity the catalog no longer has is marked
`stale`, with a reason naming the entities, so GET /v1/memories?status=stale lists it for review.

Removals made through the catalog (DELETE of a datasource or model, a re-ingest that drops tables or
columns, ingest cleanup) already strip references and mark query-bearing memories stale in the same
transaction (core.entities.cascade, core.entities.cleanup). The watcher is the backstop for references
those paths left behind: a probe that failed during ingest cleanup, entities removed by other means, or a
memory saved leniently with an entity that never existed. It reads the catalog through the resolver's
snapshot, so it never marks a memory stale while the catalog still knows the entity.

It also marks memories whose linked entities changed definition (core.lifecycle.definitions).

A tenant is checked only when its change_seq moved since the previous check (every memory and catalog
write moves it), so an idle tenant costs one comparison.
"""

from __future__ import annotations

from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from core.changes import bump_change_seq
from core.entities.store import load_snapshot
from core.lifecycle.definitions import watch_definitions
from core.memories.models import Memory
from core.refs import MEMORY_PREFIX
from core.tenancy.models import Tenant

STALE_PREFIX = "linked entities no longer in the catalog: "


def tenant_change_seq(session: Session, *, tenant_id: int) -> int:
    return int(session.scalar(select(Tenant.change_seq).where(Tenant.id == tenant_id)) or 0)


def watch_tenant(session: Session, *, tenant_id: int) -> int:
    """Mark the tenant's active memories whose catalog links vanished; `session` is scoped to the tenant."""
    snapshot = load_snapshot(session, tenant_id)
    has_catalog_ref = text(
        "EXISTS (SELECT 1 FROM unnest(memories.entities) AS e WHERE e NOT LIKE :memory_ref_pattern)"
    ).bindparams(memory_ref_pattern=MEMORY_PREFIX + "%")
    rows = session.execute(
        select(Memory.id, Memory.entities).where(
            Memory.tenant_id == tenant_id, Memory.status == "active", has_catalog_ref
        )
    )
    vanished: dict[str, list[str]] = {}
    for memory_id, entities in rows:
        gone = [e for e in entities if not e.startswith(MEMORY_PREFIX) and not snapshot.contains(e)]
        if gone:
            vanished[memory_id] = gone

    changed_definitions = watch_definitions(session, tenant_id=tenant_id)
    if not vanished:
        return changed_definitions
    _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
    for memory_id, gone in vanished.items():
        session.execute(
            update(Memory)
            .where(Memory.tenant_id == tenant_id, Memory.id == memory_id, Memory.status == "active")
            .values(
                status="stale",
                stale_reason=STALE_PREFIX + ", ".join(gone) + "; re-link or re-save the memory",
                change_seq=change_seq,
            )
            .execution_options(synchronize_session=False)
        )
    return len(vanished) + changed_definitions
