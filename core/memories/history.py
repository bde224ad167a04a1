"""Every revision of a memory: written by each save, upsert and patch, read newest first.

A revision is a row of ``memory_versions`` keyed by the tenant's ``change_seq`` of the write that made it
(see core.changes), so the newest row is the memory as it stands. Catalog cascades may strip entities from
a memory without a revision of their own; the read then puts the memory's current state first, so the
first version is always the current one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import BigInteger, Executable, Text, bindparam, delete, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from core import sql
from core.memories.models import Memory, MemoryVersion
from core.memories.schemas import MemoryCategory, MemoryKind

VERSION_FIELDS = ("content", "kind", "category", "tags", "importance", "entities")

# Keep rows of ``{source}`` (memories, or the RETURNING rows of a statement that changed them) as one revision each.
RECORD_FROM = """
    INSERT INTO memory_versions (
        tenant_id, memory_id, change_seq, content, kind, category, tags, importance, entities, changed_by, changed_at
    )
    SELECT tenant_id, id, change_seq, content, kind, category, coalesce(tags, '{{}}'), importance,
           coalesce(entities, '{{}}'), :changed_by, updated_at
    FROM {source}
    ON CONFLICT (tenant_id, memory_id, change_seq) DO UPDATE SET
        content = excluded.content, kind = excluded.kind, category = excluded.category, tags = excluded.tags,
        importance = excluded.importance, entities = excluded.entities, changed_by = excluded.changed_by,
        changed_at = excluded.changed_at
"""
# Snapshot the named memories as they are now, as one revision each (after a patch).
_RECORD = text(RECORD_FROM.format(source="memories WHERE tenant_id = :tenant_id AND id = ANY(:ids)"))


class VersionIn(BaseModel):
    """One revision as an export writes it (the history API's shape); what an import accepts back."""

    model_config = ConfigDict(extra="forbid", strict=False)

    content: str
    kind: MemoryKind
    category: MemoryCategory
    tags: list[str] = Field(default_factory=list)
    importance: float = Field(ge=0.0, le=1.0)
    entities: list[str] = Field(default_factory=list)
    changed_by: str | None = None
    changed_at: datetime | None = None


def versions_query(*, tenant_id: int, memory_ids: Sequence[str], changed_by: str) -> sql.Query:
    """Keep the current state of ``memory_ids`` as their newest revision (rows must carry this write's change_seq):
    a statement a write sends with its others (core.sql), after the statements that change those memories."""
    values = {"tenant_id": tenant_id, "ids": list(memory_ids), "changed_by": changed_by}
    return sql.Query(("record-versions",), lambda: _RECORD, values, generic=True)


def _version_dict(
    row: MemoryVersion | Revision, *, changed_by: str | None, changed_at: datetime | None
) -> dict[str, Any]:
    return {
        "content": row.content,
        "kind": row.kind,
        "category": row.category,
        "tags": list(row.tags or []),
        "importance": row.importance,
        "entities": list(row.entities or []),
        "changed_by": changed_by,
        "changed_at": changed_at.isoformat() if changed_at is not None else None,
    }


class Revision(NamedTuple):
    """A memory's versioned fields (VERSION_FIELDS), as the rows of CURRENT_COLUMNS and REVISION_COLUMNS begin."""

    content: str
    kind: str
    category: str
    tags: list[str] | None
    importance: float
    entities: list[str] | None


# The memory as it stands (its versioned fields and when it last changed), and its revisions.
CURRENT_COLUMNS = (*(getattr(Memory, name) for name in VERSION_FIELDS), Memory.updated_at)
REVISION_COLUMNS = (
    *(getattr(MemoryVersion, name) for name in VERSION_FIELDS),
    MemoryVersion.changed_by,
    MemoryVersion.changed_at,
)
assert Revision._fields == VERSION_FIELDS


def revisions_statement() -> Executable:
    """A memory's revisions, newest first (parameters: tenant, id)."""
    return (
        select(*REVISION_COLUMNS)
        .where(
            MemoryVersion.tenant_id == bindparam("tenant", type_=BigInteger),
            MemoryVersion.memory_id == bindparam("id", type_=Text),
        )
        .order_by(MemoryVersion.change_seq.desc())
    )


def history_of(current: Sequence[Any], revisions: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The versions of a (visible) memory, newest first, from its row of CURRENT_COLUMNS and its rows of
    REVISION_COLUMNS (newest first); the first is its current state."""
    n = len(VERSION_FIELDS)
    versions = [_version_dict(Revision._make(r[:n]), changed_by=r[n], changed_at=r[n + 1]) for r in revisions]
    current_state = _version_dict(Revision._make(current[:n]), changed_by=None, changed_at=current[n])
    if not versions or any(versions[0][k] != current_state[k] for k in VERSION_FIELDS):
        # Changed without a revision of its own (a catalog cascade): the engine changed it.
        versions.insert(0, {**current_state, "changed_by": "engram"})
    return versions


def histories_for(session: Session, memory_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """The stored versions of many memories (an export), newest first per memory."""
    out: dict[str, list[dict[str, Any]]] = {mid: [] for mid in memory_ids}
    if not memory_ids:
        return out
    rows = session.scalars(
        select(MemoryVersion)
        .where(MemoryVersion.memory_id.in_(list(memory_ids)))
        .order_by(MemoryVersion.memory_id, MemoryVersion.change_seq.desc())
    ).all()
    for r in rows:
        out[r.memory_id].append(_version_dict(r, changed_by=r.changed_by, changed_at=r.changed_at))
    return out


def restore_history(
    session: Session, *, tenant_id: int, memory_id: str, change_seq: int, versions: Sequence[VersionIn]
) -> None:
    """Replace a just-imported memory's revisions by those of its export (newest first).

    The import's own revision (at `change_seq`) stays unless the export's newest version is the same
    state, in which case the exported one, with its original author and time, takes its place.
    """
    current = session.scalar(
        select(MemoryVersion).where(MemoryVersion.memory_id == memory_id, MemoryVersion.change_seq == change_seq)
    )
    session.execute(
        delete(MemoryVersion).where(MemoryVersion.memory_id == memory_id, MemoryVersion.change_seq != change_seq)
    )
    if current is not None and versions:
        mine = _version_dict(current, changed_by=None, changed_at=None)
        if all(getattr(versions[0], k) == mine[k] for k in VERSION_FIELDS):
            session.delete(current)
            session.flush()
        else:
            change_seq -= 1  # the import's revision is the newest; the export's come before it
    rows = [
        {
            "tenant_id": tenant_id,
            "memory_id": memory_id,
            "change_seq": change_seq - i,
            **v.model_dump(include=set(VERSION_FIELDS)),
            "changed_by": v.changed_by or "import",
            "changed_at": v.changed_at or func.now(),
        }
        for i, v in enumerate(versions)
    ]
    if rows:
        session.execute(pg_insert(MemoryVersion).values(rows).on_conflict_do_nothing())
