"""/dashboard: the sign-in form, the signed session cookie, the assets, and the JSON the page polls."""

from __future__ import annotations

import time

from tests.conftest import OPERATOR_KEY
from tests.test_ops_jobs import OPERATOR, make_job


def signed_in_client(app):  # type: ignore[no-untyped-def]
    """A separate client (own cookie jar) signed in through the form."""
    from fastapi.testclient import TestClient

    browser = TestClient(app, raise_server_exceptions=False)
    response = browser.post("/dashboard/login", data={"key": OPERATOR_KEY}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/dashboard"
    return browser, response


def test_unauthenticated_dashboard_shows_the_sign_in_form(client):
    response = client.get("/dashboard")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert 'action="/dashboard/login"' in response.text and 'name="key"' in response.text
    # The JSON routes keep the JSON error shape.
    summary = client.get("/dashboard/api/summary")
    assert summary.status_code == 401 and summary.json()["error"]["code"] == "unauthorized"


def test_sign_in_sets_an_httponly_strict_cookie_that_opens_the_page(app):
    browser, response = signed_in_client(app)
    cookie = response.headers["set-cookie"]
    assert (
        "engram_dashboard=" in cookie
        and "HttpOnly" in cookie
        and "SameSite=strict" in cookie.replace("Strict", "strict")
    )
    page = browser.get("/dashboard")
    assert page.status_code == 200 and "/dashboard/static/dashboard.js" in page.text
    assert browser.get("/dashboard/api/summary").status_code == 200
    assert browser.get("/metrics").status_code == 200
    browser.post("/dashboard/logout", follow_redirects=False)
    assert browser.get("/dashboard/api/summary").status_code == 401


def test_wrong_key_and_tenant_keys_do_not_sign_in(app, client, tenant):
    from fastapi.testclient import TestClient

    browser = TestClient(app, raise_server_exceptions=False)
    for key in ("wrong", tenant.admin_key, ""):
        response = browser.post("/dashboard/login", data={"key": key}, follow_redirects=False)
        assert response.status_code == 401 and "not the operator key" in response.text
        assert "set-cookie" not in response.headers
    assert client.get("/dashboard/api/summary", headers=tenant.headers()).status_code == 401
    assert client.get("/metrics", headers=tenant.headers()).status_code == 401
    # JSON sign-in works too (from a separate cookie jar: the shared client must stay signed out).
    assert browser.post("/dashboard/login", json={"key": OPERATOR_KEY}, follow_redirects=False).status_code == 303


def test_session_cookie_is_signed_expires_and_works_across_processes():
    """Any process holding the operator key accepts the cookie; tampering, expiry or a new key end it."""
    from api.dashboard.routes import make_session_cookie, valid_session_cookie

    cookie = make_session_cookie(operator_key="k1")
    assert valid_session_cookie(cookie, operator_key="k1")
    assert not valid_session_cookie(cookie, operator_key="k2")
    expires, nonce, signature = cookie.split(".")
    assert not valid_session_cookie(f"{int(expires) + 999}.{nonce}.{signature}", operator_key="k1")
    assert not valid_session_cookie(cookie, operator_key="k1", now=time.time() + 13 * 3600)
    assert not valid_session_cookie("garbage", operator_key="k1")


def test_assets_are_served_locally(client):
    for name, media in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        response = client.get(f"/dashboard/static/{name}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(media)
    page = client.get("/dashboard", headers=OPERATOR).text
    assert "http://" not in page and "https://" not in page  # no CDN
    for bad in ("../routes/dashboard.py", "..%2Fapp.py", "missing.js", ".hidden.css"):
        assert client.get(f"/dashboard/static/{bad}").status_code == 404


def test_summary_counts_per_tenant_and_kind(client, make_tenant):
    a = make_tenant("dash-a")
    make_job(a.tenant_id, kind="ingest", state="queued", age_s=120)
    make_job(a.tenant_id, kind="ingest", state="running")
    failed = make_job(a.tenant_id, kind="ingest", state="failed", error="ValueError: bad url")
    from datetime import UTC, datetime

    make_job(a.tenant_id, kind="ingest", state="succeeded", finished_at=datetime.now(UTC))
    body = client.get("/dashboard/api/summary", headers=OPERATOR).json()
    row = next(r for r in body["queues"] if r["tenant"] == a.name and r["kind"] == "ingest")
    assert (row["queued"], row["running"], row["failed"], row["succeeded"]) == (1, 1, 1, 1)
    assert row["succeeded_last_hour"] == 1 and row["oldest_queued_age_seconds"] >= 119
    failure = next(j for j in body["failed"] if j["id"] == failed)
    assert failure["error"] == "ValueError: bad url" and failure["tenant"] == a.name
    assert isinstance(body["coverage"], list) and isinstance(body["recent"], list)


def test_dashboard_retry_needs_the_csrf_header(app, tenant):
    browser, _ = signed_in_client(app)
    job_id = make_job(tenant.tenant_id, state="failed")
    refused = browser.post(f"/dashboard/api/jobs/{job_id}/retry")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    accepted = browser.post(f"/dashboard/api/jobs/{job_id}/retry", headers={"X-Engram-Dashboard": "1"})
    assert accepted.status_code == 202 and accepted.json()["state"] == "queued"
    assert browser.get(f"/dashboard/api/jobs/{job_id}").json()["id"] == job_id
