"""Definition changes of linked catalog entities: a column's type or SQL, a measure's formula, an
aggregation's formula and parameters, a model's table.

The first time the watcher sees an entity that an active memory links, it records the entity's definition;
when a later pass finds a different one, every active memory linking that entity is marked `stale` with a
reason naming the change, and the new definition is recorded. Only linked entities are tracked, so the
table stays as small as what memories actually talk about.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import cast

from sqlalchemy import DateTime, String, Table, Text, func, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Mapped, Session, mapped_column

from core.changes import bump_change_seq
from core.db import Base, TenantScoped
from core.entities.models import CatalogAggregation, CatalogColumn, CatalogMeasure, CatalogModel
from core.memories.models import Memory
from core.refs import MEMORY_PREFIX


class EntityDefinition(TenantScoped, Base):
    __tablename__ = "entity_definitions"

    canonical_id: Mapped[str] = mapped_column(String(400), primary_key=True)
    definition: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


def current_definitions(session: Session, *, entity_ids: set[str]) -> dict[str, str]:
    """The definition text of each catalog entity in `entity_ids` that exists (models and leaves)."""
    models, leaves = [], []
    for entity in entity_ids:
        parts = entity.split(".")
        if len(parts) == 2:
            models.append(tuple(parts))
        elif len(parts) == 3:
            leaves.append(tuple(parts))
    found: dict[str, str] = {}
    if models:
        for m in session.scalars(
            select(CatalogModel).where(tuple_(CatalogModel.datasource, CatalogModel.name).in_(models))
        ):
            found[f"{m.datasource}.{m.name}"] = f"table={m.table_name or m.name}"
    if leaves:
        for c in session.scalars(
            select(CatalogColumn).where(
                tuple_(CatalogColumn.datasource, CatalogColumn.model, CatalogColumn.name).in_(leaves)
            )
        ):
            found[f"{c.datasource}.{c.model}.{c.name}"] = f"type={c.data_type}" + (f"; sql={c.sql}" if c.sql else "")
        for me in session.scalars(
            select(CatalogMeasure).where(
                tuple_(CatalogMeasure.datasource, CatalogMeasure.model, CatalogMeasure.name).in_(leaves)
            )
        ):
            found.setdefault(f"{me.datasource}.{me.model}.{me.name}", f"formula={me.formula}")
        for ag in session.scalars(
            select(CatalogAggregation).where(
                tuple_(CatalogAggregation.datasource, CatalogAggregation.model, CatalogAggregation.name).in_(leaves)
            )
        ):
            params = json.dumps(ag.params or {}, sort_keys=True)
            found.setdefault(f"{ag.datasource}.{ag.model}.{ag.name}", f"formula={ag.formula}; params={params}")
    return found


def watch_definitions(session: Session, *, tenant_id: int) -> int:
    """Mark active memories whose linked entities changed definition; returns how many were marked."""
    linked = set(
        session.scalars(select(func.unnest(Memory.entities)).where(Memory.status == "active").distinct()).all()
    )
    linked = {e for e in linked if not e.startswith(MEMORY_PREFIX) and "." in e}
    if not linked:
        return 0
    current = current_definitions(session, entity_ids=linked)
    stored = dict(
        session.execute(
            select(EntityDefinition.canonical_id, EntityDefinition.definition).where(
                EntityDefinition.canonical_id.in_(list(current))
            )
        ).all()
    )
    changed = {e: (stored[e], d) for e, d in current.items() if e in stored and stored[e] != d}
    fresh = [e for e in current if e not in stored or e in changed]
    if fresh:
        table = cast(Table, EntityDefinition.__table__)
        stmt = pg_insert(table)
        session.connection().execute(
            stmt.on_conflict_do_update(
                index_elements=["tenant_id", "canonical_id"],
                set_={"definition": stmt.excluded.definition, "updated_at": stmt.excluded.updated_at},
            ),
            [
                {"tenant_id": tenant_id, "canonical_id": e, "definition": current[e], "updated_at": datetime.now(UTC)}
                for e in fresh
            ],
        )
    if not changed:
        return 0
    _, change_seq = bump_change_seq(session, tenant_id=tenant_id)
    marked = 0
    for entity, (before, after) in sorted(changed.items()):
        result = session.execute(
            update(Memory)
            .where(Memory.status == "active", Memory.entities.contains([entity]))
            .values(
                status="stale",
                stale_reason=f"definition of {entity} changed ({before} -> {after}); review the memory",
                change_seq=change_seq,
            )
            .execution_options(synchronize_session=False)
        )
        marked += int(result.rowcount or 0)  # type: ignore[attr-defined]
    return marked
