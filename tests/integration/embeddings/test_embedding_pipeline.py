"""The embedding pipeline on the real stack: sync embedding, similarity linking, coverage, reconcile and a
model change (CONTRACT sections 4 and 7)."""

from __future__ import annotations

from sqlalchemy import select

from core.config import get_settings
from core.metrics import EMBEDDING_CALLS
from tests.helpers.embeddings import converge, coverage_by_kind, run_pending_jobs

NEAR = ("orders.amount is stored in cents; divide by 100", "orders.amount is stored in cents, divide it by 100")
RELATED = "order amounts are kept in cents"


def test_sync_embed_links_near_duplicates_and_reports_similar(client, tenant):
    """Above 0.9 the newer memory `updates` the older (which stays active with superseded_by);
    between 0.75 and 0.9 the match comes back in `similar_existing`."""
    h = tenant.headers()
    older = client.post("/v1/memories", json={"content": NEAR[0], "sync_embed": True}, headers=h).json()["memory_id"]
    newer = client.post("/v1/memories", json={"content": NEAR[1], "sync_embed": True}, headers=h).json()
    assert newer["similar_existing"] == []
    new_memory = client.get(f"/v1/memories/{newer['memory_id']}", headers=h).json()
    assert [a["relation_type"] for a in new_memory["associations"]] == ["updates"]
    assert new_memory["associations"][0]["target_id"] == older
    old_memory = client.get(f"/v1/memories/{older}", headers=h).json()
    assert old_memory["superseded_by"] == newer["memory_id"] and old_memory["status"] == "active"
    related = client.post("/v1/memories", json={"content": RELATED, "sync_embed": True}, headers=h).json()
    similar_ids = {s["memory_id"] for s in related["similar_existing"]}
    assert similar_ids and similar_ids <= {older, newer["memory_id"]}
    assert all(0.75 <= s["score"] <= 0.9 for s in related["similar_existing"])
    assert client.get(f"/v1/memories/{related['memory_id']}", headers=h).json()["associations"] == []


def test_similarity_needs_same_owner_and_agent(client, tenant, member_key):
    member = member_key("other@example.com")
    h = tenant.headers()
    first = client.post("/v1/memories", json={"content": NEAR[0], "sync_embed": True}, headers=h).json()["memory_id"]
    other_owner = client.post(
        "/v1/memories", json={"content": NEAR[1], "sync_embed": True}, headers=tenant.headers(member)
    )
    assert other_owner.json()["similar_existing"] == []
    other_agent = client.post(
        "/v1/memories", json={"content": NEAR[1], "sync_embed": True, "agent_id": "bot-2"}, headers=h
    ).json()
    assert client.get(f"/v1/memories/{first}", headers=h).json()["superseded_by"] is None
    assert other_agent["similar_existing"] == []


def test_background_embedding_converges_coverage_and_reconcile_is_free(client, tenant):
    """Jobs bring coverage to 1.0; a reconcile over a converged corpus queues nothing and embeds nothing."""
    from core.embeddings.providers import get_embedder
    from core.embeddings.reconcile import reconcile_embeddings

    items = [{"content": f"note {i} about the quarterly revenue report"} for i in range(30)]
    assert client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers()).status_code == 200
    model = get_embedder(get_settings().embedding_model).name
    before = coverage_by_kind(client, tenant)[("memory", model)]
    assert before["expected"] == 30 and before["indexed"] < 30
    after = converge(client, tenant, model)
    assert (after["indexed"], after["expected"], after["ratio"]) == (30, 30, 1.0)
    calls = EMBEDDING_CALLS.labels(model)._value.get()
    queued = reconcile_embeddings(model=model)
    assert tenant.tenant_id not in queued
    assert run_pending_jobs(tenant.tenant_id) == 0
    assert EMBEDDING_CALLS.labels(model)._value.get() == calls


def test_reconcile_finds_changed_content_and_missing_rows(client, tenant):
    from core.embeddings.providers import get_embedder
    from core.embeddings.reconcile import reconcile_embeddings

    model = get_embedder(get_settings().embedding_model).name
    h = tenant.headers()
    mid = client.post("/v1/memories", json={"content": "first text"}, headers=h).json()["memory_id"]
    converge(client, tenant, model)
    # A content change whose job was lost: the row's hash no longer matches the memory.
    from sqlalchemy import update

    from core.changes import bump_change_seq
    from core.db import tenant_session
    from core.memories.models import Memory

    with tenant_session(tenant.tenant_id) as session:
        # A content change whose embed job was lost: every write moves the tenant's change_seq.
        _, seq = bump_change_seq(session, tenant_id=tenant.tenant_id)
        session.execute(update(Memory).where(Memory.id == mid).values(content="second text", change_seq=seq))
    assert reconcile_embeddings(model=model).get(tenant.tenant_id) == 1
    assert converge(client, tenant, model)["indexed"] == 1


def test_model_change_converges_and_old_rows_serve_meanwhile(client, tenant):
    """After ENGRAM_EMBEDDING_MODEL changes (between two local models), search keeps the old model until the
    new one covers every memory; reconcile converges the tenant, then deletes the retired model's vectors,
    and coverage (which reports the configured model) is back at 1.0."""
    from sqlalchemy import func

    from core.db import tenant_session
    from core.embeddings.providers import HASHING_MODEL_NAME, get_embedder
    from core.embeddings.reconcile import reconcile_embeddings
    from core.embeddings.store import serving_model
    from core.vectors import Embedding

    settings = get_settings()
    old_model = get_embedder(settings.embedding_model).name
    items = [{"content": f"memory number {i} on churn"} for i in range(12)]
    client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
    converge(client, tenant, old_model)
    saved = settings.embedding_model
    settings.embedding_model = HASHING_MODEL_NAME
    try:
        with tenant_session(tenant.tenant_id) as session:
            assert serving_model(session, configured_model=HASHING_MODEL_NAME) == old_model
        assert reconcile_embeddings(model=HASHING_MODEL_NAME)[tenant.tenant_id] == 12
        rows = coverage_by_kind(client, tenant)
        assert set(rows) == {("memory", HASHING_MODEL_NAME)} and rows[("memory", HASHING_MODEL_NAME)]["ratio"] == 0
        converge(client, tenant, HASHING_MODEL_NAME)

        def old_rows() -> int:
            with tenant_session(tenant.tenant_id) as session:
                return int(session.scalar(select(func.count()).where(Embedding.model == old_model)) or 0)

        assert old_rows() == 12  # converged, but reconcile has not run since: the old rows still exist
        with tenant_session(tenant.tenant_id) as session:
            assert serving_model(session, configured_model=HASHING_MODEL_NAME) == HASHING_MODEL_NAME
        assert tenant.tenant_id not in reconcile_embeddings(model=HASHING_MODEL_NAME)
        assert old_rows() == 0
        rows = coverage_by_kind(client, tenant)
        assert set(rows) == {("memory", HASHING_MODEL_NAME)}
        row = rows[("memory", HASHING_MODEL_NAME)]
        assert (row["indexed"], row["expected"], row["ratio"]) == (12, 12, 1.0)
    finally:
        settings.embedding_model = saved


def test_coverage_with_no_docs_is_ratio_one(client, tenant):
    rows = client.get("/v1/ops/coverage", headers=tenant.headers()).json()["coverage"]
    memory_rows = [r for r in rows if r["doc_kind"] == "memory"]
    assert memory_rows and all(r["expected"] == 0 and r["ratio"] == 1.0 for r in memory_rows)
    assert all(r["tenant"] == tenant.name for r in rows)


def test_operator_sees_every_tenant_in_coverage(client, make_tenant):
    from tests.helpers.api import OPERATOR_KEY

    a, b = make_tenant(), make_tenant()
    rows = client.get("/v1/ops/coverage", headers={"Authorization": f"Bearer {OPERATOR_KEY}"}).json()["coverage"]
    assert {a.name, b.name} <= {r["tenant"] for r in rows}
    only_a = client.get("/v1/ops/coverage", headers=a.headers()).json()["coverage"]
    assert {r["tenant"] for r in only_a} == {a.name}


# --- The bulk write path (core.embeddings.refresh / similarity / wire) ---------------------------------


def _save(client, tenant, contents: list[str]) -> list[str]:  # type: ignore[no-untyped-def]
    response = client.post(
        "/v1/memories:batch", json={"items": [{"content": c} for c in contents]}, headers=tenant.headers()
    )
    assert response.status_code == 200, response.text
    return [r["memory_id"] for r in response.json()["results"]]


def _stored_vectors(tenant_id: int, model: str) -> dict[str, tuple[str, list[float]]]:
    """canonical id -> (content hash, vector) as pgvector's own text form reads back."""
    from core.db import tenant_session
    from core.vectors import Embedding

    with tenant_session(tenant_id) as session:
        rows = session.execute(
            select(Embedding.canonical_id, Embedding.content_hash, Embedding.embedding).where(Embedding.model == model)
        ).all()
    return {cid: (digest, list(vector)) for cid, digest, vector in rows}


def _embedding_stats(tenant_id: int, model: str) -> tuple[int, int]:
    from sqlalchemy import text

    from core.db import system_connection

    with system_connection() as connection:
        row = connection.execute(
            text("SELECT docs, version FROM search_embedding_stats WHERE tenant_id = :t AND model = :m"),
            {"t": tenant_id, "m": model},
        ).one()
    return int(row[0]), int(row[1])


def test_bulk_upsert_stores_exact_vectors_and_moves_stats_once(client, tenant):
    """One job's vectors land bit for bit (binary vector[] parameter), a changed memory's row is updated in
    place, and the statistics triggers count the docs and move the version once per write."""
    import numpy as np

    from core.db import tenant_session
    from core.embeddings.providers import get_embedder
    from core.embeddings.refresh import embed_docs
    from core.entities.render import content_hash
    from core.refs import memory_ref as memory_doc_id

    embedder = get_embedder("local")
    contents = [f"the {word} table is refreshed nightly at {i} am" for i, word in enumerate(("orders", "users", "ä€"))]
    ids = _save(client, tenant, contents)
    doc_ids = [memory_doc_id(i) for i in ids]
    with tenant_session(tenant.tenant_id) as session:
        # Duplicated ids in a payload are embedded once (one upsert statement cannot touch a row twice).
        out = embed_docs(session, tenant_id=tenant.tenant_id, doc_ids=doc_ids + doc_ids[:1], embedder=embedder)
    assert (out["embedded"], out["unchanged"]) == (3, 0)
    stored = _stored_vectors(tenant.tenant_id, embedder.name)
    expected = embedder.embed_documents(contents)
    for doc_id, text_, vector in zip(doc_ids, contents, expected, strict=True):
        digest, got = stored[doc_id]
        assert digest == content_hash(text_)
        assert np.array_equal(np.asarray(got, dtype=np.float32), vector)
    docs, version = _embedding_stats(tenant.tenant_id, embedder.name)
    assert docs == 3

    changed = client.patch(
        f"/v1/memories/{ids[0]}", json={"content": "users are soft deleted"}, headers=tenant.headers()
    )
    assert changed.status_code == 200, changed.text
    with tenant_session(tenant.tenant_id) as session:
        out = embed_docs(session, tenant_id=tenant.tenant_id, doc_ids=doc_ids, embedder=embedder)
    assert (out["embedded"], out["unchanged"]) == (1, 2)
    digest, got = _stored_vectors(tenant.tenant_id, embedder.name)[doc_ids[0]]
    assert digest == content_hash("users are soft deleted")
    assert np.array_equal(np.asarray(got, dtype=np.float32), embedder.embed_documents(["users are soft deleted"])[0])
    assert _embedding_stats(tenant.tenant_id, embedder.name) == (3, version + 1)


def test_background_job_links_near_duplicates_without_storing_suggestions(client, tenant):
    """A background embed job makes the `updates` links and superseded_by like a sync save, keeps no
    similar_existing suggestions in its result, and a second run makes no embedding call."""
    from core.db import system_session, tenant_session
    from core.jobs.models import Job
    from core.memories.models import Association, Memory

    model_name = _model_name()
    older, newer, related = _save(client, tenant, [NEAR[0], NEAR[1], RELATED])
    converge(client, tenant, model_name)
    with tenant_session(tenant.tenant_id) as session:
        superseded = dict(session.execute(select(Memory.id, Memory.superseded_by)).all())
        links = session.execute(select(Association.source_id, Association.target_id, Association.relation_type)).all()
    assert superseded == {older: newer, newer: None, related: None}
    assert [tuple(link) for link in links] == [(newer, older, "updates")]
    with system_session() as session:
        results = session.scalars(
            select(Job.result).where(Job.tenant_id == tenant.tenant_id, Job.kind == "embed")
        ).all()
    assert results and all(r is not None and "similar" not in r for r in results)

    calls = EMBEDDING_CALLS.labels(model_name)._value.get()
    from core.jobs.service import enqueue
    from core.refs import memory_ref as memory_doc_id

    with system_session() as session:
        enqueue(session, tenant_id=tenant.tenant_id, kind="embed", payload={"doc_ids": [memory_doc_id(older)]})
    assert run_pending_jobs(tenant.tenant_id) == 1
    assert EMBEDDING_CALLS.labels(model_name)._value.get() == calls


def test_concurrent_jobs_superseding_the_same_memories_both_succeed(client, tenant):
    """Two jobs at once whose memories supersede the same older ones: rows are locked in one order, so
    neither deadlocks, and each older memory ends superseded by one of them."""
    import threading

    from core.db import system_session, tenant_session
    from core.jobs.models import Job
    from core.memories.models import Association, Memory
    from workers.runner import run_job

    base = [f"{table} rows are archived after {n} days" for n, table in enumerate(("orders", "refunds", "carts"))]
    olders = _save(client, tenant, base)
    converge(client, tenant, _model_name())
    first = _save(client, tenant, [b + "." for b in base])
    second = _save(client, tenant, [b + "!" for b in base])
    with system_session() as session:
        job_ids = session.scalars(
            select(Job.id).where(Job.tenant_id == tenant.tenant_id, Job.state == "queued").order_by(Job.created_at)
        ).all()
    assert len(job_ids) == 2
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def run(job_id: str) -> None:
        barrier.wait()
        outcomes.append(run_job(job_id, session_factory=system_session, max_attempts=1).state)

    threads = [threading.Thread(target=run, args=(job_id,)) for job_id in job_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert outcomes == ["succeeded", "succeeded"]
    with tenant_session(tenant.tenant_id) as session:
        superseded = dict(session.execute(select(Memory.id, Memory.superseded_by)).all())
        targets = set(session.scalars(select(Association.target_id)).all())
    assert all(superseded[o] in set(first) | set(second) for o in olders)
    assert set(olders) <= targets


def test_shared_matrix_reads_exactly_the_rows_written_since_its_version(client, tenant):
    """The process's matrix of a tenant's vectors (shared by search and linking) picks up a vector another
    writer replaced and one it added, by the stamps of migration 0013: a refresh reads only the rows stamped
    after the matrix's version, never the corpus again, and ends equal to a matrix read whole."""
    import numpy as np

    from core.db import tenant_session
    from core.embeddings import matrix as shared
    from core.embeddings.providers import get_embedder
    from core.embeddings.refresh import Doc, write_embeddings

    embedder = get_embedder("local")
    a, b = _save(client, tenant, ["invoices are issued monthly", "payments settle in two days"])
    converge(client, tenant, embedder.name)

    def current() -> shared.TenantMatrix:
        with tenant_session(tenant.tenant_id) as session:
            stats = shared.vector_stats(session, tenant_id=tenant.tenant_id, model=embedder.name)
            return shared.tenant_matrix(
                session,
                tenant_id=tenant.tenant_id,
                model=embedder.name,
                dims=embedder.dims,
                version=stats.version,
            )

    first = current()
    assert {"memory:" + a, "memory:" + b} <= set(first.memories.ids)
    replaced = np.zeros(embedder.dims, dtype=np.float32)
    replaced[0] = 1.0
    with tenant_session(tenant.tenant_id) as session:
        write_embeddings(
            session,
            tenant_id=tenant.tenant_id,
            model=embedder.name,
            docs=[Doc("memory:" + b, "memory", "elsewhere"), Doc("memory:extra-doc", "memory", "new")],
            hashes={"memory:" + b: "f" * 64, "memory:extra-doc": "e" * 64},
            vectors=np.stack([replaced, np.ones(embedder.dims, dtype=np.float32)]),
        )
    # While another thread refreshes this tenant's matrix, a search takes the one before instead of waiting.
    stripe = shared._REFRESHING[hash((tenant.tenant_id, embedder.name, embedder.dims)) % len(shared._REFRESHING)]
    with stripe:
        assert current() is first
    reads: list[str] = []
    original = shared._read

    def counted(session, sql, params, dims):  # type: ignore[no-untyped-def]
        reads.append(sql)
        return original(session, sql, params, dims)

    shared._read = counted  # type: ignore[assignment]
    try:
        refreshed = current()
    finally:
        shared._read = original  # type: ignore[assignment]
    assert reads == [shared._ROWS_SINCE]  # only what was written since, not the corpus
    assert refreshed.version > first.version
    row = refreshed.memories.row("memory:" + b)
    assert row is not None and np.allclose(refreshed.memories.matrix[row], replaced)
    assert "memory:extra-doc" in refreshed.memories and "memory:extra-doc" not in first.memories
    # The older matrix is untouched (a search may still be reading it).
    old_row = first.memories.row("memory:" + b)
    assert old_row is not None and not np.allclose(first.memories.matrix[old_row], replaced)
    with tenant_session(tenant.tenant_id) as session:
        whole = shared.load_matrix(session, tenant_id=tenant.tenant_id, model=embedder.name, dims=embedder.dims)
    assert whole.version == refreshed.version  # labelled with the version of the snapshot its rows came from
    assert sorted(whole.memories.ids) == sorted(refreshed.memories.ids)
    for doc_id in whole.memories.ids:
        got, want = refreshed.memories.row(doc_id), whole.memories.row(doc_id)
        assert got is not None and want is not None
        assert np.allclose(refreshed.memories.matrix[got], whole.memories.matrix[want], atol=1e-6)


def test_appended_rows_share_the_buffer_and_replaced_rows_copy_it():
    """A refresh that only adds rows writes them past the end of the rows the older matrix uses (no copy);
    a second refresh from that same older matrix, or one replacing a row, copies instead, so no published
    matrix ever sees its rows change."""
    import numpy as np

    from core.embeddings import matrix as shared

    rng = np.random.default_rng(5)
    base = shared.side_of(["memory:a", "memory:b"], rng.standard_normal((2, 8)).astype(np.float32), dims=8, headroom=4)
    before = base.matrix.copy()
    grown = shared.merged(base, ["memory:c"], rng.standard_normal((1, 8)).astype(np.float32))
    assert grown.matrix.base is base.matrix.base and grown.n == 3 and grown.memory_ids[-1] == "c"
    assert "memory:c" not in base and np.array_equal(base.matrix, before)
    forked = shared.merged(base, ["memory:d"], rng.standard_normal((1, 8)).astype(np.float32))
    assert forked.matrix.base is not base.matrix.base and "memory:c" not in forked and "memory:d" in forked
    assert np.array_equal(grown.matrix[:2], before) and grown.row("memory:c") == 2
    replaced = shared.merged(grown, ["memory:a"], np.ones((1, 8), dtype=np.float32))
    assert np.allclose(replaced.matrix[0], 1 / np.sqrt(8)) and np.array_equal(grown.matrix[:2], before)


def test_nearest_sparse_and_dense_paths_agree_with_brute_force():
    """_nearest keeps, per new vector, its best candidates (at most _CANDIDATES) among the stored memories and
    the other new ones, scoring at least the floor, whichever path it takes; a new memory's own stored (older)
    vector and its own new row are never candidates."""
    import numpy as np

    from core.embeddings import similarity
    from core.embeddings.matrix import side_of

    rng = np.random.default_rng(3)
    corpus = rng.standard_normal((300, 16)).astype(np.float32)
    corpus[150:] = corpus[:150] + 0.05 * rng.standard_normal((150, 16)).astype(np.float32)
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    ids = [f"m{i}" for i in range(300)]
    # m0..m19 are stored with old vectors and re-embedded; m300..m319 are new.
    old = corpus.copy()
    old[:20] += 0.3 * rng.standard_normal((20, 16)).astype(np.float32)
    stored = side_of([f"memory:{i}" for i in ids], old, dims=16)
    new_ids = ids[:20] + [f"m{i}" for i in range(300, 320)]
    block = np.vstack([corpus[:20], corpus[150:170] + 0.01]).astype(np.float32)
    block /= np.linalg.norm(block, axis=1, keepdims=True)
    # What each new vector is compared with: the stored rows of memories not re-embedded, and the new rows.
    others = [(ids[i], stored.matrix[i]) for i in range(300) if ids[i] not in set(new_ids)]
    others += list(zip(new_ids, block, strict=True))
    k = similarity._CANDIDATES
    for floor in (0.95, -1.0):  # few pairs above the floor (sparse path), every pair (dense path)
        got = similarity._nearest(stored, new_ids, block, floor=floor)
        for row, memory_id in enumerate(new_ids):
            scored = sorted(
                ((float(block[row] @ v), other) for other, v in others if other != memory_id), key=lambda p: -p[0]
            )
            want = [(other, score) for score, other in scored[:k] if score >= floor]
            assert [m for m, _ in got[memory_id]] == [m for m, _ in want]
            assert np.allclose([s for _, s in got[memory_id]], [s for _, s in want], atol=1e-5)
    # At 0.95 each new vector has its few near twins only (the sparse path), never its own older vector.
    assert all(1 <= len(v) < k for v in similarity._nearest(stored, new_ids, block, floor=0.95).values())


def _model_name() -> str:
    from core.embeddings.providers import get_embedder

    return get_embedder(get_settings().embedding_model).name


def test_repeated_statements_are_never_served_a_generic_plan(client, tenant):
    """psycopg prepares a statement after five runs; PostgreSQL would then reuse one generic plan, made
    while the tenant was small, after it has grown (coverage went quadratic that way). Every connection
    plans each run for its own parameters instead (core.db)."""
    from sqlalchemy import text

    from core.db import system_session, tenant_session
    from core.embeddings.store import coverage

    model = get_settings().embedding_model
    with tenant_session(tenant.tenant_id) as session:
        for _ in range(3):
            coverage(session, configured_model=model)
    items = [{"content": f"note {i}"} for i in range(50)]
    client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
    with tenant_session(tenant.tenant_id) as session:
        for _ in range(8):
            coverage(session, configured_model=model)
        prepared = session.execute(
            text(
                # Statements with parameters only: one without any has a single plan, which PostgreSQL
                # counts as generic (a pooled connection may have prepared such a statement of another test).
                # psycopg's own, not the look-ups and saves engram runs on generic plans by design (core.sql).
                "SELECT count(*), coalesce(sum(custom_plans), 0), coalesce(sum(generic_plans), 0)"
                " FROM pg_prepared_statements WHERE cardinality(parameter_types) > 0 AND name NOT LIKE 'engram\\_%'"
            )
        ).one()
    assert prepared[0] > 0 and prepared[1] > 0  # psycopg did prepare them, and each run was planned afresh
    assert prepared[2] == 0
    with system_session() as session:
        assert session.execute(text("SHOW plan_cache_mode")).scalar() == "force_custom_plan"
