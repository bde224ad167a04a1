"""Memory writes and reads: save (single and batch), get, patch, forget, purge, list.

Every function takes the caller's session (the caller owns the unit of work) and a :class:`Caller`.
A write bumps the tenant's ``change_seq`` and stamps the rows it touches with it, so derived indexes
(full-text, entity statistics) know what to catch up on; embedding work is queued in the same
transaction (the outbox). Every save, upsert and patch that changes a memory keeps the result as a revision
(core.memories.history); the REST shape of a memory is core.memories.views.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Executable,
    TextClause,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from core import sql
from core.errors import EngramError, Forbidden, Invalid, NotFound
from core.jobs.service import new_job_id, outbox_add
from core.jsontext import json_bytes
from core.memories import trail
from core.memories.history import CURRENT_COLUMNS, history_of, revisions_statement
from core.memories.ids import integer_value
from core.memories.links import LinkResolver, Links
from core.memories.models import Association, Memory
from core.memories.schemas import DEFAULT_IMPORTANCE, SaveMemoryIn, SaveResult
from core.memories.views import VIEW_COLUMNS, answered_with_links, view_to_dict
from core.memories.views import memories_to_dicts as memories_to_dicts
from core.memories.views import memory_to_dict as memory_to_dict
from core.memories.visibility import (
    is_visible,
    may_modify,
    possible_id,
    visible_by_id,
    visible_shape,
    visible_values,
)
from core.refs import MEMORY_PREFIX
from core.tenancy.context import Caller
from core.tenancy.quotas import exceeded, memory_quota
from core.tracing import job_context


@dataclass
class Planned:
    index: int
    item: SaveMemoryIn
    links: Links
    memory_id: str | None = None
    error: EngramError | None = None
    existing: Memory | None = None
    auto_ordinal: int = 0
    warnings: list[str] = field(default_factory=list)


def precheck(session: Session, caller: Caller, planned: list[Planned], batch_ids: set[str]) -> None:
    """Per-item checks that need the database: upsert ownership and association targets."""
    supplied = [p.item.id for p in planned if p.item.id is not None and p.error is None]
    existing = {}
    if supplied:
        rows = session.scalars(select(Memory).where(Memory.id.in_(supplied)).with_for_update()).all()
        existing = {m.id: m for m in rows}
    targets = {a.target_id for p in planned for a in p.item.associations}
    known_targets = set()
    if targets:
        known_targets = set(session.scalars(select(Memory.id).where(Memory.id.in_(targets))).all())
    for p in planned:
        if p.error is not None:
            continue
        current = existing.get(p.item.id) if p.item.id is not None else None
        if current is not None:
            if not caller.is_admin and not is_visible(current, caller):
                p.error = Invalid(f"id {p.item.id!r} is already used by a memory you cannot see", field="id")
                continue
            if not may_modify(current, caller):
                p.error = Forbidden(f"memory {p.item.id!r} belongs to another user")
                continue
            p.existing = current
        for i, assoc in enumerate(p.item.associations):
            if assoc.target_id not in known_targets and assoc.target_id not in batch_ids:
                p.error = Invalid(
                    f"association target {assoc.target_id!r} does not exist",
                    field=f"associations.{i}.target_id",
                )
                break


def _hold_to_quota(planned: list[Planned], *, limit: int, count: int) -> None:
    """Refuse, in input order, the items that would add a memory past the tenant's max_memories: an item adds
    one unless it upserts a memory that is kept and not forgotten (an id repeated in the batch adds once)."""
    added: set[str] = set()
    for p in planned:
        if p.error is not None:
            continue
        adds = p.existing is None or p.existing.status == "forgotten"
        key = p.item.id if p.item.id is not None else f"#{p.index}"
        if not adds or key in added:
            continue
        if count + len(added) >= limit:
            p.error = exceeded("max_memories", limit, what="memories")
            continue
        added.add(key)


def save_memories(
    session: Session,
    *,
    caller: Caller,
    items: Sequence[SaveMemoryIn | EngramError],
    action: str | None = None,
    finish: bool = False,
) -> list[SaveResult | EngramError]:
    """Save many memories in the caller's transaction; invalid items come back as errors, in order.

    With ``action`` (``memory.save``), the saved items' audit entries (that action) and webhook events
    (core.memories.trail) are written by the save's own statement; without, the caller records its own.
    ``finish``: the caller runs nothing after the save in this transaction, so when the save's statement is
    its last the session is committed with it, in the same round trip (core.sql).
    """
    resolver = LinkResolver(session, tenant_id=caller.tenant_id)
    batch_ids = {item.id for item in items if isinstance(item, SaveMemoryIn) and item.id is not None}
    resolver.also_existing(batch_ids)
    planned: list[Planned] = []
    for index, item in enumerate(items):
        if isinstance(item, EngramError):
            continue
        p = Planned(index=index, item=item, links=Links())
        if item.linked_entities is not None or item.query is not None:
            try:
                p.links = resolver.resolve(item.linked_entities, query=item.query)
            except EngramError as exc:
                p.error = exc
        planned.append(p)
    valid = [p for p in planned if p.error is None]
    # New memories only (no id to check the ownership of, no association target to find): one statement
    # takes the tenant's row, checks its state and quota under it and writes everything, or writes nothing
    # when the quota would be passed (then the items are held to it one by one below).
    written = bool(valid) and _write_new(session, caller, valid, action=action, finish=finish)
    if not written:
        # The tenant's row first (its quota and count, and the ids every save reserves there), then its memories.
        limit, count = memory_quota(session, tenant_id=caller.tenant_id)
        precheck(session, caller, planned, batch_ids)
        if limit is not None:
            _hold_to_quota(planned, limit=limit, count=count)
        valid = [p for p in planned if p.error is None]
        if valid and not _write(session, caller, valid, action=action, quota_checked=True, finish=finish):
            raise AssertionError("the tenant's row was locked above")
    # Which saves were upserts of existing memories (core.memories.trail tells memory.updated from .created).
    session.info["memories_upserted"] = {p.item.id for p in valid if p.existing is not None}
    results: list[SaveResult | EngramError] = list(items)  # type: ignore[arg-type]
    for p in planned:
        if p.error is not None:
            results[p.index] = p.error
        else:
            assert p.memory_id is not None
            results[p.index] = SaveResult(memory_id=p.memory_id, entities=p.links.entities, warnings=p.links.warnings)
    return results


def _write_new(session: Session, caller: Caller, valid: list[Planned], *, action: str | None, finish: bool) -> bool:
    """The write of items that only add memories, with the tenant's state and quota checked in the same
    statement; False (nothing written) when an item names an id or associations, or the quota needs a look."""
    if any(p.item.id is not None or p.item.associations for p in valid):
        return False
    return _write(session, caller, valid, action=action, quota_checked=False, finish=finish)


def _write(
    session: Session, caller: Caller, valid: list[Planned], *, action: str | None, quota_checked: bool, finish: bool
) -> bool:
    """Write the valid items, advance the tenant's sequences and queue their embed job in ONE statement
    (with ``action``, their audit entries and events too).

    The ids of items without one are reserved from the tenant's ``memory_seq`` inside the statement, so a
    save costs a single round trip (and one firing of the statistics triggers, whatever the batch size).
    Unless ``quota_checked`` (the caller holds the tenant's row and held the items to its quota), the
    statement takes the row itself and writes only if the tenant is not being offboarded and every item fits
    its max_memories (each adds one: no item names an id); False when it wrote nothing. With ``finish``, when
    nothing is left to write after it (no association to replace), the statement commits the session too.
    """
    supplied_ints = [integer_value(p.item.id) for p in valid if p.item.id is not None]
    supplied_max = max([v for v in supplied_ints if v is not None], default=0)
    rows: dict[str, dict[str, Any]] = {}
    trail_rows: list[list[Any]] = []
    n_auto = 0
    for p in valid:
        if p.item.id is None:
            n_auto += 1
            key = f"#{n_auto}"
        else:
            key = p.item.id
        rows.pop(key, None)  # later duplicates of an id in one batch win, as consecutive upserts would
        rows[key] = _row_values(caller, p, auto=n_auto if p.item.id is None else None)
        if action is not None and quota_checked:
            trail_rows.append([p.item.id, p.auto_ordinal or None, p.existing is not None, p.item.kind, p.item.category])
    ordered = list(rows.values())
    for ordinal, row in enumerate(ordered):
        row["ord"] = ordinal
    job_id = new_job_id()
    params: dict[str, Any] = {
        "tenant_id": caller.tenant_id,
        "supplied_max": supplied_max,
        "n_auto": n_auto,
        "rows": _json(ordered),
        "base_time": datetime.now(UTC),
        "job_id": job_id,
        "job_context": json.dumps({"context": context} if (context := job_context()) else {}),
    }
    new_only = not quota_checked  # the statement checks the quota itself only for new memories
    events = not new_only or action is None or caller.tenant_id in _LISTENED_TO
    if action is not None:
        params.update(trail.saved_params(caller, action=action, count=len(valid)))
        if not new_only:
            params["trail"] = _json(trail_rows)
    # Associations of upserted memories are replaced after the statement; otherwise it may end the transaction.
    last = finish and all(p.existing is None and not p.item.associations for p in valid)

    def settle(answer: Sequence[Any] | None) -> None:  # (before the commit, for its hooks)
        if answer is not None and answer[0] is not None:
            outbox_add(session, [job_id, *(answer[2] or ())])  # the embed job, and the webhook jobs of the events

    single = len(ordered) == 1
    shape = (new_only, action is not None, events)
    answer = _run_save(session, shape, params, single=single, commit=last, settle=settle)
    if answer is not None and answer[0] is None and answer[3]:
        # A webhook listens after all: nothing was written; again, with the events.
        _LISTENED_TO.add(caller.tenant_id)
        answer = _run_save(session, (new_only, True, True), params, single=single, commit=last, settle=settle)
    if answer is None or answer[0] is None:
        return False
    if answer[3] is False:  # nobody listens (any more): the next saves leave the events out
        _LISTENED_TO.discard(caller.tenant_id)
    memory_seq = answer[0]
    first_auto = int(memory_seq) - n_auto + 1
    for p in valid:
        p.memory_id = p.item.id if p.item.id is not None else str(first_auto + p.auto_ordinal - 1)
    replace_associations(session, caller=caller, valid=valid)
    return True


def _run_save(
    session: Session,
    shape: tuple[bool, bool, bool],
    params: dict[str, Any],
    *,
    single: bool,
    commit: bool,
    settle: Callable[[Sequence[Any] | None], None],
) -> Sequence[Any] | None:
    """The save statement's answer row (None: no row), given to ``settle`` before anything commits. ``commit``:
    the session is committed with it (core.sql.run).

    It writes by key only (the tenant's row, the items' ids, a job's id). A ``single`` row's statement runs on
    its generic plan, prepared once per connection (core.sql): planned for its values it cost PostgreSQL ~0.45
    ms a save. A statement of several rows is planned for its values: under the generic plans' setting the
    foreign-key checks of its rows (one per row and key, run by PostgreSQL inside the statement) run on their
    cached generic plans too, and one made while the tables had no statistics yet (a new database, until
    autovacuum's first ANALYZE) checks ``memory_versions`` against ``memories`` by a scan of the tenant's rows:
    a 1,000-item batch at a few thousand memories took 230 ms, and longer as the tenant grew, against ~80 ms
    planned (``engram bench write``, docs/benchmarks.md)."""
    statement = _SAVE_STATEMENTS[shape]
    query = sql.Query(("save", *shape), lambda: statement, params, generic=single)
    rows = sql.run(session, query, commit=commit, before_commit=lambda results: settle(_first(results[0])))
    return _first(rows)


def _first(rows: Sequence[Any]) -> Any:
    return rows[0] if rows else None


def _json(value: Any) -> str:
    """`value` as JSON text for a statement's parameter (a 1,000-item batch's rows in ~0.4 ms by orjson, against
    ~4 ms for json.dumps)."""
    return json_bytes(value).decode()


_WRITTEN = (
    "content", "kind", "category", "importance", "occurred_at", "tags", "source", "run_id", "persona",
    "agent_id", "entities", "query", "query_entities", "status", "stale_reason", "forget_reason", "forgotten_by",
    "forgotten_at", "updated_at", "change_seq",
)  # fmt: skip

# One statement: reserve ids and a change_seq under the tenant's row lock, upsert the rows (an upsert keeps
# created_at, created_by and access counters), keep each as a revision, and add the embed job to the outbox.
# The rows travel as one JSON document; ``auto`` is the 1-based rank of an item that gets a reserved id.
# For new memories only, the tenant's row is taken here only if the tenant is not being offboarded and
# :n_auto more memories fit its max_memories (a quota is a JSON number; none, or null, is unlimited), with
# :data:`_HELD`; otherwise nothing at all is written and no row comes back.
_SEQ_AND_ITEMS = """
    seq AS (
        UPDATE tenants
        SET memory_seq = greatest(memory_seq, CAST(:supplied_max AS numeric)) + :n_auto, change_seq = change_seq + 1
        WHERE id = :tenant_id{held}
        RETURNING memory_seq, change_seq
    ), items AS (
        SELECT coalesce(r.id, (seq.memory_seq - :n_auto + r.auto)::text) AS memory_id, r.*,
               CAST(:base_time AS timestamptz) + r.ord * interval '1 microsecond' AS created_at,
               seq.change_seq
        FROM json_to_recordset(CAST(:rows AS json)) AS r(
            ord int, id text, auto int, content text, kind text, category text, importance float8,
            occurred_at timestamptz, tags text[], source text, run_id text, persona text, agent_id text,
            entities text[], query jsonb, query_entities text[], created_by text
        ) CROSS JOIN seq
    )"""
_HELD = """ AND state <> 'deleting' AND (
            jsonb_typeof(quotas -> 'max_memories') IS DISTINCT FROM 'number'
            OR memory_count + :n_auto <= CAST(quotas ->> 'max_memories' AS numeric)
        )"""
_UPSERT = f"ON CONFLICT (tenant_id, id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in _WRITTEN)}"
_ROWS = f"""
    saved AS (
        INSERT INTO memories (
            tenant_id, id, content, kind, category, importance, occurred_at, tags, source, run_id, persona,
            agent_id, entities, query, query_entities, status, created_by, created_at, updated_at, access_count,
            change_seq
        )
        SELECT :tenant_id, memory_id, content, kind, category, importance, coalesce(occurred_at, created_at), tags,
               source, run_id, persona, agent_id, entities, query, query_entities, 'active', created_by, created_at,
               created_at, 0, change_seq
        FROM items ORDER BY ord
        {{upsert}}
        RETURNING 1
    ), version AS (
        INSERT INTO memory_versions (
            tenant_id, memory_id, change_seq, content, kind, category, tags, importance, entities,
            changed_by, changed_at
        )
        SELECT :tenant_id, memory_id, change_seq, content, kind, category, coalesce(tags, '{{{{}}}}'), importance,
               coalesce(entities, '{{{{}}}}'), created_by, created_at
        FROM items
        RETURNING 1
    ), job AS (
        INSERT INTO jobs (id, tenant_id, kind, state, payload, attempts, created_at, updated_at)
        SELECT :job_id, :tenant_id, 'embed', 'queued',
               jsonb_build_object('doc_ids', jsonb_agg('{MEMORY_PREFIX}' || memory_id ORDER BY ord))
                   || CAST(:job_context AS jsonb),
               0, now(), now()
        FROM items
        HAVING count(*) > 0
        RETURNING 1
    )"""
# The saved items' audit entries and events (core.memories.trail) come from the CTE `trail`: for new memories
# only, the items themselves (each is one item, in input order); otherwise :trail holds one
# [id, auto, updated, kind, category] per saved item in input order (an id repeated in a batch is saved
# once, as its last item, and has an entry and event per item).
_TRAIL_OF_NEW = "trail AS (SELECT auto AS n, memory_id, false AS updated, kind, category FROM items)"
_TRAIL = """trail AS (
        SELECT t.n, coalesce(t.a ->> 0, (seq.memory_seq - :n_auto + CAST(t.a ->> 1 AS int))::text) AS memory_id,
               CAST(t.a ->> 2 AS boolean) AS updated, t.a ->> 3 AS kind, t.a ->> 4 AS category
        FROM json_array_elements(CAST(:trail AS json)) WITH ORDINALITY AS t(a, n) CROSS JOIN seq
    )"""


def _save_statement(*, new_only: bool, with_trail: bool, with_events: bool = True) -> TextClause:
    """The save's statement: for new memories only (auto ids, never taken: memory_seq stays past every
    integer id a tenant names) a plain insert, which plans and runs cheaper than an upsert (no conflict
    arbiter, no statement of the update triggers); with the trail, the entries and events too, or (new
    memories only) the entries alone, writing nothing if a webhook turns out to listen. The answer: the
    tenant's sequences (none: nothing written), the webhook jobs queued, whether a webhook listens."""
    held = _HELD if new_only else ""
    ctes = [_ROWS.format(upsert="" if new_only else _UPSERT)]
    answer = "SELECT memory_seq, change_seq, NULL, NULL FROM seq"
    if with_trail:
        ctes += [_TRAIL_OF_NEW if new_only else _TRAIL, trail.SAVED_ENTRIES]
        if with_events:
            ctes.append(trail.SAVED_EVENTS)
            listens = trail.NEW_ONLY_SUBSCRIBED if new_only else "NULL"
            answer = f"SELECT memory_seq, change_seq, (SELECT array_agg(id) FROM webhook_jobs), {listens} FROM seq"
        else:
            assert new_only
            ctes.insert(0, f"listening AS (SELECT {trail.NEW_ONLY_SUBSCRIBED} AS yes)")
            held += " AND NOT (SELECT yes FROM listening)"
            answer = "SELECT s.memory_seq, s.change_seq, NULL, l.yes FROM listening AS l LEFT JOIN seq AS s ON true"
    ctes.insert(1 if ctes[0].startswith("listening") else 0, _SEQ_AND_ITEMS.format(held=held))
    return text(f"WITH {', '.join(ctes)} {answer}")


_SAVE_STATEMENTS = {
    (new_only, with_trail, with_events): _save_statement(
        new_only=new_only, with_trail=with_trail, with_events=with_events
    )
    for new_only in (False, True)
    for with_trail in (False, True)
    for with_events in (False, True)
    if with_events or (new_only and with_trail)
}
# Tenants this process last saw with an enabled webhook listening to memory.created: their saves of new
# memories write the events at once; the others' leave them out, and write nothing (then again, with them)
# if one listens after all, which the statement tells.
_LISTENED_TO: set[int] = set()


def _row_values(caller: Caller, p: Planned, *, auto: int | None) -> dict[str, Any]:
    item = p.item
    p.auto_ordinal = auto or 0
    row: dict[str, Any] = {
        "id": item.id,
        "auto": auto,
        "content": item.content,
        "kind": item.kind,
        "category": item.category,
        "importance": item.importance if item.importance is not None else DEFAULT_IMPORTANCE[item.kind],
        "occurred_at": item.occurred_at.isoformat() if item.occurred_at is not None else None,
        "tags": list(dict.fromkeys(item.tags)),
        "source": item.source,
        "run_id": item.run_id,
        **caller.stamp(agent_id=item.agent_id, persona=item.persona),
        "entities": p.links.entities,
        "created_by": caller.user,
    }
    if p.links.query is not None:
        row["query"] = p.links.query
        row["query_entities"] = p.links.query_entities
    return row


def replace_associations(session: Session, *, caller: Caller, valid: list[Planned]) -> None:
    upserted = [p.memory_id for p in valid if p.existing is not None]
    if upserted:
        session.execute(delete(Association).where(Association.source_id.in_(upserted)))
    edges: dict[tuple[str, str, str], float] = {}
    for p in valid:
        for assoc in p.item.associations:
            assert p.memory_id is not None
            edges[(p.memory_id, assoc.target_id, assoc.relation_type)] = assoc.weight
    if edges:
        stmt = pg_insert(Association).values(
            [
                {
                    "tenant_id": caller.tenant_id,
                    "source_id": s,
                    "target_id": t,
                    "relation_type": r,
                    "weight": w,
                }
                for (s, t, r), w in edges.items()
            ]
        )
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=["tenant_id", "source_id", "target_id", "relation_type"],
                set_={"weight": stmt.excluded.weight},
            )
        )


def save_memory(
    session: Session, *, caller: Caller, item: SaveMemoryIn, action: str | None = None, finish: bool = False
) -> SaveResult:
    result = save_memories(session, caller=caller, items=[item], action=action, finish=finish)[0]
    if isinstance(result, EngramError):
        raise result
    return result


def recall_memory(
    session: Session, *, caller: Caller, memory_id: str, include_forgotten: bool = False, commit: bool = False
) -> dict[str, Any]:
    """Exact recall by id, in the REST shape; counts an access. One statement on its generic plan (core.sql):
    the access is counted on the row it returns, which brings its associations along. Through the ORM (an
    UPDATE ... RETURNING, then the associations) a get cost about twice the API CPU of a save.

    ``commit``: commit the session with it (a request whose transaction is only this): begun, run and
    committed in one round trip."""
    if include_forgotten and not caller.is_admin:
        raise Forbidden("include_forgotten needs an admin key")
    possible_id(memory_id)
    key = ("recall", visible_shape(caller), include_forgotten)
    values = {"tenant": caller.tenant_id, "id": memory_id, **visible_values(caller)}
    query = sql.Query(key, lambda: _recall_statement(caller, include_forgotten), values, generic=True)
    rows = sql.run(session, query, commit=commit)
    if not rows:
        raise NotFound(f"memory {memory_id!r} not found")
    return view_to_dict(rows[0][:-1], rows[0][-1])


def _recall_statement(caller: Caller, include_forgotten: bool) -> Executable:
    """recall_memory's statement for callers of ``caller``'s shape (parameters: tenant, id, the caller's)."""
    counted = (
        update(Memory)
        .where(*visible_by_id(caller, include_forgotten))
        .values(access_count=Memory.access_count + 1, last_accessed_at=func.now())
        .returning(*VIEW_COLUMNS)
        .cte("counted")
    )
    return answered_with_links(counted)


def memory_history(
    session: Session, *, caller: Caller, memory_id: str, include_forgotten: bool = False
) -> list[dict[str, Any]]:
    """The memory's revisions, newest first (the current one first); visible as for get, no access counted."""
    if include_forgotten and not caller.is_admin:
        raise Forbidden("include_forgotten needs an admin key")
    possible_id(memory_id)
    values = {"tenant": caller.tenant_id, "id": memory_id, **visible_values(caller)}
    current = sql.Query(
        ("history-current", visible_shape(caller), include_forgotten),
        lambda: _current_statement(caller, include_forgotten),
        values,
        generic=True,
    )
    found, revisions = sql.run_many(session, [current, sql.Query("history", revisions_statement, values, generic=True)])
    if not found:
        raise NotFound(f"memory {memory_id!r} not found")
    return history_of(found[0], revisions)


def _current_statement(caller: Caller, include_forgotten: bool) -> Executable:
    """memory_history's read of the memory as it stands, for callers of ``caller``'s shape (parameters: tenant,
    id, the caller's)."""
    return select(*CURRENT_COLUMNS).where(*visible_by_id(caller, include_forgotten))


def set_statement_timeout(session: Session, *, milliseconds: int) -> None:
    session.execute(text(f"SET LOCAL statement_timeout = {int(milliseconds)}"))
