"""search: entity BM25 corpus statistics, embedding versions, HNSW indexes, mode indexes

Two small tables are maintained by statement-level triggers (with transition tables, so a batch
of 1,000 rows or a COPY costs one aggregate, not 1,000 row triggers), inside the writing
transaction, whatever code path writes:

* ``search_corpus_stats(tenant_id, scope, status, docs, tokens)``: per tenant, memory status and
  scope (``''`` = the whole tenant, else a datasource name a memory has an entity rooted at),
  how many memories and how many BM25 tokens (entity tags + the implicit self reference).
  This is N and the total length for BM25Plus without scanning the corpus.
* ``search_embedding_stats(tenant_id, model, docs, version)``: the number of stored vectors of a
  model and a counter moved by every write, which keys the in-process dense matrix cache.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Embedding sizes that get an HNSW index (pgvector indexes `vector` up to 2,000 dimensions).
HNSW_DIMS = (256, 384, 512, 768, 1024, 1536)

_CORPUS_DELTA = """
    WITH delta AS (
        SELECT r.tenant_id, r.status, sc.scope, r.sign AS docs,
               r.sign * (cardinality(r.entities) + 1) AS tokens
        FROM ({rows}) AS r
        CROSS JOIN LATERAL (
            SELECT ''::text AS scope
            UNION
            SELECT split_part(e, '.', 1) FROM unnest(r.entities) AS e WHERE NOT starts_with(e, 'memory:')
        ) AS sc
    ), agg AS (
        SELECT d.tenant_id, d.scope, d.status, sum(d.docs) AS docs, sum(d.tokens) AS tokens
        FROM delta AS d JOIN tenants AS t ON t.id = d.tenant_id
        GROUP BY 1, 2, 3
        HAVING sum(d.docs) <> 0 OR sum(d.tokens) <> 0
    )
    INSERT INTO search_corpus_stats AS s (tenant_id, scope, status, docs, tokens)
    SELECT tenant_id, scope, status, docs, tokens FROM agg ORDER BY 1, 2, 3
    ON CONFLICT (tenant_id, scope, status)
    DO UPDATE SET docs = s.docs + excluded.docs, tokens = s.tokens + excluded.tokens
"""

_EMBEDDING_DELTA = """
    INSERT INTO search_embedding_stats AS s (tenant_id, model, docs, version)
    SELECT r.tenant_id, r.model, sum(r.sign), 1
    FROM ({rows}) AS r JOIN tenants AS t ON t.id = r.tenant_id
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (tenant_id, model)
    DO UPDATE SET docs = s.docs + excluded.docs, version = s.version + 1
"""

_ROWS = {
    "memories": {
        "insert": "SELECT tenant_id, status, entities, 1 AS sign FROM new_rows",
        "delete": "SELECT tenant_id, status, entities, -1 AS sign FROM old_rows",
        "update": "SELECT tenant_id, status, entities, 1 AS sign FROM new_rows "
        "UNION ALL SELECT tenant_id, status, entities, -1 AS sign FROM old_rows",
    },
    "embeddings": {
        "insert": "SELECT tenant_id, model, 1 AS sign FROM new_rows",
        "delete": "SELECT tenant_id, model, -1 AS sign FROM old_rows",
        "update": "SELECT tenant_id, model, 0 AS sign FROM new_rows",
    },
}
_TRANSITIONS = {
    "insert": "REFERENCING NEW TABLE AS new_rows",
    "delete": "REFERENCING OLD TABLE AS old_rows",
    "update": "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
}


def _triggers(table: str, template: str) -> None:
    for event, rows in _ROWS[table].items():
        name = f"search_{table}_{event}"
        op.execute(
            f"""
            CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                {template.format(rows=rows)};
                RETURN NULL;
            END $$;
            """
        )
        op.execute(
            f"CREATE TRIGGER {name} AFTER {event.upper()} ON {table} {_TRANSITIONS[event]} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {name}()"
        )


def upgrade() -> None:
    # No foreign key to tenants: the triggers run while a tenant's rows cascade away, and a join on
    # tenants (above) already keeps them from writing for a tenant that is gone.
    op.execute(
        """
        CREATE TABLE search_corpus_stats (
            tenant_id bigint NOT NULL,
            scope text NOT NULL,
            status varchar(20) NOT NULL,
            docs bigint NOT NULL,
            tokens bigint NOT NULL,
            PRIMARY KEY (tenant_id, scope, status)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE search_embedding_stats (
            tenant_id bigint NOT NULL,
            model varchar(200) NOT NULL,
            docs bigint NOT NULL,
            version bigint NOT NULL,
            PRIMARY KEY (tenant_id, model)
        )
        """
    )
    _triggers("memories", _CORPUS_DELTA)
    _triggers("embeddings", _EMBEDDING_DELTA)
    op.execute(_CORPUS_DELTA.format(rows=_ROWS["memories"]["insert"].replace("new_rows", "memories")))
    op.execute(_EMBEDDING_DELTA.format(rows=_ROWS["embeddings"]["insert"].replace("new_rows", "embeddings")))
    # HNSW indexes are built by reconcile once a tenant outgrows exact search (core.embeddings.hnsw).
    op.create_index("ix_memories_tenant_importance", "memories", ["tenant_id", "importance", "created_at"])
    op.create_index("ix_memories_tenant_kind_created", "memories", ["tenant_id", "kind", "created_at"])
    op.execute(
        "CREATE INDEX ix_memories_tenant_has_query ON memories (tenant_id, created_at) "
        "WHERE coalesce(jsonb_typeof(query), 'null') <> 'null'"
    )


def downgrade() -> None:
    op.drop_index("ix_memories_tenant_has_query", table_name="memories")
    op.drop_index("ix_memories_tenant_kind_created", table_name="memories")
    op.drop_index("ix_memories_tenant_importance", table_name="memories")
    for dims in HNSW_DIMS:
        op.execute(f"DROP INDEX IF EXISTS ix_embeddings_hnsw_{dims}")
    for table, events in _ROWS.items():
        for event in events:
            op.execute(f"DROP TRIGGER IF EXISTS search_{table}_{event} ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS search_{table}_{event}()")
    op.execute("DROP TABLE search_embedding_stats")
    op.execute("DROP TABLE search_corpus_stats")
