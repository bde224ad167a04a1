"""The embedding pipeline on the real stack: sync embedding, similarity linking, coverage, reconcile and a
model change (CONTRACT sections 4 and 7)."""

from __future__ import annotations

from sqlalchemy import select

from core.config import get_settings
from core.metrics import EMBEDDING_CALLS

NEAR = ("orders.amount is stored in cents; divide by 100", "orders.amount is stored in cents, divide it by 100")
RELATED = "order amounts are kept in cents"


def _run_pending_jobs(tenant_id: int) -> int:
    """Run the tenant's queued jobs in-process, as a worker would (used where no worker is needed)."""
    from core.db import system_session
    from core.jobs.models import Job
    from core.jobs.service import run_job

    with system_session() as session:
        ids = session.scalars(select(Job.id).where(Job.tenant_id == tenant_id, Job.state == "queued")).all()
    for job_id in ids:
        run_job(job_id, session_factory=system_session, max_attempts=3)
    return len(ids)


def _converge(client, tenant, model: str) -> dict:  # type: ignore[no-untyped-def]
    """Run queued jobs in-process until the tenant's memory coverage for `model` is complete (a session
    worker may be running some of them at the same time)."""
    from tests.conftest import wait_for

    def complete():  # type: ignore[no-untyped-def]
        _run_pending_jobs(tenant.tenant_id)
        row = _coverage(client, tenant)[("memory", model)]
        return row if row["ratio"] == 1.0 else None

    return wait_for(complete, timeout=60)  # type: ignore[return-value]


def _coverage(client, tenant):  # type: ignore[no-untyped-def]
    response = client.get("/v1/ops/coverage", headers=tenant.headers())
    assert response.status_code == 200, response.text
    return {(r["doc_kind"], r["model"]): r for r in response.json()["coverage"]}


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
    before = _coverage(client, tenant)[("memory", model)]
    assert before["expected"] == 30 and before["indexed"] < 30
    after = _converge(client, tenant, model)
    assert (after["indexed"], after["expected"], after["ratio"]) == (30, 30, 1.0)
    calls = EMBEDDING_CALLS.labels(model)._value.get()
    queued = reconcile_embeddings(model=model)
    assert tenant.tenant_id not in queued
    assert _run_pending_jobs(tenant.tenant_id) == 0
    assert EMBEDDING_CALLS.labels(model)._value.get() == calls


def test_reconcile_finds_changed_content_and_missing_rows(client, tenant):
    from core.embeddings.providers import get_embedder
    from core.embeddings.reconcile import reconcile_embeddings

    model = get_embedder(get_settings().embedding_model).name
    h = tenant.headers()
    mid = client.post("/v1/memories", json={"content": "first text"}, headers=h).json()["memory_id"]
    _converge(client, tenant, model)
    # A content change whose job was lost: the row's hash no longer matches the memory.
    from sqlalchemy import update

    from core.db import tenant_session
    from core.memories.models import Memory
    from core.memories.service import bump_change_seq

    with tenant_session(tenant.tenant_id) as session:
        # A content change whose embed job was lost: every write moves the tenant's change_seq.
        _, seq = bump_change_seq(session, tenant_id=tenant.tenant_id)
        session.execute(update(Memory).where(Memory.id == mid).values(content="second text", change_seq=seq))
    assert reconcile_embeddings(model=model).get(tenant.tenant_id) == 1
    assert _converge(client, tenant, model)["indexed"] == 1


def test_model_change_converges_and_old_rows_serve_meanwhile(client, tenant):
    """After ENGRAM_EMBEDDING_MODEL changes, search keeps the old model until the new one covers every
    memory; reconcile converges the tenant; old rows go only by the explicit command."""
    from core.db import tenant_session
    from core.embeddings.providers import HASHING_MODEL_NAME, get_embedder
    from core.embeddings.reconcile import reconcile_embeddings
    from core.embeddings.store import drop_other_models, serving_model

    settings = get_settings()
    old_model = get_embedder(settings.embedding_model).name
    items = [{"content": f"memory number {i} on churn"} for i in range(12)]
    client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
    _converge(client, tenant, old_model)
    saved = settings.embedding_model
    settings.embedding_model = HASHING_MODEL_NAME
    try:
        with tenant_session(tenant.tenant_id) as session:
            assert serving_model(session, configured_model=HASHING_MODEL_NAME) == old_model
        assert reconcile_embeddings(model=HASHING_MODEL_NAME)[tenant.tenant_id] == 12
        _converge(client, tenant, HASHING_MODEL_NAME)
        rows = _coverage(client, tenant)
        assert rows[("memory", old_model)]["indexed"] == 12  # old rows are kept
        with tenant_session(tenant.tenant_id) as session:
            assert serving_model(session, configured_model=HASHING_MODEL_NAME) == HASHING_MODEL_NAME
            assert drop_other_models(session, keep_model=HASHING_MODEL_NAME) == 12
        assert ("memory", old_model) not in {k for k, v in _coverage(client, tenant).items() if v["indexed"]}
    finally:
        settings.embedding_model = saved


def test_coverage_with_no_docs_is_ratio_one(client, tenant):
    rows = client.get("/v1/ops/coverage", headers=tenant.headers()).json()["coverage"]
    memory_rows = [r for r in rows if r["doc_kind"] == "memory"]
    assert memory_rows and all(r["expected"] == 0 and r["ratio"] == 1.0 for r in memory_rows)
    assert all(r["tenant"] == tenant.name for r in rows)


def test_operator_sees_every_tenant_in_coverage(client, make_tenant):
    from tests.conftest import OPERATOR_KEY

    a, b = make_tenant(), make_tenant()
    rows = client.get("/v1/ops/coverage", headers={"Authorization": f"Bearer {OPERATOR_KEY}"}).json()["coverage"]
    assert {a.name, b.name} <= {r["tenant"] for r in rows}
    only_a = client.get("/v1/ops/coverage", headers=a.headers()).json()["coverage"]
    assert {r["tenant"] for r in only_a} == {a.name}
