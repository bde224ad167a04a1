"""A generated tenant for search benchmarks: a catalog of M entities and N data-agent notes linked to it.

Everything is bulk-loaded: the catalog through the catalog's own editing service (one transaction per
model batch), memories and embeddings with COPY (the statement-level triggers of migration 0003 keep
the search statistics exact, as they do for API writes), vectors from the configured embedder's
``embed_documents`` (the same rendered text the embed worker would use). The HNSW index of the model's
dimension is dropped during the load and rebuilt after it, which is how a bulk import should be done.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb
from sqlalchemy import text

from core.config import get_settings
from core.db import get_owner_engine, tenant_session
from core.embeddings.providers import get_embedder
from core.embeddings.wire import vector_records
from core.entities import editing, service
from core.entities.render import content_hash
from core.entities.schemas import ColumnIn, DatasourceIn, ModelPutIn
from core.memories.schemas import DEFAULT_IMPORTANCE
from core.search.dense import HNSW_DIMS

COLUMNS_PER_MODEL = 19  # + the model itself = 20 entities per model
_SUBJECTS = (
    "revenue refunds discount shipping tax margin churn signup session invoice payment customer region "
    "warehouse inventory supplier campaign conversion retention subscription ticket latency fraud"
).split()
_COLUMN_WORDS = (
    "amount status created updated country currency channel plan tier score count price cost quantity "
    "duration rating segment source device weight balance fee"
).split()
_TEMPLATES = (
    "{col} in {model} is stored in cents; divide by 100 before summing {subject}.",
    "Exclude test accounts when reporting {subject}: filter {col} on {model}.",
    "{model}.{col} has NULLs before 2021; treat NULL {col} as unknown when computing {subject}.",
    "The finance team defines {subject} net of refunds; use {col} from {model}, not the raw total.",
    "Join {model} on customer_id, not email: {col} duplicates otherwise and {subject} doubles.",
    "{col} is reported in UTC; convert to the account timezone for daily {subject} dashboards.",
    "Weekly {subject} uses fiscal weeks starting Sunday; {model}.{col} carries the fiscal week.",
    "Deprecated: {col} on {model} stopped updating in March; prefer the newer column for {subject}.",
    "When {subject} spikes, check {model} for duplicate loads; {col} repeats on reprocessed days.",
    "The {subject} KPI excludes cancelled orders: filter {col} != 'cancelled' on {model}.",
)
_KINDS = ("fact", "decision", "preference", "observation", "knowledge", "todo", "event")
_QUESTIONS = (
    "how do we compute {subject}",
    "why does {subject} look doubled",
    "which column holds {col} for {subject}",
    "are there nulls in {col}",
    "what timezone is {col} in",
    "{subject} excluding refunds",
)


@dataclass
class Corpus:
    tenant_id: int
    entity_ids: list[str] = field(default_factory=list)
    subjects: tuple[str, ...] = tuple(_SUBJECTS)

    def question(self, rng: random.Random) -> str:
        col = rng.choice(_COLUMN_WORDS)
        return rng.choice(_QUESTIONS).format(subject=rng.choice(self.subjects), col=col)

    def entities(self, rng: random.Random, k: int = 2) -> list[str]:
        return rng.sample(self.entity_ids, k=min(k, len(self.entity_ids)))


def _model_name(i: int) -> str:
    return f"{_SUBJECTS[i % len(_SUBJECTS)]}_{i}"


def build_catalog(*, tenant_id: int, entities: int, sqlite_path: str) -> list[str]:
    """A datasource `bench` with entities // 20 models of 19 columns; returns every canonical id."""

    ids: list[str] = []
    with tenant_session(tenant_id) as session:
        service.create_datasource(
            session, tenant_id=tenant_id, body=DatasourceIn(name="bench", url=f"sqlite:///{sqlite_path}")
        )
    n_models = max(1, entities // (COLUMNS_PER_MODEL + 1))
    for start in range(0, n_models, 50):
        with tenant_session(tenant_id) as session:
            for i in range(start, min(start + 50, n_models)):
                name = _model_name(i)
                columns = [
                    ColumnIn(
                        name=f"{_COLUMN_WORDS[j % len(_COLUMN_WORDS)]}_{j}",
                        type="INTEGER" if j % 3 else "TEXT",
                        description=f"{_COLUMN_WORDS[j % len(_COLUMN_WORDS)]} of the {name.split('_')[0]}",
                    )
                    for j in range(COLUMNS_PER_MODEL)
                ]
                editing.put_model(
                    session,
                    tenant_id=tenant_id,
                    datasource="bench",
                    name=name,
                    body=ModelPutIn(description=f"{name.split('_')[0]} facts", columns=columns),
                )
                ids.append(f"bench.{name}")
                ids.extend(f"bench.{name}.{c.name}" for c in columns)
    return ids


def _note(rng: random.Random, entity_ids: list[str]) -> tuple[str, list[str]]:
    k = rng.choice((1, 1, 2, 2, 3))
    # Skewed towards a popular head, as real notes are.
    tags = list(dict.fromkeys(entity_ids[int(len(entity_ids) * rng.random() ** 2)] for _ in range(k)))
    leaf = tags[0].split(".")
    model, col = leaf[1], (leaf[2] if len(leaf) > 2 else "id")
    content = rng.choice(_TEMPLATES).format(model=model, col=col, subject=rng.choice(_SUBJECTS))
    return content, tags


def load_memories(*, tenant_id: int, count: int, entity_ids: list[str], seed: int = 7) -> list[tuple[str, str]]:
    """COPY ``count`` memories into the tenant; returns (memory id, content) for embedding."""

    rng = random.Random(seed)
    now = datetime.now(UTC)
    # COPY is refused under row-level security: a bulk load runs as the owner, in system mode.
    raw = get_owner_engine().raw_connection()
    docs: list[tuple[str, str]] = []
    try:
        conn: Any = raw.driver_connection
        with conn.cursor() as cur:
            cur.execute("SELECT set_config('engram.system', 'on', true)")
            cur.execute(
                "UPDATE tenants SET change_seq = change_seq + 1, memory_seq = greatest(memory_seq, %s) "
                "WHERE id = %s RETURNING change_seq",
                (count, tenant_id),
            )
            seq = cur.fetchone()[0]
            columns = (
                "tenant_id, id, content, kind, category, importance, occurred_at, tags, persona, agent_id, "
                "entities, query, status, created_by, created_at, updated_at, access_count, change_seq"
            )
            with cur.copy(f"COPY memories ({columns}) FROM STDIN") as copy:
                for i in range(1, count + 1):
                    content, tags = _note(rng, entity_ids)
                    kind = rng.choice(_KINDS)
                    created = now - timedelta(minutes=count - i)
                    query = (
                        Jsonb({"source_model": tags[0].rsplit(".", 1)[0], "measures": ["*:count"]})
                        if i % 20 == 0
                        else None
                    )
                    agent = "agent-2" if i % 10 == 0 else None
                    category = "workspace" if i % 4 == 0 else "core"
                    copy.write_row(
                        (
                            tenant_id,
                            str(i),
                            content,
                            kind,
                            category,
                            DEFAULT_IMPORTANCE[kind],
                            created,
                            [],
                            None,
                            agent,
                            tags,
                            query,
                            "active",
                            "bench@localhost",
                            created,
                            created,
                            0,
                            seq,
                        )
                    )
                    docs.append((str(i), content))
        conn.commit()
    finally:
        raw.close()
    return docs


def _copy_field(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


def embedding_copy_rows(
    *, tenant_id: int, model: str, dims: int, docs: list[tuple[str, str, str]], vectors: np.ndarray
) -> bytes:
    """Rows of ``COPY embeddings (...) FROM STDIN (FORMAT BINARY)`` for (canonical id, doc kind, text) docs.

    Binary COPY sends each vector as pgvector's wire format (dims, 0, big-endian float4s) instead of a
    decimal literal per float, which is most of the load time of a large corpus when formatted in Python.
    """

    head = struct.pack(">hiq", 7, 8, tenant_id)
    model_field = _copy_field(model.encode())
    dims_field = struct.pack(">ii", 4, dims)
    parts = []
    for (doc_id, kind, body), vector in zip(docs, vector_records(np.asarray(vectors, dtype=np.float32)), strict=True):
        parts.append(
            head
            + _copy_field(doc_id.encode())
            + model_field
            + _copy_field(kind.encode())
            + dims_field
            + _copy_field(content_hash(body).encode())
            + vector.tobytes()
        )
    return b"".join(parts)


_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)


def load_embeddings(*, tenant_id: int, docs: list[tuple[str, str, str]], batch: int = 4096) -> None:
    """Embed (canonical id, doc kind, text) with the configured embedder and COPY the vectors in (binary)."""
    load_tenant_embeddings([(tenant_id, docs)], batch=batch)


def load_tenant_embeddings(
    docs_by_tenant: list[tuple[int, list[tuple[str, str, str]]]], *, batch: int = 4096, with_hnsw: bool = True
) -> None:
    """Every tenant's (canonical id, doc kind, text) docs, embedded and COPYed in (binary) in one transaction.

    The HNSW index of the model's dimension is dropped during the load and built once after it (only with
    ``with_hnsw``; otherwise it is left as it is), which is how a bulk import should be done.
    """

    embedder = get_embedder(get_settings().embedding_model)
    dims = embedder.dims
    raw = get_owner_engine().raw_connection()  # COPY and index DDL: the owner, in system mode
    try:
        conn: Any = raw.driver_connection
        with conn.cursor() as cur:
            cur.execute("SELECT set_config('engram.system', 'on', true)")
            rebuild_index = with_hnsw and dims in HNSW_DIMS
            if rebuild_index:
                cur.execute(f"DROP INDEX IF EXISTS ix_embeddings_hnsw_{dims}")
            with cur.copy(
                "COPY embeddings (tenant_id, canonical_id, model, doc_kind, dims, content_hash, embedding) "
                "FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.write(_COPY_HEADER)
                for tenant_id, docs in docs_by_tenant:
                    for start in range(0, len(docs), batch):
                        chunk = docs[start : start + batch]
                        vectors = embedder.embed_documents([t for _, _, t in chunk])
                        copy.write(
                            embedding_copy_rows(
                                tenant_id=tenant_id, model=embedder.name, dims=dims, docs=chunk, vectors=vectors
                            )
                        )
                copy.write(_COPY_TRAILER)
            if rebuild_index:
                # The whole graph in memory builds several times faster than one spilling to disk.
                total = sum(len(docs) for _, docs in docs_by_tenant)
                graph_mb = total * (4 * dims + 256) * 2 // 2**20
                cur.execute(f"SET maintenance_work_mem = '{min(max(512, graph_mb), 8192)}MB'")
                cur.execute(
                    f"CREATE INDEX ix_embeddings_hnsw_{dims} ON embeddings "
                    f"USING hnsw ((embedding::vector({dims})) vector_cosine_ops) WHERE dims = {dims}"
                )
        conn.commit()
    finally:
        raw.close()


def analyze() -> None:
    """VACUUM ANALYZE after the bulk load: the state autovacuum brings a loaded table to.

    Right after a bulk load, the GIN index on ``memories.entities`` still holds its fast-update pending
    list (tens of pages for 10k rows), which every ``&&`` lookup scans linearly until a vacuum merges it
    (measured: 1.7-10 ms per entity query before, 0.1 ms after). Measuring before that merge times an
    artefact of having just loaded, not the steady state.
    """

    with get_owner_engine().connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE"))
