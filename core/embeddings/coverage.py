"""Memory coverage from counters: how many memories have an up-to-date embedding of a model, per tenant.

Migration 0018's triggers add a signed delta row whenever a write changes whether a memory's embedding
matches its content (an embed job's upsert, a save, an edit, a forget, a purge), in the writing transaction.
A tenant's count is its folded ``embedding_coverage`` row plus its pending deltas; the expected count is the
tenant's non-forgotten memories from ``search_corpus_stats`` (kept by migration 0003's triggers). So a
coverage read costs a few index lookups whatever the tenant's size, and sees an embed job's work the moment
it commits.

Reconcile (on beat) folds the deltas, and sets a converged tenant's exact count: the one case the deltas
miss is a memory edited while its embedding was being written, where each transaction judged the other's
rows as they were before it.
"""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.orm import Session

# An advisory lock key (in a space of its own) held while deltas are folded or a count is set exactly: two
# of those at once could fold a delta into a count the other then overwrites.
_FOLD_LOCK = (0x636F7665, 1)

_COUNTS = text(
    """
    WITH indexed AS (
        SELECT tenant_id, sum(n) AS n FROM (
            SELECT tenant_id, current AS n FROM embedding_coverage
            WHERE doc_kind = 'memory' AND model = :model AND (:all OR tenant_id IN :tenants)
            UNION ALL
            SELECT tenant_id, delta FROM embedding_coverage_deltas
            WHERE doc_kind = 'memory' AND model = :model AND (:all OR tenant_id IN :tenants)
        ) AS rows GROUP BY tenant_id
    ), expected AS (
        SELECT tenant_id, sum(docs) AS n FROM search_corpus_stats
        WHERE scope = '' AND status <> 'forgotten' AND (:all OR tenant_id IN :tenants)
        GROUP BY tenant_id
    )
    SELECT coalesce(i.tenant_id, e.tenant_id), coalesce(i.n, 0), coalesce(e.n, 0)
    FROM indexed AS i FULL JOIN expected AS e ON e.tenant_id = i.tenant_id
    """
).bindparams(bindparam("tenants", expanding=True))


def memory_counts(session: Session, *, model: str, tenant_ids: list[int] | None) -> dict[int, tuple[int, int]]:
    """{tenant_id: (memories with an up-to-date embedding of `model`, memories expected)}; None: every
    tenant the session may read. A tenant with no memory and no vector is absent."""
    rows = session.execute(
        _COUNTS, {"model": model, "all": tenant_ids is None, "tenants": tenant_ids or [-1]}
    ).all()
    counts: dict[int, tuple[int, int]] = {}
    for tenant_id, indexed, expected in rows:
        # Never above expected: a count awaiting its exact reset must not report more than there is.
        counts[int(tenant_id)] = (max(0, min(int(indexed), int(expected))), int(expected))
    return counts


_FOLD = text(
    """
    WITH moved AS (DELETE FROM embedding_coverage_deltas RETURNING tenant_id, doc_kind, model, delta)
    INSERT INTO embedding_coverage AS c (tenant_id, doc_kind, model, current)
    SELECT tenant_id, doc_kind, model, sum(delta) FROM moved GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (tenant_id, doc_kind, model) DO UPDATE SET current = c.current + excluded.current
    """
)


def fold_deltas(session: Session) -> None:
    """Move every pending delta into its tenant's count (system session; the caller commits)."""
    session.execute(text("SELECT pg_advisory_xact_lock(:a, :b)"), {"a": _FOLD_LOCK[0], "b": _FOLD_LOCK[1]})
    session.execute(_FOLD)


# One statement, so one snapshot: the exact count and the deltas it deletes are of the same moment, and a
# delta committed after it stays to be added on top.
_EXACT = text(
    """
    WITH vectors AS MATERIALIZED (
        SELECT substr(canonical_id, 8) AS memory_id, content_hash FROM embeddings
        WHERE tenant_id = :tenant AND model = :model AND doc_kind = 'memory'
    ), exact AS (
        -- One hash join (nested loops are off for this transaction, see set_exact_count): on statistics a
        -- bulk load left stale, a nested loop here scans the tenant's memories once per vector.
        SELECT count(*) AS n FROM vectors AS e
        JOIN memories AS m ON m.tenant_id = :tenant AND m.id = e.memory_id
        WHERE m.status <> 'forgotten' AND encode(sha256(convert_to(m.content, 'UTF8')), 'hex') = e.content_hash
    ), gone AS (
        DELETE FROM embedding_coverage_deltas
        WHERE tenant_id = :tenant AND doc_kind = 'memory' AND model = :model RETURNING 1
    )
    INSERT INTO embedding_coverage AS c (tenant_id, doc_kind, model, current)
    SELECT :tenant, 'memory', :model, n FROM exact WHERE (SELECT count(*) FROM gone) >= 0
    ON CONFLICT (tenant_id, doc_kind, model) DO UPDATE SET current = excluded.current
    """
)


def set_exact_count(session: Session, *, tenant_id: int, model: str) -> None:
    """Count the tenant's up-to-date embeddings of `model` from the rows themselves (the cost of one hash of
    each memory: reconcile does it only for a tenant whose writes it has just checked)."""
    session.execute(text("SELECT pg_advisory_xact_lock(:a, :b)"), {"a": _FOLD_LOCK[0], "b": _FOLD_LOCK[1]})
    session.execute(text("SET LOCAL enable_nestloop = off"))
    session.execute(_EXACT, {"tenant": tenant_id, "model": model})
