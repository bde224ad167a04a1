"""GET /metrics (Prometheus text) and /readyz recovering by itself after Redis comes back."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tests.helpers.api import make_job, scrape
from tests.helpers.processes import wait_for


def test_metrics_need_the_operator(client, tenant):
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=tenant.headers()).json()["error"]["code"] == "unauthorized"


def test_queue_depth_oldest_age_and_durations_come_from_the_jobs_table(client, tenant):
    before = scrape(client)
    make_job(tenant.tenant_id, kind="refresh_samples", state="queued", age_s=600)
    started = datetime.now(UTC) - timedelta(seconds=3)
    make_job(
        tenant.tenant_id,
        kind="refresh_samples",
        state="succeeded",
        started_at=started,
        finished_at=started + timedelta(seconds=2),
    )
    after = scrape(client)
    queued = (("kind", "refresh_samples"), ("state", "queued"))
    assert after["engram_jobs"][queued] == before["engram_jobs"][queued] + 1
    assert after["engram_jobs_oldest_queued_age_seconds"][(("kind", "refresh_samples"),)] >= 599
    labels = (("kind", "refresh_samples"), ("state", "succeeded"))
    count = after["engram_job_duration_seconds_count"][labels]
    assert count == before.get("engram_job_duration_seconds_count", {}).get(labels, 0) + 1
    le_1 = after["engram_job_duration_seconds_bucket"][
        (("kind", "refresh_samples"), ("le", "1.0"), ("state", "succeeded"))
    ]
    le_2_5 = after["engram_job_duration_seconds_bucket"][
        (("kind", "refresh_samples"), ("le", "2.5"), ("state", "succeeded"))
    ]
    assert le_2_5 - le_1 >= 1


def test_embedding_work_and_coverage_are_exported(client, tenant, worker):
    """Embed attempts and texts are summed over the embed jobs every worker recorded; coverage by doc kind and
    model summed over tenants, with the count of tenants behind. No series carries a tenant label (thousands
    of tenants would be thousands of series): a tenant's own coverage is GET /v1/ops/coverage."""
    client.post("/v1/memories", json={"content": "metrics coverage"}, headers=tenant.headers())
    make_job(tenant.tenant_id, kind="embed", state="failed", attempts=2)
    from api.dashboard.routes import forget_cached_coverage

    def covered():  # type: ignore[no-untyped-def]
        forget_cached_coverage()
        own = client.get("/v1/ops/coverage", headers=tenant.headers()).json()["coverage"]
        samples = scrape(client)
        # The embedding lands before its job is marked succeeded: wait for both.
        done = samples.get("engram_embed_job_attempts_total", {}).get((("outcome", "succeeded"),), 0) >= 1
        return samples if done and own and all(row["ratio"] == 1.0 for row in own) else None

    samples = wait_for(covered, timeout=60)
    assert samples["engram_embed_job_attempts_total"][(("outcome", "failed"),)] >= 2
    assert samples["engram_embed_job_attempts_total"][(("outcome", "succeeded"),)] >= 1
    assert samples["engram_embed_job_texts_total"][()] >= 1
    memory_keys = [k for k in samples["engram_embedding_indexed_docs"] if ("doc_kind", "memory") in k]
    assert memory_keys and all(dict(k).keys() == {"doc_kind", "model"} for k in memory_keys)
    assert samples["engram_embedding_indexed_docs"][memory_keys[0]] >= 1
    assert memory_keys[0] in samples["engram_embedding_tenants_behind"]
    assert not [name for name, series in samples.items() for labels in series if "tenant" in dict(labels)]


def test_search_latency_is_recorded_for_each_channel_that_ran(client, tenant):
    """One observation per channel and search: all four for a question with entities and embeddings, only
    the entity channel for entities alone."""
    headers = tenant.headers()
    saved = client.post(
        "/v1/memories", json={"content": "channel timing for invoices", "sync_embed": True}, headers=headers
    )
    memory_id = saved.json()["memory_id"]
    count = "engram_search_channel_seconds_count"
    channels = ("entity_bm25", "fulltext", "dense", "graph")

    def counts() -> dict[str, float]:
        samples = scrape(client).get(count, {})
        return {channel: samples.get((("channel", channel),), 0.0) for channel in channels}

    before = counts()
    body = {"question": "invoice timing", "entities": [f"memory:{memory_id}"]}
    out = client.post("/v1/search", json=body, headers=headers).json()
    assert all(out["channels"][channel] for channel in channels), out["channels"]
    after = counts()
    assert {channel: after[channel] - before[channel] for channel in channels} == dict.fromkeys(channels, 1.0)
    client.post("/v1/search", json={"entities": [f"memory:{memory_id}"]}, headers=headers)
    last = counts()
    assert {channel: last[channel] - after[channel] for channel in channels} == {
        "entity_bm25": 1.0,
        "fulltext": 0.0,
        "dense": 0.0,
        "graph": 0.0,
    }
    assert scrape(client)["engram_search_channel_seconds_sum"][(("channel", "fulltext"),)] > 0


def test_readyz_fails_while_redis_is_down_and_recovers(stack, monkeypatch, tmp_path):
    """A dedicated embedded Redis is stopped and restarted on the same port: /readyz goes 503 then 200."""
    from fastapi.testclient import TestClient

    from api import broker
    from api.app import create_app
    from api.serve.embedded import EmbeddedRedis

    redis_server = EmbeddedRedis(data_dir=tmp_path / "redis")
    url = redis_server.start()
    monkeypatch.setenv("ENGRAM_REDIS_URL", url)
    from core.config import reset_settings_cache

    reset_settings_cache()
    broker._redis_client.cache_clear()
    try:
        with TestClient(create_app(install_queue=False), raise_server_exceptions=False) as probe:
            assert probe.get("/readyz").status_code == 200
            redis_server.stop()
            down = probe.get("/readyz")
            assert down.status_code == 503 and down.headers["retry-after"] == "5"
            assert down.json()["checks"]["redis"].startswith("unavailable")
            assert down.json()["error"]["code"] == "unavailable"
            assert redis_server.start() == url
            wait_for(lambda: probe.get("/readyz").status_code == 200, timeout=20)
            assert probe.get("/healthz").json() == {"status": "ok"}
    finally:
        redis_server.stop()
        monkeypatch.undo()
        reset_settings_cache()
        broker._redis_client.cache_clear()
        time.sleep(0)
