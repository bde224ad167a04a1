"""Embedding usage and the embedding_texts_per_day quota (CONTRACT section 9), with a real worker: texts and
the provider's reported tokens are counted in the embedding's transaction; past the quota, embedding waits
(reconcile leaves the tenant alone until the quota allows) while full-text and entity search keep working."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from tests.helpers.api import OPERATOR, key_headers, provision, tenant_id_of
from tests.helpers.processes import wait_for


def _vectors(tenant_id: int, model: str | None = None) -> int:
    from core.db import system_session

    with system_session() as session:
        return int(
            session.execute(
                text(
                    "SELECT count(*) FROM embeddings WHERE tenant_id = :t AND doc_kind = 'memory' "
                    "AND (CAST(:m AS text) IS NULL OR model = :m)"
                ),
                {"t": tenant_id, "m": model},
            ).scalar_one()
        )


def _busy(tenant_id: int) -> int:
    from core.db import system_session

    with system_session() as session:
        return int(
            session.execute(
                text(
                    "SELECT count(*) FROM jobs WHERE tenant_id = :t AND kind = 'embed' "
                    "AND state IN ('queued', 'running')"
                ),
                {"t": tenant_id},
            ).scalar_one()
        )


def test_provider_tokens_are_metered_as_the_provider_reports_them(client):
    """litellm's own test mode answers like a provider (10 prompt tokens per call): the tokens it reports are
    the tenant's embedding_tokens, next to its embedded_texts."""
    from core.db import tenant_session
    from core.embeddings.providers import LiteLLMEmbedder
    from core.embeddings.refresh import embed_docs

    made = provision(client)
    headers = key_headers(made)
    for i in range(3):
        client.post("/v1/memories", json={"content": f"metered note {i}"}, headers=headers)
    tenant_id = tenant_id_of(made["tenant"])
    vector = list(np.linspace(0.1, 0.8, 8))
    embedder = LiteLLMEmbedder("openai/text-embedding-3-small", batch_size=1, dims=8, mock_response=vector)
    with tenant_session(tenant_id) as session:
        result = embed_docs(session, tenant_id=tenant_id, doc_ids=["memory:1", "memory:2", "memory:3"],
                            embedder=embedder, link_similar=False)  # fmt: skip
    assert result["embedded"] == 3
    usage = client.get("/v1/usage", headers=headers).json()["usage"]
    assert usage["embedded_texts"] == 3 and usage["embedding_tokens"] == 30
    # Unchanged texts are not sent again: nothing more is counted.
    with tenant_session(tenant_id) as session:
        embed_docs(session, tenant_id=tenant_id, doc_ids=["memory:1"], embedder=embedder, link_similar=False)
    assert client.get("/v1/usage", headers=headers).json()["usage"]["embedding_tokens"] == 30


def test_past_the_daily_quota_embedding_waits_and_search_keeps_working(client, worker):
    from core.config import get_settings
    from core.embeddings.providers import get_embedder
    from core.embeddings.reconcile import reconcile_embeddings

    made = provision(client, quotas={"embedding_texts_per_day": 5})
    headers = key_headers(made)
    tenant_id = tenant_id_of(made["tenant"])
    items = [{"content": f"the warehouse in region {i} closes at six"} for i in range(8)]
    assert client.post("/v1/memories:batch", json={"items": items}, headers=headers).status_code == 200
    wait_for(lambda: _busy(tenant_id) == 0, timeout=60)
    assert _vectors(tenant_id) == 5
    usage = client.get("/v1/usage", headers=headers).json()["usage"]
    assert usage["embedded_texts"] == 5 and usage["memories"] == 8
    [job] = client.get("/v1/jobs", params={"kind": "embed"}, headers=headers).json()["jobs"]
    assert job["result"]["deferred"] == 3 and "embedding_texts_per_day" in job["result"]["waiting"]
    [row] = [r for r in client.get("/v1/ops/coverage", headers=headers).json()["coverage"] if r["doc_kind"] == "memory"]
    assert row["indexed"] == 5 and row["expected"] == 8 and "embedding_texts_per_day" in row["waiting"]
    # Full-text and entity search still find every memory.
    found = client.post("/v1/search", json={"question": "warehouse closes", "max_memories": 10}, headers=headers)
    assert len(found.json()["memories"]) == 8 and found.json()["channels"]["fulltext"]
    # Reconcile leaves the tenant alone while its quota is spent, and converges it once the quota allows.
    model = get_embedder(get_settings().embedding_model).name
    assert tenant_id not in reconcile_embeddings(model=model)
    raised = client.patch(f"/v1/tenants/{made['tenant']}", json={"quotas": {"embedding_texts_per_day": 100}},
                          headers=OPERATOR)  # fmt: skip
    assert raised.status_code == 200
    assert reconcile_embeddings(model=model).get(tenant_id) == 3
    wait_for(lambda: _vectors(tenant_id) == 8, timeout=60)
    assert client.get("/v1/usage", headers=headers).json()["usage"]["embedded_texts"] == 8


def test_a_suspended_tenants_jobs_wait_and_go_on_after_resume(client, worker):
    """Suspension keeps the tenant's queued jobs (no worker claims them, coverage says why); resuming lets them
    run; the jobs of a tenant that is not suspended run meanwhile."""
    suspended, other = provision(client), provision(client)
    path = f"/v1/tenants/{suspended['tenant']}"
    assert client.patch(path, json={"state": "suspended"}, headers=OPERATOR).status_code == 200
    # A save made while suspended, below the API (which refuses the tenant's keys): its embed job is queued.
    from core.db import tenant_session
    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import save_memory
    from core.tenancy.context import Caller

    tenant_id = tenant_id_of(suspended["tenant"])
    caller = Caller(tenant_id=tenant_id, tenant_name=suspended["tenant"], user="admin@localhost", role="admin",
                    key_id="test")  # fmt: skip
    with tenant_session(tenant_id) as session:
        save_memory(session, caller=caller, item=SaveMemoryIn(content="kept while suspended"))
    [job_id] = _job_ids(tenant_id)
    saved = client.post("/v1/memories", json={"content": "the other tenant's note"}, headers=key_headers(other))
    assert saved.status_code == 201
    wait_for(lambda: _vectors(tenant_id_of(other["tenant"])) == 1, timeout=60)
    assert _busy(tenant_id) == 1 and _vectors(tenant_id) == 0  # still queued, not claimed
    coverage = client.get("/v1/ops/coverage", headers=OPERATOR).json()["coverage"]
    [row] = [r for r in coverage if r["tenant"] == suspended["tenant"] and r["doc_kind"] == "memory"]
    assert row["ratio"] < 1.0 and "suspended" in row["waiting"]
    assert client.patch(path, json={"state": "active"}, headers=OPERATOR).status_code == 200
    wait_for(lambda: _vectors(tenant_id) == 1, timeout=60)
    assert client.get(f"/v1/jobs/{job_id}", headers=OPERATOR).json()["state"] == "succeeded"


def _job_ids(tenant_id: int) -> list[str]:
    from core.db import system_session

    with system_session() as session:
        return list(session.execute(text("SELECT id FROM jobs WHERE tenant_id = :t"), {"t": tenant_id}).scalars())
