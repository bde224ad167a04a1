"""The operators' tenants page: state, quotas, today's usage, backlog and coverage a page at a time, searchable by
name, with suspend / resume and quota edits; its JSON and, in headless Chromium, the page itself."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.helpers.api import OPERATOR, provision, signed_in_client
from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, signed_in_context

CSRF = {"X-Engram-Dashboard": "1"}


def test_tenants_json_pages_filters_and_edits(client, app):
    prefix = f"dash-{uuid.uuid4().hex[:6]}"
    made = [provision(client, f"{prefix}-{i:02d}") for i in range(5)]
    client.post("/v1/memories", json={"content": "one"}, headers={"Authorization": f"Bearer {made[0]['api_key']}"})
    page = client.get("/dashboard/api/tenants", params={"q": prefix, "limit": 3}, headers=OPERATOR).json()
    assert [t["tenant"] for t in page["tenants"]] == [m["tenant"] for m in made[:3]]
    assert page["next_cursor"] and page["counts"]["active"] >= 5
    first = page["tenants"][0]
    assert first["usage"]["memories"] == 1 and first["backlog"]["queued"] + first["backlog"]["running"] >= 0
    assert 0.0 <= first["coverage"] <= 1.0
    rest = client.get("/dashboard/api/tenants", params={"q": prefix, "cursor": page["next_cursor"]}, headers=OPERATOR)
    assert [t["tenant"] for t in rest.json()["tenants"]] == [m["tenant"] for m in made[3:]]
    path = f"/dashboard/api/tenants/{made[1]['tenant']}"
    # State changes need the dashboard's header when made with the session cookie; the operator key is enough.
    assert client.patch(path, json={"state": "suspended"}, headers=OPERATOR).json()["state"] == "suspended"
    limited = client.patch(path, json={"quotas": {"max_memories": 9}}, headers=OPERATOR)
    assert limited.json()["quotas"]["max_memories"] == 9
    assert client.patch(path, json={"colour": "red"}, headers=OPERATOR).status_code == 422
    assert client.get("/dashboard/api/tenants").status_code == 401
    tenant_key = {"Authorization": f"Bearer {made[0]['api_key']}"}
    assert client.get("/dashboard/api/tenants", headers=tenant_key).status_code == 401
    # Signed in with the cookie (a browser of its own), a state change also needs the dashboard's header. (Its
    # own client, not its own app lifespan: starting and stopping the session's app again would stop its MCP.)
    browser, _ = signed_in_client(app)
    assert browser.patch(path, json={"state": "active"}).status_code == 403
    assert browser.patch(path, json={"state": "active"}, headers=CSRF).json()["state"] == "active"


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
def test_operator_finds_suspends_and_limits_a_tenant_in_the_browser(client, api_server):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    prefix = f"web-{uuid.uuid4().hex[:6]}"
    made = [provision(client, f"{prefix}-{i:02d}") for i in range(55)]  # more than one page of 50
    target = made[52]
    target_headers = {"Authorization": f"Bearer {target['api_key']}"}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context, page = signed_in_context(browser, api_server, width=1400)
            page.goto(f"{api_server}/dashboard/tenants")
            page.fill("input[name=q]", prefix)
            rows = page.locator("#tenants tbody tr")
            expect(rows).to_have_count(50, timeout=15_000)
            expect(rows.first).to_contain_text(prefix)  # the filtered page, not the first one loaded
            expect(rows.nth(49)).to_contain_text(prefix)
            page.click("#tenants-next")
            expect(rows).to_have_count(5)
            row = page.locator(f"#tenants tr[data-tenant='{target['tenant']}']")
            row.get_by_role("button", name="Suspend").click()
            expect(row).to_contain_text("suspended", timeout=10_000)
            refused = httpx.get(f"{api_server}/v1/memories", headers=target_headers)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "tenant_suspended"
            row.get_by_role("button", name="Resume").click()
            expect(row).to_contain_text("active", timeout=10_000)
            assert httpx.get(f"{api_server}/v1/memories", headers=target_headers).status_code == 200
            row.get_by_role("button", name="Quotas").click()
            page.fill("#quota-form input[name=max_memories]", "0")
            page.click("#quota-save")
            expect(row).to_contain_text("max_memories 0", timeout=10_000)
            saved = httpx.post(f"{api_server}/v1/memories", json={"content": "x"}, headers=target_headers)
            assert saved.status_code == 403 and saved.json()["error"]["code"] == "quota_exceeded"
            context.close()
        finally:
            browser.close()
