"""HNSW indexes on the embeddings table, built when some tenant needs them.

Below `dense_exact_max_docs` vectors a tenant is searched exactly in numpy, so an HNSW index would only
slow every embedding insert (about a millisecond a row at 384 dimensions). Reconcile therefore builds the
partial expression index of a vector size the first time some tenant's model holds more vectors than the
threshold, CONCURRENTLY so writes go on meanwhile; from then on inserts maintain it.
"""

from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from core.db import get_owner_engine, system_connection

log = logging.getLogger("engram.hnsw")

HNSW_DIMS = frozenset({256, 384, 512, 768, 1024, 1536})
_BUILD_LOCK_KEY = 7_402_911_338


def hnsw_index_name(dims: int) -> str:
    return f"ix_embeddings_hnsw_{dims}"


def hnsw_index_sql(dims: int, *, concurrently: bool) -> str:
    how = "CONCURRENTLY " if concurrently else ""
    return (
        f"CREATE INDEX {how}IF NOT EXISTS {hnsw_index_name(dims)} ON embeddings "
        f"USING hnsw ((embedding::vector({dims})) vector_cosine_ops) WHERE dims = {dims}"
    )


def dims_needing_index(*, threshold: int) -> set[int]:
    """Vector sizes of the models that hold more than `threshold` vectors for some tenant."""
    with system_connection() as connection:  # every tenant's sizes: system mode
        models = connection.execute(
            text("SELECT DISTINCT model FROM search_embedding_stats WHERE docs > :t"), {"t": threshold}
        ).scalars()
        dims = set()
        for model in list(models):
            size = connection.execute(
                text("SELECT dims FROM embeddings WHERE model = :m LIMIT 1"), {"m": model}
            ).scalar()
            if size in HNSW_DIMS:
                dims.add(int(size))
        return dims


def ensure_hnsw_indexes(*, threshold: int) -> list[int]:
    """Build the missing HNSW indexes some tenant now needs; returns the vector sizes built."""
    wanted = dims_needing_index(threshold=threshold)
    if not wanted:
        return []
    built = []
    # An index is DDL: only the schema owner may build it, not the app role.
    with get_owner_engine().connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if not connection.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _BUILD_LOCK_KEY}).scalar():
            return []  # another process is building
        try:
            existing = set(
                connection.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'embeddings'")).scalars()
            )
            for dims in sorted(wanted):
                if hnsw_index_name(dims) not in existing:
                    try:
                        connection.execute(text(hnsw_index_sql(dims, concurrently=True)))
                    except ProgrammingError as error:  # connected as the app role: no DDL allowed
                        log.warning("cannot build the HNSW index for %d dims (%s): run `engram migrate`", dims, error)
                        break
                    built.append(dims)
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _BUILD_LOCK_KEY})
    return built
