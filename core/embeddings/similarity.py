"""Similarity linking when a memory's embedding lands (CONTRACT section 4).

Cosine above `similarity_update_threshold` with an existing memory of the same owner and agent, and the
evidence core.embeddings.supersede asks for (same entities, near-identical text): the newer memory gets an
`updates` association to the older, and the older's `superseded_by` names the newer (both stay active).
Between the suggest and update thresholds, or above without that evidence, the match is only reported
(`similar_existing`).

Comparing every new vector with the tenant's corpus in SQL costs a scan per memory; instead the new vectors
are compared with the process's matrix of the tenant's stored vectors (core.embeddings.matrix, the one search
uses, refreshed with the rows written since) and with each other, and only the candidates above the
threshold that matters are checked against the database (owner, agent, status, still existing).

`plan_links` only reads; the `LinkPlan` it returns is written by one statement per kind of write, whatever
the number of links, which core.embeddings.refresh pipelines with the embeddings upsert at the end of the
job's transaction, so the rows they lock stay locked only until the commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
from psycopg.rows import class_row
from sqlalchemy.orm import Session

from core.embeddings.matrix import Side, tenant_matrix, unit_rows, vector_stats
from core.embeddings.supersede import may_supersede
from core.embeddings.wire import driver_connection
from core.refs import MEMORY_PREFIX

_CANDIDATES = 8
_SUGGESTED_CHARS = 200

# The writes of a plan, for a raw psycopg cursor (core.embeddings.refresh runs them with the embeddings
# upsert in one pipeline, at the end of the transaction). The rows to update are locked first in id order,
# so two jobs superseding the same memories wait for each other instead of deadlocking.
_LOCK_OLDER = (
    "SELECT 1 FROM memories WHERE tenant_id = %(tenant)s AND id = ANY(%(older)b::text[]) ORDER BY id FOR NO KEY UPDATE"
)
_SUPERSEDE = (
    "UPDATE memories AS m SET superseded_by = v.newer"
    " FROM unnest(%(older)b::text[], %(newer)b::text[]) AS v(older, newer)"
    " WHERE m.tenant_id = %(tenant)s AND m.id = v.older AND m.superseded_by IS DISTINCT FROM v.newer"
)
_LINK = (
    "INSERT INTO associations (tenant_id, source_id, target_id, relation_type, weight)"
    " SELECT %(tenant)s::bigint, v.source, v.target, 'updates', v.weight"
    " FROM unnest(%(source)b::text[], %(target)b::text[], %(weight)b::float8[]) AS v(source, target, weight)"
    " ORDER BY v.source, v.target ON CONFLICT DO NOTHING"
)


@dataclass
class LinkPlan:
    """What linking decided: suggestions per new memory id, `superseded` (older id -> newer id) and the
    `updates` edges (newer id, older id) -> weight, to be written by `statements`."""

    suggestions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    superseded: dict[str, str] = field(default_factory=dict)
    edges: dict[tuple[str, str], float] = field(default_factory=dict)

    def statements(self, *, tenant_id: int) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        if self.superseded:
            older = sorted(self.superseded)
            params = {"tenant": tenant_id, "older": older, "newer": [self.superseded[o] for o in older]}
            out += [(_LOCK_OLDER, params), (_SUPERSEDE, params)]
        if self.edges:
            pairs = sorted(self.edges)
            out.append(
                (
                    _LINK,
                    {
                        "tenant": tenant_id,
                        "source": [s for s, _ in pairs],
                        "target": [t for _, t in pairs],
                        "weight": [self.edges[p] for p in pairs],
                    },
                )
            )
        return out


def _committed(session: Session, *, tenant_id: int, model: str, dims: int) -> Side:
    """The memory side of the tenant's shared matrix (core.embeddings.matrix), as committed so far."""
    stats = vector_stats(session, tenant_id=tenant_id, model=model)
    matrix = tenant_matrix(session, tenant_id=tenant_id, model=model, dims=dims, version=stats.version)
    return matrix.memories


def _nearest(
    side: Side, memory_ids: list[str], block: np.ndarray, *, floor: float
) -> dict[str, list[tuple[str, float]]]:
    """The best candidates (up to _CANDIDATES, best first) of each new vector among the stored memories and
    the other new ones, in one matrix product, keeping only scores of at least `floor`: the top candidates
    of a row that score that much are exactly its candidates above the floor, best first, cut at the top's
    size. `block` holds the new unit vectors, row for row with `memory_ids`; a stored row of a new memory
    (its older vector) and a new memory's own row are never candidates."""
    new = {MEMORY_PREFIX + memory_id for memory_id in memory_ids}
    stale = [row for row in (side.row(doc_id) for doc_id in new) if row is not None]
    scores = np.hstack([block @ side.matrix.T, block @ block.T])  # (new, stored + new)
    if stale:
        scores[:, stale] = -np.inf
    np.fill_diagonal(scores[:, side.n :], -np.inf)
    ids = [*side.memory_ids, *memory_ids]
    n = scores.shape[1]
    k = min(_CANDIDATES, n)
    if k == 0:
        return {mid: [] for mid in memory_ids}
    hits = scores >= floor
    if int(np.count_nonzero(hits)) > 4 * k * len(memory_ids):
        # Dense above the floor (a low suggest threshold): partial sort of each row instead.
        top = np.argpartition(scores, n - k, axis=1)[:, n - k :]
        rows = np.repeat(np.arange(len(memory_ids)), k)
        cols = top.reshape(-1)
        keep = hits[rows, cols]
        rows, cols = rows[keep], cols[keep]
    else:
        rows, cols = np.nonzero(hits)
    values = scores[rows, cols]
    order = np.lexsort((-values, rows))
    rows, cols, values = rows[order], cols[order], values[order]
    bounds = np.searchsorted(rows, np.arange(len(memory_ids) + 1)).tolist()
    cols_list, values_list = cols.tolist(), values.tolist()
    out: dict[str, list[tuple[str, float]]] = {}
    for row, memory_id in enumerate(memory_ids):
        lo = bounds[row]
        hi = min(bounds[row + 1], lo + k)
        out[memory_id] = [(ids[c], v) for c, v in zip(cols_list[lo:hi], values_list[lo:hi], strict=True)]
    return out


class _Candidate(NamedTuple):
    id: str
    status: str
    created_by: str
    agent_id: str | None
    created_at: datetime
    content: str
    entities: list[str] | None


# What linking checks of each memory involved (content and entities: the evidence a supersede needs).
_CANDIDATES_SQL = (
    "SELECT id, status, created_by, agent_id, created_at, content, entities FROM memories"
    " WHERE tenant_id = %(tenant)s AND id = ANY(%(ids)b::text[]) AND status <> 'forgotten'"
)


def plan_links(
    session: Session,
    *,
    tenant_id: int,
    model: str,
    new_vectors: dict[str, np.ndarray],
    update_threshold: float,
    suggest_threshold: float,
    suggestions: bool = True,
) -> LinkPlan:
    """Find each newly embedded memory's near-duplicates (reads only; the plan's statements write).

    Without `suggestions` (background jobs: nobody reads them) only links are planned, and matches below
    the update threshold are not even looked up.
    """
    plan = LinkPlan()
    if not new_vectors:
        return plan
    memory_ids = list(new_vectors)
    block = unit_rows(np.stack([np.asarray(new_vectors[m], dtype=np.float32) for m in memory_ids]))
    side = _committed(session, tenant_id=tenant_id, model=model, dims=int(block.shape[1]))
    # Below the suggest threshold a candidate does nothing; without suggestions, below the update threshold.
    floor = suggest_threshold if suggestions else max(suggest_threshold, update_threshold)
    nearest = _nearest(side, memory_ids, block, floor=floor)
    if not suggestions:
        nearest = {m: [(o, s) for o, s in pairs if s > update_threshold] for m, pairs in nearest.items()}
    nearest = {m: pairs for m, pairs in nearest.items() if pairs}
    wanted = set(nearest) | {cid for pairs in nearest.values() for cid, _ in pairs}
    if not wanted:
        return plan
    with driver_connection(session).cursor(row_factory=class_row(_Candidate), binary=True) as cursor:
        params = {"tenant": tenant_id, "ids": sorted(wanted)}
        rows = {row.id: row for row in cursor.execute(_CANDIDATES_SQL, params)}
    for memory_id, pairs in nearest.items():
        me = rows.get(memory_id)
        if me is None:
            continue
        for other_id, score in pairs:
            other = rows.get(other_id)
            if other is None or score < suggest_threshold or other.status != "active":
                continue
            if other.created_by != me.created_by or other.agent_id != me.agent_id:
                continue
            newer, older = (me, other) if (me.created_at, me.id) >= (other.created_at, other.id) else (other, me)
            if score > update_threshold and may_supersede(
                older_text=older.content,
                newer_text=newer.content,
                older_entities=older.entities or [],
                newer_entities=newer.entities or [],
            ):
                plan.edges[(newer.id, older.id)] = round(min(max(score, 0.0), 1.0), 4)
                plan.superseded[older.id] = newer.id
            elif suggestions:
                plan.suggestions.setdefault(memory_id, []).append(
                    {"memory_id": other_id, "score": round(score, 4), "content": other.content[:_SUGGESTED_CHARS]}
                )
    return plan
