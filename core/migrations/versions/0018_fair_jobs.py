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
Revises: 0015
"""

from alembic import op

revision = "0018"
down_revision = "0015"
branch_labels = None
depends_on = None


_HASH = "encode(sha256(convert_to({content}, 'UTF8')), 'hex')"

# Memory rows whose up-to-date-ness may change, each with its sign: inserted or un-forgotten (+1), deleted or
# forgotten (-1), content changed (-1 for the old content, +1 for the new). Access counters and the like
# change neither and cost one join of the transition tables.
_MEMORY_ROWS = {
    "insert": "SELECT tenant_id, id, content, 1 AS sign FROM new_rows WHERE status <> 'forgotten'",
    "delete": "SELECT tenant_id, id, content, -1 AS sign FROM old_rows WHERE status <> 'forgotten'",
    "update": "SELECT n.tenant_id, n.id, n.content, 1 AS sign FROM new_rows AS n"
    " JOIN old_rows AS o ON o.tenant_id = n.tenant_id AND o.id = n.id"
    " WHERE n.status <> 'forgotten' AND (o.content IS DISTINCT FROM n.content OR o.status = 'forgotten')"
    " UNION ALL SELECT o.tenant_id, o.id, o.content, -1 AS sign FROM old_rows AS o"
    " JOIN new_rows AS n ON n.tenant_id = o.tenant_id AND n.id = o.id"
    " WHERE o.status <> 'forgotten' AND (o.content IS DISTINCT FROM n.content OR n.status = 'forgotten')",
}
# The join keys are computed from the transition rows first (a MATERIALIZED CTE): under row security a
# function in a join clause (`'memory:' || id`, `substr(canonical_id, 8)`) keeps PostgreSQL from using it as
# an index condition unless the function is leakproof, and the join would then scan (and hash) the tenant's
# whole table once per written row. A bare equality of columns is an index lookup; the content hash is then
# compared on the one row found.
_MEMORY_DELTA = f"""
    WITH d AS MATERIALIZED (
        SELECT r.tenant_id, 'memory:' || r.id AS canonical_id, r.content, r.sign FROM ({{rows}}) AS r
    )
    INSERT INTO embedding_coverage_deltas (tenant_id, doc_kind, model, delta)
    SELECT e.tenant_id, 'memory', e.model, sum(d.sign)
    FROM d
    JOIN embeddings AS e ON e.tenant_id = d.tenant_id AND e.canonical_id = d.canonical_id
        AND e.content_hash = {_HASH.format(content="d.content")}
    JOIN tenants AS t ON t.id = d.tenant_id
    GROUP BY e.tenant_id, e.model HAVING sum(d.sign) <> 0
"""
_EMBEDDING_ROWS = {
    "insert": "SELECT tenant_id, canonical_id, model, content_hash, 1 AS sign FROM new_rows WHERE doc_kind = 'memory'",
    "delete": "SELECT tenant_id, canonical_id, model, content_hash, -1 AS sign FROM old_rows WHERE doc_kind = 'memory'",
    "update": "SELECT tenant_id, canonical_id, model, content_hash, 1 AS sign FROM new_rows WHERE doc_kind = 'memory'"
    " UNION ALL SELECT tenant_id, canonical_id, model, content_hash, -1 FROM old_rows WHERE doc_kind = 'memory'",
}
_EMBEDDING_DELTA = f"""
    WITH d AS MATERIALIZED (
        SELECT r.tenant_id, substr(r.canonical_id, 8) AS memory_id, r.model, r.content_hash, r.sign FROM ({{rows}}) AS r
    )
    INSERT INTO embedding_coverage_deltas (tenant_id, doc_kind, model, delta)
    SELECT d.tenant_id, 'memory', d.model, sum(d.sign)
    FROM d
    JOIN memories AS m ON m.tenant_id = d.tenant_id AND m.id = d.memory_id
        AND m.status <> 'forgotten' AND {_HASH.format(content="m.content")} = d.content_hash
    JOIN tenants AS t ON t.id = d.tenant_id
    GROUP BY d.tenant_id, d.model HAVING sum(d.sign) <> 0
"""
_TRANSITIONS = {
    "insert": "REFERENCING NEW TABLE AS new_rows",
    "delete": "REFERENCING OLD TABLE AS old_rows",
    "update": "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
}
_TRIGGERS = {"memories": (_MEMORY_ROWS, _MEMORY_DELTA), "embeddings": (_EMBEDDING_ROWS, _EMBEDDING_DELTA)}


def _coverage_triggers() -> None:
    for table, (rows, template) in _TRIGGERS.items():
        for event, selected in rows.items():
            name = f"coverage_{table}_{event}"
            op.execute(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN {template.format(rows=selected)}; RETURN NULL; END $$"
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
        "CREATE TABLE embedding_coverage_deltas (id bigserial PRIMARY KEY, tenant_id bigint NOT NULL,"
        " doc_kind varchar(20) NOT NULL, model varchar(200) NOT NULL, delta bigint NOT NULL)"
    )
    op.execute("CREATE INDEX ix_embedding_coverage_deltas_tenant ON embedding_coverage_deltas (tenant_id, doc_kind)")
    _coverage_triggers()
    # The counts of the rows already there (as the system: row security applies to the owner too).
    op.execute("SELECT set_config('engram.system', 'on', true)")
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
    op.execute(
        "CREATE INDEX ix_jobs_undispatched ON jobs (tenant_id, created_at, id) "
        "WHERE state = 'queued' AND dispatched_at IS NULL"
    )
    op.execute(
        "CREATE INDEX ix_jobs_in_flight ON jobs (tenant_id, kind) "
        "WHERE state = 'running' OR (state = 'queued' AND dispatched_at IS NOT NULL)"
    )


def downgrade() -> None:
    for table, (rows, _) in _TRIGGERS.items():
        for event in rows:
            op.execute(f"DROP TRIGGER IF EXISTS coverage_{table}_{event} ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS coverage_{table}_{event}()")
    op.execute("DROP TABLE IF EXISTS embedding_coverage_deltas")
    op.execute("DROP TABLE IF EXISTS embedding_coverage")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS abandoned")
    op.execute("DROP INDEX IF EXISTS ix_jobs_reindex_dispatched")
    op.execute("DROP TABLE IF EXISTS reindex_state")
    op.execute("DROP INDEX IF EXISTS ix_jobs_in_flight")
    op.execute("DROP INDEX IF EXISTS ix_jobs_undispatched")
