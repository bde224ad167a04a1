"""fair job scheduling and coverage counters

Two partial indexes for the relay (core.jobs.relay): it ranks each tenant's undispatched jobs by age and
counts the jobs in flight per lane on every round, and both read only a small index, however many finished
jobs the table keeps.

Coverage counters (core.embeddings.coverage): how many of a tenant's memories have an embedding of a model
made from their current content, kept by statement-level triggers on ``memories`` and ``embeddings`` in the
writing transaction, so `GET /v1/ops/coverage` reads a few rows instead of hashing every memory. The triggers
only *insert* signed deltas (``embedding_coverage_deltas``): an insert never waits on another transaction,
so neither saves nor embed jobs gain a lock or a lock-order hazard. Reconcile folds the deltas into
``embedding_coverage`` and, for a tenant it finds converged, sets the exact count (a memory edited while its
embedding was being written can leave a delta that neither transaction could see the other's side of).

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


_HASH = "encode(sha256(convert_to({content}, 'UTF8')), 'hex')"

# What each write does to the counts, per (tenant, model), without a lookup on the hot paths:
# - an embed job's upsert writes vectors made from the memories' content as it read it in the same
#   transaction: a vector inserted counts +1; one updated counts +1 when its hash changed (the old one no
#   longer matched the content) and 0 when it did not. (A memory edited between that read and the upsert's
#   commit is the race the exact count of reconcile repairs.)
# - a memory inserted has no vector yet: nothing to count.
# - a memory whose content changed, or that was forgotten, deleted or brought back, and a vector deleted:
#   their counterparts are looked up (rare writes). Each lookup is by primary key: the key is computed first
#   (a MATERIALIZED CTE: under row security a clause with a function that is not leakproof, such as
#   `'memory:' || id`, is never an index condition), and the lookup is a LATERAL subquery kept apart and
#   ordered as the primary key (with statistics still saying the tenant is empty, every index on tenant_id
#   looks as cheap as the key, and a join scanned and hashed the tenant's table once per written row).
_CHANGED_MEMORIES = {
    # +1 for a memory's new content, -1 for its old one; rows whose content and forgotten-ness did not change
    # cancel out in the grouping (no join of the transition tables, which have no index).
    "update": "SELECT tenant_id, id, content, sum(sign) AS sign FROM ("
    " SELECT tenant_id, id, content, 1 AS sign FROM new_rows WHERE status <> 'forgotten'"
    " UNION ALL SELECT tenant_id, id, content, -1 FROM old_rows WHERE status <> 'forgotten'"
    ") AS u GROUP BY tenant_id, id, content HAVING sum(sign) <> 0",
    "delete": "SELECT tenant_id, id, content, -1 AS sign FROM old_rows WHERE status <> 'forgotten'",
}
_MEMORY_DELTA = f"""
    WITH d AS MATERIALIZED (
        SELECT r.tenant_id, 'memory:' || r.id AS canonical_id, r.content, r.sign FROM ({{rows}}) AS r
    )
    INSERT INTO embedding_coverage_deltas (tenant_id, doc_kind, model, delta)
    SELECT e.tenant_id, 'memory', e.model, sum(d.sign)
    FROM d
    CROSS JOIN LATERAL (
        SELECT x.tenant_id, x.model FROM embeddings AS x
        WHERE x.tenant_id = d.tenant_id AND x.canonical_id = d.canonical_id
          AND x.content_hash = {_HASH.format(content="d.content")}
        ORDER BY x.tenant_id, x.canonical_id, x.model
        OFFSET 0
    ) AS e
    WHERE EXISTS (SELECT 1 FROM tenants AS t WHERE t.id = d.tenant_id)
    GROUP BY e.tenant_id, e.model HAVING sum(d.sign) <> 0
"""
_WRITTEN_VECTORS = """
    INSERT INTO embedding_coverage_deltas (tenant_id, doc_kind, model, delta)
    SELECT w.tenant_id, 'memory', w.model, count(*)
    FROM ({rows}) AS w
    WHERE EXISTS (SELECT 1 FROM tenants AS t WHERE t.id = w.tenant_id)
    GROUP BY w.tenant_id, w.model
"""
_VECTORS_WRITTEN = {
    "insert": "SELECT tenant_id, model FROM new_rows WHERE doc_kind = 'memory'",
    # A vector whose (id, model, hash) is in both old and new rows was rewritten unchanged.
    "update": "SELECT tenant_id, model FROM ("
    " SELECT tenant_id, canonical_id, model, content_hash, 1 AS sign FROM new_rows WHERE doc_kind = 'memory'"
    " UNION ALL SELECT tenant_id, canonical_id, model, content_hash, -1 FROM old_rows WHERE doc_kind = 'memory'"
    ") AS u GROUP BY tenant_id, canonical_id, model, content_hash HAVING sum(sign) > 0",
}
_VECTORS_DELETED = f"""
    WITH d AS MATERIALIZED (
        SELECT tenant_id, substr(canonical_id, 8) AS memory_id, model, content_hash FROM old_rows
        WHERE doc_kind = 'memory'
    )
    INSERT INTO embedding_coverage_deltas (tenant_id, doc_kind, model, delta)
    SELECT d.tenant_id, 'memory', d.model, -count(*)
    FROM d
    CROSS JOIN LATERAL (
        SELECT 1 FROM memories AS m
        WHERE m.tenant_id = d.tenant_id AND m.id = d.memory_id AND m.status <> 'forgotten'
          AND {_HASH.format(content="m.content")} = d.content_hash
        ORDER BY m.tenant_id, m.id
        LIMIT 1
    ) AS m
    WHERE EXISTS (SELECT 1 FROM tenants AS t WHERE t.id = d.tenant_id)
    GROUP BY d.tenant_id, d.model
"""
# (table, event) -> the statement its trigger runs.
_STATEMENTS = {
    ("memories", "update"): _MEMORY_DELTA.format(rows=_CHANGED_MEMORIES["update"]),
    ("memories", "delete"): _MEMORY_DELTA.format(rows=_CHANGED_MEMORIES["delete"]),
    ("embeddings", "insert"): _WRITTEN_VECTORS.format(rows=_VECTORS_WRITTEN["insert"]),
    ("embeddings", "update"): _WRITTEN_VECTORS.format(rows=_VECTORS_WRITTEN["update"]),
    ("embeddings", "delete"): _VECTORS_DELETED,
}
_TRANSITIONS = {
    "insert": "REFERENCING NEW TABLE AS new_rows",
    "delete": "REFERENCING OLD TABLE AS old_rows",
    "update": "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
}


def _coverage_triggers() -> None:
    for (table, event), statement in _STATEMENTS.items():
        name = f"coverage_{table}_{event}"
        op.execute(
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {statement}; RETURN NULL; END $$"
        )
        op.execute(
            f"CREATE TRIGGER {name} AFTER {event.upper()} ON {table} {_TRANSITIONS[event]} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {name}()"
        )


def upgrade() -> None:
    # An operator's discard or cancel: who, why, when (core.jobs.operations).
    op.execute("ALTER TABLE jobs ADD COLUMN abandoned jsonb")
    # Background reindexing (core.embeddings.reindex): whether the operator paused a model's reindex, and
    # the reindex jobs dispatched lately, which the relay's throttle sums.
    op.execute(
        "CREATE TABLE reindex_state (model varchar(200) PRIMARY KEY, paused boolean NOT NULL DEFAULT false,"
        " changed_by text, updated_at timestamptz NOT NULL DEFAULT now())"
    )
    op.execute(
        "CREATE INDEX ix_jobs_reindex_dispatched ON jobs (dispatched_at) WHERE payload ->> 'reason' = 'reindex'"
    )
    # No foreign keys to tenants (as search_embedding_stats): the triggers run while a tenant's rows cascade
    # away, and their join on tenants keeps them from writing for a tenant that is gone.
    op.execute(
        "CREATE TABLE embedding_coverage (tenant_id bigint NOT NULL, doc_kind varchar(20) NOT NULL,"
        " model varchar(200) NOT NULL, current bigint NOT NULL, PRIMARY KEY (tenant_id, doc_kind, model))"
    )
    op.execute(
        # Keys lead with tenant_id, as every tenant table's (a distributed PostgreSQL shards by it).
        "CREATE TABLE embedding_coverage_deltas (id bigserial, tenant_id bigint NOT NULL,"
        " doc_kind varchar(20) NOT NULL, model varchar(200) NOT NULL, delta bigint NOT NULL,"
        " PRIMARY KEY (tenant_id, id))"
    )
    op.execute("CREATE INDEX ix_embedding_coverage_deltas_tenant ON embedding_coverage_deltas (tenant_id, doc_kind)")
    _coverage_triggers()
    # The counts of the rows already there (as the system: row security applies to the owner too).
    op.execute("SELECT set_config('engram.system', 'on', true)")
    # One hash join of the two tables (the lookups above are for a few rows at a time).
    op.execute("SET LOCAL enable_nestloop = off")
    op.execute(
        f"""
        WITH e AS MATERIALIZED (
            SELECT tenant_id, substr(canonical_id, 8) AS memory_id, model, content_hash FROM embeddings
            WHERE doc_kind = 'memory'
        )
        INSERT INTO embedding_coverage (tenant_id, doc_kind, model, current)
        SELECT e.tenant_id, 'memory', e.model, count(*) FROM e
        JOIN memories AS m ON m.tenant_id = e.tenant_id AND m.id = e.memory_id
        WHERE m.status <> 'forgotten' AND {_HASH.format(content="m.content")} = e.content_hash
        GROUP BY e.tenant_id, e.model
        """
    )
    op.execute("RESET enable_nestloop")
    op.execute(
        "CREATE INDEX ix_jobs_undispatched ON jobs (tenant_id, created_at, id) "
        "WHERE state = 'queued' AND dispatched_at IS NULL"
    )
    op.execute(
        "CREATE INDEX ix_jobs_in_flight ON jobs (tenant_id, kind) "
        "WHERE state = 'running' OR (state = 'queued' AND dispatched_at IS NOT NULL)"
    )


def downgrade() -> None:
    for table, event in _STATEMENTS:
        op.execute(f"DROP TRIGGER IF EXISTS coverage_{table}_{event} ON {table}")
        op.execute(f"DROP FUNCTION IF EXISTS coverage_{table}_{event}()")
    op.execute("DROP TABLE IF EXISTS embedding_coverage_deltas")
    op.execute("DROP TABLE IF EXISTS embedding_coverage")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS abandoned")
    op.execute("DROP INDEX IF EXISTS ix_jobs_reindex_dispatched")
    op.execute("DROP TABLE IF EXISTS reindex_state")
    op.execute("DROP INDEX IF EXISTS ix_jobs_in_flight")
    op.execute("DROP INDEX IF EXISTS ix_jobs_undispatched")
