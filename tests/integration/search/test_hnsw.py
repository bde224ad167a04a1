"""HNSW indexes appear only when a tenant outgrows exact search (core.embeddings.hnsw)."""

from __future__ import annotations

from sqlalchemy import text

from core.db import get_owner_engine, system_connection


def _indexes() -> set[str]:
    with system_connection() as connection:
        return set(
            connection.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'embeddings'")).scalars()
        )


def test_index_is_built_once_a_tenant_passes_the_threshold(client, tenant):
    from core.embeddings.hnsw import ensure_hnsw_indexes, hnsw_index_name
    from core.embeddings.providers import get_embedder

    dims = get_embedder("local").dims
    name = hnsw_index_name(dims)
    with get_owner_engine().begin() as connection:
        for size in (256, 384, 512, 768, 1024, 1536):
            connection.execute(text(f"DROP INDEX IF EXISTS {hnsw_index_name(size)}"))
    client.post("/v1/memories", json={"content": "one vector", "sync_embed": True}, headers=tenant.headers())
    client.post("/v1/memories", json={"content": "two vectors", "sync_embed": True}, headers=tenant.headers())
    assert ensure_hnsw_indexes(threshold=1_000_000) == []
    assert name not in _indexes()
    try:
        built = ensure_hnsw_indexes(threshold=1)  # other tests' tenants may hold vectors of other sizes
        assert dims in built and name in _indexes()
        assert ensure_hnsw_indexes(threshold=1) == []  # already there
        with system_connection() as connection:
            connection.execute(text("SET LOCAL enable_seqscan = off"))  # the table is tiny; ask whether it could
            plan = connection.execute(
                text(
                    f"EXPLAIN SELECT canonical_id FROM embeddings WHERE dims = {dims} "
                    f"ORDER BY (embedding::vector({dims})) <=> (SELECT embedding::vector({dims}) FROM embeddings "
                    f"WHERE dims = {dims} LIMIT 1) LIMIT 5"
                )
            ).scalars()
            assert any(name in line for line in plan)
    finally:
        from core.embeddings.hnsw import HNSW_DIMS

        with get_owner_engine().begin() as connection:
            for size in HNSW_DIMS:
                connection.execute(text(f"DROP INDEX IF EXISTS {hnsw_index_name(size)}"))
