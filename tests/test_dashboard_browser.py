"""The dashboard in a real browser: headless Chromium signs in, finds a failed job, presses Retry and
sees the job succeed, against a real `engram api` process and a real worker.

Set ENGRAM_DASHBOARD_SCREENSHOT=path to also save a screenshot of the populated page (docs/dashboard.png).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.conftest import OPERATOR_KEY, REPO, wait_for
from tests.test_ops_jobs import make_job

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install -y chromium)"
)


@pytest.fixture
def api_server(stack, worker) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """`engram api` in its own process, as production runs it."""
    from core.embedded import free_port

    port = free_port()
    log = open(f"/tmp/engram-api-{port}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "api", "--host", "127.0.0.1", "--port", str(port), "--no-migrate"],
        cwd=REPO,
        env={**os.environ, **stack.env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return process.poll() is not None  # exited: stop waiting, the assertion below reports it

    wait_for(up, timeout=60)
    assert process.poll() is None, Path(log.name).read_text()
    yield url
    process.terminate()
    process.wait(timeout=20)
    log.close()


def failed_ingest_job(tenant_id: int, datasource: str) -> str:
    """An ingest job that failed for good because its datasource did not exist yet."""
    from core.db import system_session
    from core.jobs.runner import run_job
    from core.jobs.service import enqueue, get_job_queue, set_job_queue

    queue = get_job_queue()
    set_job_queue(None)  # run it here, once, rather than on the worker
    try:
        with system_session() as session:
            job_id = enqueue(session, tenant_id=tenant_id, kind="ingest", payload={"datasource": datasource}).id
    finally:
        set_job_queue(queue)
    outcome = run_job(job_id, session_factory=system_session, max_attempts=1)
    assert outcome.state == "failed" and "not found" in (outcome.error or "")
    return job_id


def populate(client, make_tenant) -> None:  # type: ignore[no-untyped-def]
    """Several tenants with memories (coverage) and jobs in every state, as a live deployment has."""
    now = datetime.now(UTC)
    for name, memories in (("acme", 6), ("globex", 3), ("initech", 2)):
        tenant = make_tenant(name)
        items = [{"content": f"{name} fact {i}", "kind": "fact"} for i in range(memories)]
        client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
        make_job(tenant.tenant_id, kind="refresh_samples", state="queued", age_s=90)
        make_job(tenant.tenant_id, kind="ingest", state="running")
        for seconds in (0.4, 1.5, 3.0):
            make_job(
                tenant.tenant_id,
                kind="embed",
                state="succeeded",
                started_at=now - timedelta(seconds=30),
                finished_at=now - timedelta(seconds=30 - seconds),
            )
        if name != "initech":
            make_job(
                tenant.tenant_id,
                kind="embed",
                state="failed",
                attempts=5,
                error="EmbeddingProviderError: 503 Service Unavailable (provider outage)",
                finished_at=now - timedelta(minutes=3),
            )


def test_operator_signs_in_and_retries_a_failed_job(client, make_tenant, api_server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from tests.test_catalog_support import sqlite_source

    populate(client, make_tenant)
    tenant = make_tenant("retry")
    job_id = failed_ingest_job(tenant.tenant_id, "warehouse")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{api_server}/dashboard")
            page.fill("input[name=key]", "not-the-key")
            page.click("button[type=submit]")
            expect(page.get_by_role("alert")).to_contain_text("not the operator key")
            page.fill("input[name=key]", OPERATOR_KEY)
            page.click("button[type=submit]")

            row = page.locator(f"#failed tr[data-job-id='{job_id}']")
            expect(row).to_contain_text("not found", timeout=15_000)
            expect(page.locator("#queues")).to_contain_text("acme")
            expect(page.locator("#coverage")).to_contain_text("memory")

            if target := os.environ.get("ENGRAM_DASHBOARD_SCREENSHOT"):
                time.sleep(0.5)
                page.screenshot(path=target, full_page=True)

            # Remove the cause: the datasource the job needs now exists.
            with sqlite_source(tmp_path) as (url, _schema):
                created = client.post(
                    "/v1/datasources", json={"name": "warehouse", "url": url}, headers=tenant.headers()
                )
                assert created.status_code == 201, created.text
                row.get_by_role("button", name="Retry").click()
                retried = page.locator(f"#retries tr[data-job-id='{job_id}']")
                expect(retried).to_contain_text("succeeded", timeout=60_000)
            expect(page.locator(f"#failed tr[data-job-id='{job_id}']")).to_have_count(0, timeout=15_000)
        finally:
            browser.close()
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers()).json()
    assert job["state"] == "succeeded" and job["error"] is None and job["result"]["models_added"] >= 1
