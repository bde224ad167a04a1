"""Calls most tests make: the operator's key, a save, a search, a job row in any state, a tenant provisioned
over REST, the error shape, and the Prometheus samples."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

OPERATOR_KEY = "egop_test-operator-key"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}


def save(client, tenant, body, key=None):  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json=body, headers=tenant.headers(key))
    assert response.status_code == 201, response.text
    return response.json()["memory_id"]


def search(client, tenant, body, key=None, expect=200):  # type: ignore[no-untyped-def]
    response = client.post("/v1/search", json=body, headers=tenant.headers(key))
    assert response.status_code == expect, response.text
    return response.json()


def ids(hits):  # type: ignore[no-untyped-def]
    return [h["id"] for h in hits]


def assert_error(response, status: int, code: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    assert "Traceback" not in response.text
    if code:
        assert body["error"]["code"] == code
    return body["error"]


def make_job(tenant_id: int | None, *, kind: str = "embed", state: str = "failed", age_s: float = 0, **fields):  # type: ignore[no-untyped-def]
    """A job row in any state, without running anything (the listing and retry rules read rows only)."""
    from core.db import system_session
    from core.jobs.models import Job

    stamp = datetime.now(UTC) - timedelta(seconds=age_s)
    job = Job(
        id=uuid.uuid4().hex,
        tenant_id=tenant_id,
        kind=kind,
        state=state,
        payload=fields.pop("payload", {"doc_ids": []}),
        attempts=fields.pop("attempts", 1),
        error=fields.pop("error", "RuntimeError: boom" if state == "failed" else None),
        created_at=stamp,
        updated_at=stamp,
        **fields,
    )
    with system_session() as session:
        session.add(job)
    return job.id


def scrape(client) -> dict[str, dict[tuple, float]]:  # type: ignore[no-untyped-def]
    response = client.get("/metrics", headers=OPERATOR)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def unique_name(prefix: str = "op") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def provision(client, name: str | None = None, **body):  # type: ignore[no-untyped-def]
    response = client.post("/v1/tenants", json={"name": name or unique_name(), **body}, headers=OPERATOR)
    assert response.status_code == 201, response.text
    return response.json()


def signed_in_client(app):  # type: ignore[no-untyped-def]
    """A separate client (own cookie jar) signed in through the form."""
    from fastapi.testclient import TestClient

    browser = TestClient(app, raise_server_exceptions=False)
    response = browser.post("/dashboard/login", data={"key": OPERATOR_KEY}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/dashboard"
    return browser, response


def key_headers(made: dict) -> dict[str, str]:  # type: ignore[type-arg]
    """The Authorization header of a tenant provisioned over REST (its first admin key)."""
    return {"Authorization": f"Bearer {made['api_key']}"}


def tenant_id_of(name: str) -> int:
    """The id PostgreSQL gave the tenant called ``name`` (system mode)."""
    from sqlalchemy import text

    from core.db import system_session

    with system_session() as session:
        return int(session.execute(text("SELECT id FROM tenants WHERE name = :n"), {"n": name}).scalar_one())
