"""The dashboard in a real browser: headless Chromium signs in, finds a failed job, presses Retry and
sees the job succeed, against a real `engram api` process and a real worker.

Set ENGRAM_DASHBOARD_SCREENSHOTS=1 to also save the screenshots in docs/ (dashboard.png, the populated page;
dashboard-job.png, one job's detail; dashboard-narrow.png, the page 400 px wide).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers.api import OPERATOR, OPERATOR_KEY, make_job
from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, no_horizontal_overflow, signed_in_context
from tests.helpers.processes import REPO, wait_for

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install -y chromium)"
)


def failed_ingest_job(tenant_id: int, datasource: str) -> str:
    """An ingest job that failed for good because its datasource did not exist yet."""
    from core.db import system_session
    from core.jobs.service import enqueue, get_job_queue, set_job_queue
    from workers.runner import run_job

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

    from tests.helpers.catalog import sqlite_source

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


def test_workers_job_detail_filters_charts_and_a_narrow_window(client, make_tenant, api_server, worker):
    """What an operator reaches for next: the live worker and the running jobs' heartbeats, one job's every
    attempt with its traceback, the job list filtered and paged, the day's charts, and all of it on 400 px."""
    from playwright.sync_api import expect, sync_playwright

    populate(client, make_tenant)
    tenant = make_tenant("detail")
    job_id = failed_ingest_job(tenant.tenant_id, "nowhere")
    others = [make_job(tenant.tenant_id, kind="embed", state="succeeded", age_s=10 + i) for i in range(25)]
    docs = REPO / "docs"
    shots = os.environ.get("ENGRAM_DASHBOARD_SCREENSHOTS")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context, page = signed_in_context(browser, api_server, width=1400)
            # The worker answers Celery's broadcast; the populated running jobs show their lease heartbeat.
            expect(page.locator("#workers")).to_contain_text("alive", timeout=20_000)
            expect(page.locator("#running")).to_contain_text("acme")
            expect(page.locator("#running")).to_contain_text("ago")
            # The charts are drawn by the page: bars for the jobs that finished in the last minutes.
            expect(page.locator("#chart-throughput svg rect.ok").first).to_be_attached(timeout=15_000)
            expect(page.locator("#chart-failures svg rect.warn").first).to_be_attached()

            # Filters: only this tenant's failed jobs, then paging through its 25 succeeded ones.
            page.select_option("#job-filters select[name=tenant]", tenant.name)
            page.select_option("#job-filters select[name=state]", "failed")
            expect(page.locator(f"#jobs tr[data-job-id='{job_id}']")).to_have_count(1, timeout=10_000)
            expect(page.locator("#jobs tbody tr")).to_have_count(1)
            page.select_option("#job-filters select[name=state]", "succeeded")
            expect(page.locator("#jobs tbody tr")).to_have_count(20, timeout=10_000)
            expect(page.locator(f"#jobs tr[data-job-id='{others[0]}']")).to_have_count(1)
            page.click("#jobs-next")
            expect(page.locator("#jobs tbody tr")).to_have_count(5, timeout=10_000)
            expect(page.locator(f"#jobs tr[data-job-id='{others[-1]}']")).to_have_count(1)
            expect(page.locator("#jobs-next")).to_be_disabled()
            page.click("#jobs-prev")
            expect(page.locator("#jobs tbody tr")).to_have_count(20, timeout=10_000)
            if shots:
                page.select_option("#job-filters select[name=tenant]", "")
                page.select_option("#job-filters select[name=state]", "")
                expect(page.locator("#jobs-page")).to_have_text("page 1")
                page.screenshot(path=str(docs / "dashboard.png"), full_page=True)

            # One job's detail: payload, the attempt's error and its traceback, timings.
            page.locator(f"#failed tr[data-job-id='{job_id}'] a").click()
            detail = page.locator("#job-detail")
            expect(detail).to_be_visible()
            expect(detail.locator("#detail-id")).to_have_text(job_id)
            expect(detail.locator("#detail-attempts")).to_contain_text("Attempt 1")
            expect(detail.locator("#detail-attempts")).to_contain_text("not found")
            expect(detail.locator("#detail-payload")).to_contain_text('"datasource": "nowhere"')
            expect(detail.locator("#detail-fields")).to_contain_text("Finished")
            detail.locator("summary", has_text="Traceback").click()
            expect(detail.locator("#detail-attempts pre")).to_contain_text("Traceback (most recent call last)")
            if shots:
                detail.screenshot(path=str(docs / "dashboard-job.png"))
            context.close()

            # 400 px wide: everything reachable, nothing wider than the window.
            context, narrow = signed_in_context(browser, api_server, width=400, height=900)
            expect(narrow.locator("#queues")).to_contain_text("acme", timeout=15_000)
            expect(narrow.locator("#workers")).to_contain_text("alive", timeout=20_000)
            expect(narrow.locator("#chart-throughput svg")).to_be_attached()
            assert no_horizontal_overflow(narrow)
            narrow.goto(f"{api_server}/dashboard#job={job_id}")
            expect(narrow.locator("#detail-attempts")).to_contain_text("not found", timeout=10_000)
            assert no_horizontal_overflow(narrow)
            if shots:
                narrow.goto(f"{api_server}/dashboard")
                expect(narrow.locator("#workers")).to_contain_text("alive", timeout=20_000)
                narrow.screenshot(path=str(docs / "dashboard-narrow.png"))  # the first screen, as a phone shows it
            context.close()
        finally:
            browser.close()


def test_a_worker_is_listed_with_the_job_it_is_running(client, tenant, worker, tmp_path):
    """A real job held mid-run (its datasource row locked here, which the ingest handler waits for) shows on
    the worker that runs it, with a renewing lease heartbeat; released, it finishes."""
    from sqlalchemy import select

    from api.dashboard import workers
    from core.db import system_session
    from core.entities.models import Datasource
    from core.jobs.service import enqueue
    from tests.helpers.catalog import sqlite_source

    def job_state(job_id: str) -> str:
        return client.get(f"/v1/jobs/{job_id}", headers=tenant.headers()).json()["state"]

    with sqlite_source(tmp_path) as (url, _schema):
        created = client.post("/v1/datasources", json={"name": "held", "url": url}, headers=tenant.headers())
        assert created.status_code == 201, created.text
        first = client.get("/v1/jobs", params={"kind": "ingest"}, headers=tenant.headers()).json()["jobs"]
        for job in first:
            wait_for(lambda job=job: job_state(job["id"]) in ("succeeded", "failed"), timeout=60)
        with system_session() as holder:
            holder.scalar(select(Datasource).where(Datasource.name == "held").with_for_update())
            with system_session() as session:
                job_id = enqueue(session, tenant_id=tenant.tenant_id, kind="ingest", payload={"datasource": "held"}).id

            def listed() -> dict | None:  # type: ignore[type-arg]
                workers.forget()
                body = client.get("/dashboard/api/workers", headers=OPERATOR).json()
                running = next((j for j in body["running"] if j["id"] == job_id), None)
                return body if running and running["worker"] else None

            body = wait_for(listed, timeout=60, interval=0.5)
            assert isinstance(body, dict)
            [running] = [j for j in body["running"] if j["id"] == job_id]
            [runner] = [w for w in body["workers"] if w["name"] == running["worker"]]
            assert runner["alive"] and job_id in [j["id"] for j in runner["jobs"]]
            detail = client.get(f"/dashboard/api/jobs/{job_id}", headers=OPERATOR).json()
            assert detail["state"] == "running" and detail["worker"] == runner["name"]
        # The lock is released with the holder's transaction: the job completes.
        wait_for(lambda: job_state(job_id) == "succeeded", timeout=60)
