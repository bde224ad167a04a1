"""/dashboard: the sign-in form, the signed session cookie, the assets, and the JSON the page polls."""

from __future__ import annotations

import time

from tests.helpers.api import OPERATOR, OPERATOR_KEY, make_job, signed_in_client


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


def test_oldest_queued_counts_from_the_retry_not_the_creation(client, make_tenant):
    """A job created two hours ago whose retry came due a minute ago has waited a minute, not two hours;
    one still waiting out its backoff is not waiting in the queue at all."""
    from datetime import UTC, datetime, timedelta

    tenant = make_tenant("dash-age")
    current = datetime.now(UTC)
    due = make_job(
        tenant.tenant_id,
        kind="embed",
        state="queued",
        age_s=7200,
        attempts=2,
        dispatched_at=current - timedelta(seconds=60),
    )
    waiting = make_job(
        tenant.tenant_id,
        kind="embed",
        state="queued",
        age_s=7200,
        attempts=1,
        dispatched_at=current + timedelta(hours=1),
    )
    body = client.get("/dashboard/api/summary", headers=OPERATOR).json()
    row = next(r for r in body["queues"] if r["tenant"] == tenant.name and r["kind"] == "embed")
    assert row["queued"] == 2 and row["retry_scheduled"] == 1
    assert 59 <= row["oldest_queued_age_seconds"] < 3600
    detail = client.get(f"/dashboard/api/jobs/{due}", headers=OPERATOR).json()
    assert datetime.fromisoformat(detail["queued_since"]) > current - timedelta(seconds=61)
    later = client.get(f"/dashboard/api/jobs/{waiting}", headers=OPERATOR).json()
    assert later["queued_since"] is None and datetime.fromisoformat(later["next_attempt_at"]) > current


def test_job_list_filters_pages_and_refuses_bad_input(client, make_tenant):
    a, b = make_tenant("dash-f-a"), make_tenant("dash-f-b")
    mine = [make_job(a.tenant_id, kind="ingest", state="failed", age_s=i) for i in range(5)]
    make_job(a.tenant_id, kind="embed", state="failed")
    make_job(b.tenant_id, kind="ingest", state="failed")
    seen: list[str] = []
    params = {"tenant": a.name, "kind": "ingest", "state": "failed", "limit": "2"}
    while True:
        body = client.get("/dashboard/api/jobs", params=params, headers=OPERATOR).json()
        assert len(body["jobs"]) <= 2
        assert all(j["tenant"] == a.name and j["kind"] == "ingest" for j in body["jobs"])
        seen += [j["id"] for j in body["jobs"]]
        if not body["next_cursor"]:
            break
        params["cursor"] = body["next_cursor"]
    assert seen == mine  # newest first, each exactly once
    for bad, field in (
        ({"state": "sleeping"}, "state"),
        ({"kind": "x"}, "kind"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "1e9"}, "limit"),
        ({"tenant": "no-such-tenant"}, "tenant"),
        ({"tenant": "a\0b"}, "tenant"),
        ({"cursor": "%%%"}, "cursor"),
        ({"cursor": "WyIyMDI2LTAxLTAxIiwgIlx1MDAwMCJd"}, "cursor"),  # a job id holding NUL
    ):
        response = client.get("/dashboard/api/jobs", params=bad, headers=OPERATOR)
        assert 400 <= response.status_code < 500, (bad, response.text)
        assert response.json()["error"]["field"] == field
    assert client.get("/dashboard/api/jobs").status_code == 401
    assert client.get("/dashboard/api/jobs", headers=a.headers()).status_code == 401  # a tenant key is not enough


def test_job_detail_has_every_attempt_with_its_traceback_and_timings(client, tenant):
    from core.db import system_session
    from core.jobs.service import enqueue, get_job_queue, set_job_queue
    from workers.runner import run_job

    queue = get_job_queue()
    set_job_queue(None)  # run it here, not on a worker
    try:
        with system_session() as session:
            job_id = enqueue(session, tenant_id=tenant.tenant_id, kind="ingest", payload={"datasource": "nowhere"}).id
    finally:
        set_job_queue(queue)
    assert run_job(job_id, session_factory=system_session, max_attempts=1).state == "failed"
    job = client.get(f"/dashboard/api/jobs/{job_id}", headers=OPERATOR).json()
    assert job["payload"]["datasource"] == "nowhere" and job["tenant"] == tenant.name
    [attempt] = job["attempt_errors"]
    assert attempt["attempt"] == 1 and "not found" in attempt["error"]
    assert "Traceback (most recent call last)" in attempt["traceback"]
    assert job["created_at"] and job["started_at"] and job["finished_at"] and job["duration_seconds"] >= 0
    assert client.get("/dashboard/api/jobs/nope", headers=OPERATOR).status_code == 404
    assert client.get(f"/dashboard/api/jobs/{job_id}").status_code == 401
    # The operator's REST view has the traceback too; the tenant's key gets the error message alone.
    [operator_attempt] = client.get(f"/v1/jobs/{job_id}", headers=OPERATOR).json()["attempt_errors"]
    assert "Traceback" in operator_attempt["traceback"]
    for path in (f"/v1/jobs/{job_id}", "/v1/jobs?state=failed"):
        body = client.get(path, headers=tenant.headers()).text
        assert "not found" in body and "Traceback" not in body and "traceback" not in body
        assert "/core/" not in body and ".py" not in body


def test_throughput_per_hour_over_a_day(client, tenant):
    from datetime import UTC, datetime, timedelta

    before = client.get("/dashboard/api/throughput", headers=OPERATOR).json()
    assert len(before["buckets"]) == 24 and before["bucket_seconds"] == 3600
    current = datetime.now(UTC)
    attempt = {"attempt": 1, "error": "E: x", "at": current.isoformat()}
    make_job(tenant.tenant_id, state="succeeded", finished_at=current)
    make_job(tenant.tenant_id, state="failed", finished_at=current, attempt_errors=[attempt])
    make_job(tenant.tenant_id, state="succeeded", finished_at=current - timedelta(hours=30))  # outside
    asked = datetime.now(UTC)
    after = client.get("/dashboard/api/throughput", headers=OPERATOR).json()
    answered = datetime.now(UTC)

    def added(key: str) -> int:  # totals over the day, not one bucket: robust to an hour turning meanwhile
        return sum(b[key] for b in after["buckets"]) - sum(b[key] for b in before["buckets"])

    assert (added("succeeded"), added("failed"), added("failed_attempts")) == (1, 1, 1)
    hour = datetime.fromisoformat(after["buckets"][-1]["start"])
    # The last bucket is the hour of some moment of the call (an hour may turn while it runs).
    assert hour <= answered and asked < hour + timedelta(hours=1)
    assert hour.minute == hour.second == hour.microsecond == 0
    for bad in ("0", "x", "1000", "-3"):
        response = client.get("/dashboard/api/throughput", params={"hours": bad}, headers=OPERATOR)
        assert response.status_code == 422 and response.json()["error"]["field"] == "hours"


def test_workers_lists_running_jobs_with_their_lease_heartbeat(client, tenant):
    from api.dashboard import workers

    workers.forget()
    job_id = make_job(tenant.tenant_id, kind="ingest", state="running", age_s=30)
    body = client.get("/dashboard/api/workers", headers=OPERATOR).json()
    running = next(j for j in body["running"] if j["id"] == job_id)
    assert running["heartbeat_age_seconds"] >= 29 and running["tenant"] == tenant.name
    assert isinstance(body["workers"], list) and "broker_error" in body
    assert client.get("/dashboard/api/workers").status_code == 401
