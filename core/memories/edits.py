"""Revising and forgetting one memory (``PATCH`` and ``DELETE /v1/memories/{id}``): two round trips each.

The first takes the tenant's row, advancing its change seq (every write's first lock, core.changes), and then
the memory's row, read as the caller may see it. The second writes what the edit leaves behind and commits:
the memory's row (a patch answers with it in its REST shape, with its associations), its revision, the embed job
of new content, a forgotten memory's references stripped from the others (each a revision), the audit entry and
the webhook events. Both go out as core.sql pipelines, on generic plans. Through the ORM an edit was ten
statements, each its own round trip, and cost about twice a save's CPU.

A patch that names entities or associations resolves and checks them between the two (round trips of their
own, only then), as a save does (core.memories.links, core.memories.service).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import BigInteger, Executable, Text, bindparam, select, text, update
from sqlalchemy.orm import Session

from core import sql
from core.changes import advance_query, advanced
from core.entities.cascade import TOMBSTONES_SQL
from core.errors import Forbidden, Invalid, NotFound
from core.jobs.service import enqueue_query, outbox_add
from core.memories import trail
from core.memories.history import RECORD_FROM, VERSION_FIELDS, versions_query
from core.memories.links import LinkResolver, Links
from core.memories.models import Memory
from core.memories.schemas import DEFAULT_IMPORTANCE, PatchMemoryIn, SaveMemoryIn
from core.memories.service import Planned, precheck, replace_associations
from core.memories.views import VIEW_COLUMNS, MemoryView, answered_with_links, view_to_dict
from core.memories.visibility import may_modify, possible_id, visible_by_id, visible_shape, visible_values
from core.refs import memory_ref
from core.tenancy.context import Caller

# The fields a patch sets as given (agent_id / persona in a patch say who acts, never a revised field).
_NOT_FIELDS = {"sync_embed", "linked_entities", "associations", "agent_id", "persona"}
_NOT_NULL = ("content", "kind", "category", "tags")


def patch_memory(session: Session, *, caller: Caller, memory_id: str, patch: PatchMemoryIn) -> dict[str, Any]:
    """Revise a memory in place and commit; its REST shape. Keeps created_at; re-embeds only when the content
    changes; a revision only when a versioned field changes."""
    change_seq, current = _locked(session, caller=caller, memory_id=memory_id, include_forgotten=False)
    if not may_modify(cast(Memory, current), caller):
        raise Forbidden(f"only the owner or an admin may change memory {memory_id!r}")
    changes = patch.model_dump(exclude_unset=True, exclude=_NOT_FIELDS)
    for name in _NOT_NULL:
        if name in changes and changes[name] is None:
            raise Invalid(f"{name} cannot be null", field=name)
    row: dict[str, Any] = dict(changes)
    kind = row.get("kind", current.kind)
    # A new kind brings its default importance only to a memory whose importance is its old kind's default
    # (never set by hand); an importance someone chose is kept. Null importance: back to the kind's default.
    kind_moves_default = (
        "kind" in changes and "importance" not in changes and current.importance == DEFAULT_IMPORTANCE.get(current.kind)
    )
    if kind_moves_default or ("importance" in changes and patch.importance is None):
        row["importance"] = DEFAULT_IMPORTANCE[kind]
    if "occurred_at" in changes and patch.occurred_at is None:
        row["occurred_at"] = current.created_at  # as on a save without occurred_at
    if "linked_entities" in patch.model_fields_set:
        links = LinkResolver(session, tenant_id=caller.tenant_id).resolve(patch.linked_entities, query=None)
        row["entities"] = links.entities
        row["query"] = None if links.query is None else json.dumps(links.query)
        row["query_entities"] = links.query_entities
        if current.status == "stale":
            row["status"], row["stale_reason"] = "active", None
    if patch.associations is not None:
        content = row.get("content", current.content)
        item = SaveMemoryIn(content=content, id=memory_id, associations=patch.associations)
        planned = Planned(index=0, item=item, links=Links(), memory_id=memory_id)
        precheck(session, caller, [planned], set())
        if planned.error is not None:
            raise planned.error
        replace_associations(session, caller=caller, valid=[planned])
    columns = tuple(sorted(row))
    values = {**row, "tenant": caller.tenant_id, "id": memory_id, "change_seq": change_seq, "now": datetime.now(UTC)}
    queries = [sql.Query(("revise", columns), lambda: _revise_statement(columns), values, generic=True)]
    if any(name in row and row[name] != getattr(current, name) for name in VERSION_FIELDS):
        queries.append(versions_query(tenant_id=caller.tenant_id, memory_ids=[memory_id], changed_by=caller.user))
    jobs = []
    if "content" in row and row["content"] != current.content:
        payload = {"doc_ids": [memory_ref(memory_id)]}
        embed, job_id = enqueue_query(tenant_id=caller.tenant_id, kind="embed", payload=payload)
        queries.append(embed)
        jobs.append(job_id)
    queries.append(trail.updated_query(caller, memory_id))
    results = sql.run_many(session, queries, commit=True, before_commit=lambda rows: _queued(session, jobs, rows[-1]))
    revised = results[0][0]
    return view_to_dict(revised[:-1], revised[-1])


def forget_memory(
    session: Session, *, caller: Caller, memory_id: str, reason: str | None = None, purge: bool = False
) -> dict[str, str]:
    """Soft delete (status forgotten) or, with purge, remove the row, its revisions, embeddings and links for good;
    either way references to it are stripped from the other memories (exact match: memory:42 keeps memory:421).
    Commits."""
    change_seq, current = _locked(session, caller=caller, memory_id=memory_id, include_forgotten=purge)
    if not may_modify(cast(Memory, current), caller):
        raise Forbidden(f"only the owner or an admin may forget memory {memory_id!r}")
    queries = removal_queries(
        tenant_id=caller.tenant_id,
        memory_ids=[memory_id],
        change_seq=change_seq,
        changed_by=caller.user,
        reason=reason,
        purge=purge,
    )
    queries.append(trail.forgotten_query(caller, memory_id, purged=purge))
    sql.run_many(session, queries, commit=True, before_commit=lambda rows: _queued(session, [], rows[-1]))
    return {"memory_id": memory_id, "status": "purged" if purge else "forgotten"}


def _locked(session: Session, *, caller: Caller, memory_id: str, include_forgotten: bool) -> tuple[int, MemoryView]:
    """The tenant's next change seq, and the memory as the caller may see it, its row locked (the tenant's row
    first: the one lock order of every write, core.changes.lock_tenant_writes); NotFound when the caller does
    not see it."""
    possible_id(memory_id)
    values = {"tenant": caller.tenant_id, "id": memory_id, **visible_values(caller)}
    lock = sql.Query(
        ("edit-lock", visible_shape(caller), include_forgotten),
        lambda: select(*VIEW_COLUMNS).where(*visible_by_id(caller, include_forgotten)).with_for_update(),
        values,
        generic=True,
    )
    seq, found = sql.run_many(session, [advance_query(caller.tenant_id), lock])
    change_seq = advanced(seq)
    if not found:
        raise NotFound(f"memory {memory_id!r} not found")
    return change_seq, MemoryView._make(found[0])


def _revise_statement(columns: tuple[str, ...]) -> Executable:
    """A patch's write of ``columns`` (parameters of the same names) with its change seq and time, answering
    with the memory's REST columns and its associations (as ``recall_memory`` reads them)."""
    revised = (
        update(Memory)
        .where(Memory.tenant_id == bindparam("tenant", type_=BigInteger), Memory.id == bindparam("id", type_=Text))
        .values(
            {
                **{name: bindparam(name) for name in columns},
                "change_seq": bindparam("change_seq", type_=BigInteger),
                "updated_at": bindparam("now"),
            }
        )
        .returning(*VIEW_COLUMNS)
        .cte("revised")
    )
    return answered_with_links(revised)


def removal_queries(
    *, tenant_id: int, memory_ids: Sequence[str], change_seq: int, changed_by: str, reason: str | None, purge: bool
) -> list[sql.Query]:
    """The statements that forget ``memory_ids`` (distinct) of the tenant at ``change_seq``, or purge them: every
    reference to them stripped from the other memories (a revision each), then either their status, or their
    vectors, revisions, associations, rows, and tombstones so derived indexes drop them. ``changed_by`` is who
    the revisions and a forget are recorded as. The rows of the statement at :func:`removed_at` are the memories
    removed. For one memory (a DELETE) and for many (core.lifecycle.removal)."""
    refs = [memory_ref(memory_id) for memory_id in memory_ids]
    values = {
        "tenant": tenant_id,
        "ids": list(memory_ids),
        "refs": refs,
        "change_seq": change_seq,
        "now": datetime.now(UTC),
        "changed_by": changed_by,
        "reason": reason,
    }
    return [_query(step, values) for step in _steps(purge)]


def removed_at(*, purge: bool) -> int:
    """Where among :func:`removal_queries` the statement answering one row per memory removed is."""
    return _steps(purge).index("drop_memory" if purge else "forget")


def _steps(purge: bool) -> tuple[str, ...]:
    return ("strip", *(_PURGE if purge else ("forget",)))


_REFS = "CAST(:refs AS text[])"
_IDS = "CAST(:ids AS text[])"
# The statements of removal_queries (parameters: tenant, ids, refs = their memory:<id>, change_seq, now, changed_by,
# reason).
_STATEMENTS = {
    # Every memory naming one of them loses the references, kept as a revision each (from the rows it changed).
    "strip": f"""
        WITH stripped AS (
            UPDATE memories
            SET entities = array(SELECT e FROM unnest(memories.entities) AS e WHERE e <> ALL({_REFS})),
                change_seq = :change_seq, updated_at = :now
            WHERE tenant_id = :tenant AND entities && {_REFS}
            RETURNING tenant_id, id, change_seq, content, kind, category, tags, importance, entities, updated_at
        )"""
    + RECORD_FROM.format(source="stripped"),
    "forget": f"""
        UPDATE memories SET status = 'forgotten', forget_reason = :reason, forgotten_by = :changed_by,
                            forgotten_at = :now, change_seq = :change_seq, updated_at = :now
        WHERE tenant_id = :tenant AND id = ANY({_IDS}) AND status <> 'forgotten'
        RETURNING id""",
    "drop_vectors": f"DELETE FROM embeddings WHERE tenant_id = :tenant AND canonical_id = ANY({_REFS})",
    "drop_versions": f"DELETE FROM memory_versions WHERE tenant_id = :tenant AND memory_id = ANY({_IDS})",
    "drop_links": (
        f"DELETE FROM associations WHERE tenant_id = :tenant AND (source_id = ANY({_IDS}) OR target_id = ANY({_IDS}))"
    ),
    "drop_memory": f"DELETE FROM memories WHERE tenant_id = :tenant AND id = ANY({_IDS}) RETURNING id",
    # Derived indexes past this change seq delete the docs.
    "tombstone": TOMBSTONES_SQL,
}
_PURGE = ("drop_vectors", "drop_versions", "drop_links", "drop_memory", "tombstone")
_TEXTS = {name: text(statement) for name, statement in _STATEMENTS.items()}


def _query(step: str, values: dict[str, Any]) -> sql.Query:
    statement = _TEXTS[step]
    return sql.Query(("forget", step), lambda: statement, values, generic=True)


def _queued(session: Session, jobs: list[str], trail_rows: Sequence[Any]) -> None:
    """The jobs the edit wrote (its embed job, the webhook jobs of its events) join the session's outbox."""
    outbox_add(session, [*jobs, *(row[0] for row in trail_rows)])
