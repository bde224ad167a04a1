"""GET /v1/jobs, GET /v1/jobs/{id} and POST /v1/jobs/{id}/retry on the real stack (CONTRACT section 7)."""

from __future__ import annotations

import uuid

import pytest

from tests.helpers.api import OPERATOR, make_job


def test_tenant_lists_only_its_jobs_and_filters_by_kind_and_state(client, make_tenant):
    a, b = make_tenant("jobs-a"), make_tenant("jobs-b")
    mine = make_job(a.tenant_id, kind="ingest", state="failed")
    make_job(a.tenant_id, kind="embed", state="succeeded")
    theirs = make_job(b.tenant_id, kind="ingest", state="failed")
    body = client.get("/v1/jobs", params={"kind": "ingest", "state": "failed"}, headers=a.headers()).json()
    ids = [j["id"] for j in body["jobs"]]
    assert mine in ids and theirs not in ids
    assert all(j["kind"] == "ingest" and j["state"] == "failed" for j in body["jobs"])
    assert body["jobs"][0]["tenant"] == a.name and body["jobs"][0]["error"] == "RuntimeError: boom"
    assert client.get(f"/v1/jobs/{theirs}", headers=a.headers()).status_code == 404


def test_operator_sees_every_tenant_and_filters_by_tenant_name(client, make_tenant):
    a, b = make_tenant("jobs-op-a"), make_tenant("jobs-op-b")
    ja, jb = make_job(a.tenant_id), make_job(b.tenant_id)
    everything = {j["id"] for j in client.get("/v1/jobs", params={"limit": 200}, headers=OPERATOR).json()["jobs"]}
    assert {ja, jb} <= everything
    only_b = client.get("/v1/jobs", params={"tenant": b.name}, headers=OPERATOR).json()["jobs"]
    assert [j["id"] for j in only_b] == [jb]
    assert client.get(f"/v1/jobs/{ja}", headers=OPERATOR).json()["tenant"] == a.name
    # A tenant key may not look across tenants, even by naming one.
    refused = client.get("/v1/jobs", params={"tenant": b.name}, headers=a.headers())
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert client.get("/v1/jobs", params={"tenant": "no-such-tenant"}, headers=OPERATOR).status_code == 404


def test_pagination_walks_every_job_once_newest_first(client, tenant):
    created = [make_job(tenant.tenant_id, state="succeeded", age_s=100 - i) for i in range(7)]
    seen, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        body = client.get("/v1/jobs", params=params, headers=tenant.headers()).json()
        seen += [j["id"] for j in body["jobs"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(created))


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"kind": "nope"}, 422, "kind"),
        ({"state": "done"}, 422, "state"),
        ({"limit": "0"}, 422, "limit"),
        ({"limit": "201"}, 422, "limit"),
        ({"limit": "ten"}, 422, "limit"),
        ({"cursor": "!!garbage"}, 400, "cursor"),
    ],
)
def test_bad_filters_are_4xx_json(client, tenant, params, status, field):
    response = client.get("/v1/jobs", params=params, headers=tenant.headers())
    assert response.status_code == status
    assert response.json()["error"]["field"] == field


def test_jobs_need_a_key(client):
    assert client.get("/v1/jobs").status_code == 401
    assert client.post(f"/v1/jobs/{uuid.uuid4().hex}/retry").status_code == 401


def test_retry_requeues_a_failed_job(client, tenant):
    job_id = make_job(tenant.tenant_id, kind="embed", state="failed", attempts=5)
    response = client.post(f"/v1/jobs/{job_id}/retry", headers=tenant.headers())
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["state"] == "queued" and body["attempts"] == 0 and body["finished_at"] is None


def test_retry_rules_by_state(client, tenant):
    """Failed and stuck jobs are retried; succeeded or progressing ones are a 409 (a double click must not
    run a job twice in parallel)."""
    succeeded = make_job(tenant.tenant_id, state="succeeded")
    fresh_queued = make_job(tenant.tenant_id, state="queued")
    fresh_running = make_job(tenant.tenant_id, state="running")
    stuck_queued = make_job(tenant.tenant_id, state="queued", age_s=3600)
    stuck_running = make_job(tenant.tenant_id, state="running", age_s=86400)
    for job_id in (succeeded, fresh_queued, fresh_running):
        response = client.post(f"/v1/jobs/{job_id}/retry", headers=tenant.headers())
        assert response.status_code == 409 and response.json()["error"]["code"] == "conflict"
    for job_id in (stuck_queued, stuck_running):
        assert client.post(f"/v1/jobs/{job_id}/retry", headers=tenant.headers()).status_code == 202


def test_retry_needs_an_admin_key_and_hides_other_tenants(client, tenant, member_key, make_tenant):
    job_id = make_job(tenant.tenant_id)
    member = client.post(f"/v1/jobs/{job_id}/retry", headers={"Authorization": f"Bearer {member_key()}"})
    assert member.status_code == 403
    other = make_tenant("jobs-other")
    assert client.post(f"/v1/jobs/{job_id}/retry", headers=other.headers()).status_code == 404
    system_job = make_job(None, kind="prune")
    assert client.post(f"/v1/jobs/{system_job}/retry", headers=tenant.headers()).status_code == 404
    assert client.post(f"/v1/jobs/{system_job}/retry", headers=OPERATOR).status_code == 202
    assert client.post(f"/v1/jobs/{uuid.uuid4().hex}/retry", headers=OPERATOR).status_code == 404


def test_retried_job_runs_again_on_a_real_worker(client, tenant, worker):
    """A permanently failed embed job, retried after its cause is removed, ends succeeded."""
    saved = client.post("/v1/memories", json={"content": "retry me"}, headers=tenant.headers()).json()
    job_id = make_job(
        tenant.tenant_id, kind="embed", state="failed", payload={"doc_ids": f"memory:{saved['memory_id']}"}
    )
    from core.db import system_session
    from core.jobs.models import Job

    with system_session() as session:  # the cause is fixed: the payload becomes a list of doc ids
        session.get(Job, job_id).payload = {"doc_ids": [f"memory:{saved['memory_id']}"]}
    assert client.post(f"/v1/jobs/{job_id}/retry", headers=tenant.headers()).status_code == 202
    from tests.helpers.processes import wait_for

    wait_for(
        lambda: client.get(f"/v1/jobs/{job_id}", headers=tenant.headers()).json()["state"] == "succeeded", timeout=60
    )
