"""Operator actions on jobs (REST with the operator key, and the dashboard): retry every failed job of a
filter, discard failed jobs with who and why, cancel queued ones, find a job by id and read it again after
its retry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers.api import OPERATOR, make_job, signed_in_client
from tests.helpers.processes import wait_for

CSRF = {"X-Engram-Dashboard": "1"}

# (action, the job's state, the answer's status): discard takes failed jobs, cancel takes queued ones.
RULES = [
    ("discard", "failed", 200),
    ("discard", "queued", 409),
    ("discard", "running", 409),
    ("discard", "succeeded", 409),
    ("cancel", "queued", 200),
    ("cancel", "failed", 409),
    ("cancel", "running", 409),
    ("cancel", "succeeded", 409),
]


@pytest.mark.parametrize(("action", "state", "status"), RULES)
def test_discard_and_cancel_by_state(client, tenant, action, state, status):
    # A queued job with a delivery due in an hour: no relay of this suite publishes it meanwhile.
    extra = {"dispatched_at": datetime.now(UTC) + timedelta(hours=1)} if state == "queued" else {}
    job_id = make_job(tenant.tenant_id, state=state, **extra)
    response = client.post(
        f"/v1/jobs/{job_id}/{action}", json={"reason": "not needed", "by": "ops@example.com"}, headers=OPERATOR
    )
    assert response.status_code == status, response.text
    job = client.get(f"/v1/jobs/{job_id}", headers=OPERATOR).json()
    if status == 200:
        assert job["state"] == "failed" and job["abandoned"]["by"] == "ops@example.com"
        assert job["abandoned"]["reason"] == "not needed" and job["abandoned"]["from_state"] == state
        if action == "cancel":
            assert job["error"] == "cancelled by ops@example.com: not needed"
    else:
        assert job["state"] == state and job.get("abandoned") is None


def test_a_cancelled_job_never_runs(client, tenant):
    from core.db import system_session
    from workers.runner import run_jobs

    job_id = make_job(tenant.tenant_id, state="queued", attempts=0)
    assert client.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "stop"}, headers=OPERATOR).status_code == 200
    # A message already in Redis for it reaches a worker: the claim skips it.
    outcome = run_jobs([job_id], session_factory=system_session, max_attempts=3)[job_id]
    assert outcome.state == "skipped"


def test_retry_all_takes_the_filters_failed_jobs_and_leaves_discarded_ones(client, make_tenant):
    a, b = make_tenant("ops-a"), make_tenant("ops-b")
    a_embed = [make_job(a.tenant_id, kind="embed", error="EmbeddingProviderError: 503") for _ in range(3)]
    a_ingest = make_job(a.tenant_id, kind="ingest", error="cannot reach the source")
    a_other_error = make_job(a.tenant_id, kind="embed", error="PermanentJobError: bad payload")
    b_embed = make_job(b.tenant_id, kind="embed", error="EmbeddingProviderError: 503")
    discarded = client.post(
        "/v1/jobs:discard", json={"ids": [a_embed[2]], "reason": "a retired doc"}, headers=OPERATOR
    )
    assert discarded.status_code == 200 and discarded.json() == {"count": 1, "job_ids": [a_embed[2]]}
    # The dashboard's failures leave out the discarded job.
    failed_listed = {j["id"] for j in client.get("/dashboard/api/summary", headers=OPERATOR).json()["failed"]}
    assert a_embed[0] in failed_listed and a_embed[2] not in failed_listed
    retried = client.post(
        "/v1/jobs:retry", json={"tenant": a.name, "kind": "embed", "error_contains": "503"}, headers=OPERATOR
    )
    assert retried.status_code == 202, retried.text
    assert sorted(retried.json()["job_ids"]) == sorted(a_embed[:2]) and retried.json()["count"] == 2

    def state(job_id: str) -> str:
        return str(client.get(f"/v1/jobs/{job_id}", headers=OPERATOR).json()["state"])

    assert all(state(j) != "failed" for j in a_embed[:2])
    assert state(a_embed[2]) == state(a_ingest) == state(a_other_error) == state(b_embed) == "failed"
    # A second bulk retry finds nothing more of that filter.
    again = client.post("/v1/jobs:retry", json={"tenant": a.name, "error_contains": "503"}, headers=OPERATOR)
    assert again.json()["count"] == 0
    _settle([*a_embed, a_ingest, a_other_error, b_embed])


def _settle(job_ids: list[str]) -> None:
    """Leave no job of a test queued for a later module's worker."""
    from sqlalchemy import text

    from core.db import system_connection

    with system_connection() as connection:
        connection.execute(
            text("UPDATE jobs SET state = 'failed', error = 'cleanup' WHERE id = ANY(:ids) AND state <> 'succeeded'"),
            {"ids": job_ids},
        )


BAD = [
    ("/v1/jobs:retry", {"kind": "nope"}, 422, "kind"),
    ("/v1/jobs:retry", {"colour": "red"}, 422, "colour"),
    ("/v1/jobs:retry", {"tenant": "no-such-tenant"}, 422, "tenant"),
    ("/v1/jobs:retry", {"error_contains": "a\u0000b"}, 422, "error_contains"),
    ("/v1/jobs:discard", {"kind": "embed"}, 422, "reason"),
    ("/v1/jobs:discard", {"reason": ""}, 422, "reason"),
    ("/v1/jobs/abc/discard", {}, 422, "reason"),
    ("/v1/jobs/abc/cancel", {"reason": "x", "extra": 1}, 422, "extra"),
    ("/v1/jobs/no-such-job/cancel", {"reason": "x"}, 404, None),
]


@pytest.mark.parametrize(("path", "body", "status", "field"), BAD)
def test_bad_input_is_a_clear_4xx(client, path, body, status, field):
    response = client.post(path, json=body, headers=OPERATOR)
    assert response.status_code == status, response.text
    assert response.json()["error"].get("field") == field


@pytest.mark.parametrize("path", ["/v1/jobs:retry", "/v1/jobs:discard", "/v1/jobs/x/discard", "/v1/jobs/x/cancel"])
def test_tenant_keys_may_not_act_for_the_operator(client, tenant, path):
    response = client.post(path, json={"reason": "mine"}, headers=tenant.headers())
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"


def test_the_dashboard_finds_a_job_retries_all_and_shows_it_done(app, client, tenant, worker):
    """Sign in, retry every failed job of the tenant from the dashboard (the CSRF header required), and read
    the job's detail again until the real worker has run it."""
    saved = client.post("/v1/memories", json={"content": "a note the provider refused"}, headers=tenant.headers())
    doc = f"memory:{saved.json()['memory_id']}"
    job_id = make_job(tenant.tenant_id, kind="embed", payload={"doc_ids": [doc]}, error="EmbeddingProviderError: 400")
    browser, _ = signed_in_client(app)
    found = browser.get(f"/dashboard/api/jobs/{job_id}")
    assert found.status_code == 200 and found.json()["state"] == "failed"
    assert browser.post("/dashboard/api/jobs:retry", json={"tenant": tenant.name}).status_code == 403  # no CSRF
    answer = browser.post("/dashboard/api/jobs:retry", json={"tenant": tenant.name}, headers=CSRF)
    assert answer.status_code == 202 and job_id in answer.json()["job_ids"]
    wait_for(lambda: browser.get(f"/dashboard/api/jobs/{job_id}").json()["state"] == "succeeded", timeout=60)
    detail = browser.get(f"/dashboard/api/jobs/{job_id}").json()
    assert detail["abandoned"] is None and detail["attempts"] == 1
    discard = browser.post(f"/dashboard/api/jobs/{job_id}/discard", json={"reason": "done"}, headers=CSRF)
    assert discard.status_code == 409
