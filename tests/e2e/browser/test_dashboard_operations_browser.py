"""The dashboard's operator actions in a real browser (Debian's Chromium): find a job by id, discard it
with a reason, see who discarded it and why; the reindexing section shows its state."""

from __future__ import annotations

import pytest

from tests.helpers.api import make_job
from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, signed_in_context

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")


def test_find_a_job_discard_it_with_a_reason_and_read_who_did(client, tenant, api_server, tmp_path):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    job_id = make_job(tenant.tenant_id, kind="ingest", error="cannot reach the source (refused)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            _context, page = signed_in_context(browser, api_server, width=1400)
            expect(page.locator(f"#failed tr[data-job-id='{job_id}']")).to_have_count(1, timeout=15_000)
            page.fill("#find-job input[name=id]", job_id)
            page.click("#find-job button[type=submit]")
            expect(page.locator("#detail-id")).to_have_text(job_id, timeout=15_000)
            page.once("dialog", lambda dialog: dialog.accept("the source was retired"))
            page.click("#detail-discard")
            fields = page.locator("#detail-fields")
            expect(fields).to_contain_text("Discarded", timeout=15_000)
            expect(fields).to_contain_text("by dashboard")
            expect(fields).to_contain_text("the source was retired")
            expect(page.locator("#detail-discard")).to_be_hidden()
            expect(page.locator(f"#failed tr[data-job-id='{job_id}']")).to_have_count(0, timeout=15_000)
            expect(page.locator("#reindex-totals")).to_contain_text("Remaining")
            page.screenshot(path=str(tmp_path / "dashboard-discarded.png"), full_page=False)
        finally:
            browser.close()
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers()).json()
    assert job["state"] == "failed" and job["abandoned"]["reason"] == "the source was retired"
