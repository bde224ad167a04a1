"""Background reindexing after a model change: bulk reindex jobs, progress per tenant and overall (REST,
dashboard, /metrics), the operator's pause and resume, the rate throttle, and the end state."""

from __future__ import annotations

from sqlalchemy import text

from core.config import get_settings
from tests.helpers.api import OPERATOR, signed_in_client
from tests.helpers.embeddings import converge, run_pending_jobs
from tests.helpers.processes import wait_for

CSRF = {"X-Engram-Dashboard": "1"}


def _reindex_jobs(tenant_id: int) -> list[str]:
    from core.db import system_connection

    with system_connection() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT id FROM jobs WHERE tenant_id = :t AND payload ->> 'reason' = 'reindex'"
                    " AND state = 'queued' ORDER BY created_at"
                ),
                {"t": tenant_id},
            ).scalars()
        )


def _claim_bulk(budget: int | None = None) -> list[str]:
    """One round of the relay's bulk claim, the claimed rows released again (nothing publishes here)."""
    from core.jobs.relay import RelayLimits, claim_lane

    limits = RelayLimits(bulk_inflight=1_000_000, reindex_budget=budget)
    # Every queued bulk job at once: in a full run, hundreds of other tenants' older jobs come first in turn.
    claimed = [head.id for head, _, _ in claim_lane("bulk", limits=limits, most=1_000_000)]
    return claimed


def _reindex_docs(job_ids: list[str]) -> list[int]:
    """The doc counts of the reindex jobs among these, in this order."""
    from core.db import system_connection

    with system_connection() as connection:
        rows = dict(
            connection.execute(
                text(
                    "SELECT id, jsonb_array_length(payload -> 'doc_ids') FROM jobs"
                    " WHERE id = ANY(:ids) AND payload ->> 'reason' = 'reindex'"
                ),
                {"ids": job_ids},
            ).all()
        )
    return [int(rows[j]) for j in job_ids if j in rows]


def _all_reindex_jobs() -> list[str]:
    from core.db import system_connection

    with system_connection() as connection:
        return list(
            connection.execute(
                text("SELECT id FROM jobs WHERE state = 'queued' AND payload ->> 'reason' = 'reindex'")
            ).scalars()
        )


def _release(job_ids: list[str]) -> None:
    from core.db import system_connection

    with system_connection() as connection:
        connection.execute(
            text("UPDATE jobs SET dispatched_at = NULL WHERE id = ANY(:ids) AND state = 'queued'"), {"ids": job_ids}
        )


def test_a_model_change_reindexes_in_the_background_with_progress_pause_throttle_and_end(
    app, client, tenant, monkeypatch
):
    from core.embeddings.providers import HASHING_MODEL_NAME, get_embedder
    from core.embeddings.reconcile import reconcile_embeddings

    settings = get_settings()
    old_model = get_embedder(settings.embedding_model).name
    items = [{"content": f"memory {i} on the reindex"} for i in range(30)]
    assert client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers()).status_code == 200
    converge(client, tenant, old_model)
    saved = settings.embedding_model
    settings.embedding_model = HASHING_MODEL_NAME
    monkeypatch.setattr("core.embeddings.reconcile.GAP_JOB_SIZE", 10)  # three reindex jobs of this tenant
    # Only the relay's claim dispatches here: a job queue an earlier test installed in this process would
    # publish the reindex jobs of every tenant of the run at once, spending the throttle's window.
    monkeypatch.setattr("core.jobs.service._queue", None)
    try:
        assert reconcile_embeddings(model=HASHING_MODEL_NAME)[tenant.tenant_id] == 30
        mine = _reindex_jobs(tenant.tenant_id)
        assert len(mine) == 3, "the model change is queued as reindex jobs"
        progress = client.get("/v1/ops/reindex", headers=OPERATOR).json()
        assert progress["model"] == HASHING_MODEL_NAME and progress["state"] == "running"
        row = next(r for r in progress["tenants"] if r["tenant"] == tenant.name)
        assert (row["done"], row["remaining"], row["old_vectors"]) == (0, 30, True)

        # Paused from the dashboard: the relay leaves the reindex jobs queued; resumed, it takes them.
        browser, _ = signed_in_client(app)
        paused = browser.post("/dashboard/api/reindex:pause", json={}, headers=CSRF)
        assert paused.status_code == 200 and paused.json()["state"] == "paused"
        assert paused.json()["changed_by"] == "dashboard"
        claimed = _claim_bulk()
        _release(claimed)
        assert not set(claimed) & set(mine)
        resumed = client.post("/v1/ops/reindex:resume", json={"by": "ops@example.com"}, headers=OPERATOR)
        assert resumed.status_code == 200 and resumed.json()["state"] == "running"
        # Throttled to 15 texts a window: reindex jobs (of any tenant: the model changed for all) go out while
        # the budget is not spent before them, then none until the window has passed.
        # A window still holding reindex texts dispatched before (in a full run, other tests' stacks may have
        # dispatched some) would hold every job back: the throttle is checked on a window of its own.
        wait_for(lambda: _window_used() == 0, timeout=15)
        first = _claim_bulk(budget=15)
        second = _claim_bulk(budget=15)
        _release(first + second)
        sent = _reindex_docs(first)
        assert sent and sum(sent[:-1]) < 15 and (sum(sent) >= 15 or len(sent) == len(_all_reindex_jobs()))
        assert _reindex_docs(second) == []

        converge(client, tenant, HASHING_MODEL_NAME)
        row = next(r for r in _every_tenant_row(HASHING_MODEL_NAME) if r["tenant"] == tenant.name)
        assert (row["done"], row["remaining"], row["old_vectors"]) == (30, 0, True)
        metrics = client.get("/metrics", headers=OPERATOR).text
        assert f'engram_reindex_memories{{model="{HASHING_MODEL_NAME}",state="done"}}' in metrics
        assert "engram_reindex_paused 0.0" in metrics
        # Reconcile finds the tenant covered and deletes the old vectors: the tenant leaves the reindex.
        assert tenant.tenant_id not in reconcile_embeddings(model=HASHING_MODEL_NAME)
        assert tenant.name not in {r["tenant"] for r in _every_tenant_row(HASHING_MODEL_NAME)}
    finally:
        settings.embedding_model = saved
        # Other tenants of the suite got reindex jobs to the hashing model too: run this tenant's, drop theirs.
        run_pending_jobs(tenant.tenant_id)
        from core.db import system_connection

        with system_connection() as connection:
            connection.execute(
                text(
                    "UPDATE jobs SET state = 'failed', error = 'test cleanup' WHERE state = 'queued'"
                    " AND payload ->> 'reason' = 'reindex' AND payload ->> 'model' = :m"
                ),
                {"m": HASHING_MODEL_NAME},
            )


def test_reindex_actions_need_the_operator_and_take_no_unknown_field(client, tenant):
    assert client.get("/v1/ops/reindex", headers=tenant.headers()).status_code == 403
    assert client.post("/v1/ops/reindex:pause", headers=tenant.headers()).status_code == 403
    bad = client.post("/v1/ops/reindex:pause", json={"when": "now"}, headers=OPERATOR)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "when"
    assert client.post("/v1/ops/reindex:resume", headers=OPERATOR).json()["state"] != "paused"


def _every_tenant_row(model: str) -> list[dict]:  # type: ignore[type-arg]
    """Every tenant's row of the reindex progress, uncut. GET /v1/ops/reindex answers with the same function cut at
    the 200 tenants with the most left: in a full run the stack holds more tenants than that with vectors of
    the old model, and a tenant with nothing left comes after all of them."""
    from core.db import system_session
    from core.embeddings.reindex import progress

    with system_session() as session:
        return list(progress(session, model=model, tenant_limit=1_000_000)["tenants"])


def _window_used() -> int:
    """Texts of reindex jobs dispatched in the throttle's current window (the relay's own measure)."""
    from core.db import system_connection
    from core.jobs.reindex_gate import WINDOW_USED_SQL

    with system_connection() as connection:
        return int(connection.execute(text(f"SELECT {WINDOW_USED_SQL}")).scalar_one())
