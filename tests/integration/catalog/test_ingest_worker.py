"""A real Celery worker runs ingest and its follow-up jobs end to end."""

from __future__ import annotations

from tests.helpers.catalog import sqlite_source
from tests.helpers.processes import wait_for


def test_worker_runs_ingest_and_follow_ups(client, tenant, worker, tmp_path):
    with sqlite_source(tmp_path) as (url, _):
        assert (
            client.post("/v1/datasources", json={"name": "w", "url": url}, headers=tenant.headers()).status_code == 201
        )
        job_id = client.post("/v1/datasources/w/ingest", headers=tenant.headers()).json()["job_id"]

        def job(jid: str) -> dict:
            return client.get(f"/v1/jobs/{jid}", headers=tenant.headers()).json()

        wait_for(lambda: job(job_id)["state"] in ("succeeded", "failed"), timeout=60)
        done = job(job_id)
        assert done["state"] == "succeeded", done
        follow_ups = done["result"]["follow_up_jobs"]
        assert set(follow_ups) == {"refresh_samples", "ingest_cleanup", "embed"}
        wait_for(lambda: all(job(j)["state"] == "succeeded" for j in follow_ups.values()), timeout=60)
        orders = client.get("/v1/models/w/orders", headers=tenant.headers()).json()
        status = next(c for c in orders["columns"] if c["name"] == "status")
        assert status["sampled_values"] == ["paid", "refunded", "cancelled"]


def test_cli_ingest_wait_follows_the_jobs(client, tenant, worker, tmp_path, monkeypatch):
    """`engram ingest DS --wait` polls GET /v1/jobs/{id} until the ingest and its follow-ups are done."""
    from click.testing import CliRunner
    from engram_client import EngramClient

    import api.cli.catalog as cli_catalog

    def in_process_client(url, api_key):  # type: ignore[no-untyped-def]
        engram = EngramClient(base_url="http://testserver", api_key=None)
        engram._http = client  # the TestClient is an httpx.Client on the app
        client.headers.update(tenant.headers())
        return engram

    monkeypatch.setattr(cli_catalog, "_client", in_process_client)
    monkeypatch.setattr(EngramClient, "close", lambda self: None)
    with sqlite_source(tmp_path) as (url, _):
        assert (
            client.post("/v1/datasources", json={"name": "c", "url": url}, headers=tenant.headers()).status_code == 201
        )
        try:
            result = CliRunner().invoke(cli_catalog.ingest, ["c", "--wait", "--format", "json", "--timeout", "60"])
        finally:
            client.headers.pop("Authorization", None)
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.stdout[result.stdout.index("{") :])
    assert set(report) == {"ingest", "refresh_samples", "ingest_cleanup", "embed"}
    assert all(job["state"] == "succeeded" for job in report.values())
