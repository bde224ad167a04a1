"""Usage metering (CONTRACT section 9): per tenant and day, durable in PostgreSQL, counted once, and the same
through GET /v1/usage (the tenant's admin) and the operator's tenant objects."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from tests.helpers.api import OPERATOR, key_headers, provision, tenant_id_of


def _stored(tenant: str) -> dict[str, int]:
    from core.db import system_session

    with system_session() as session:
        row = session.execute(
            text(
                "SELECT u.requests, u.searches, u.saves, u.embedded_texts, u.embedding_tokens FROM tenant_usage u "
                "JOIN tenants t ON t.id = u.tenant_id WHERE t.name = :name AND u.day = :day"
            ),
            {"name": tenant, "day": datetime.now(UTC).date()},
        ).mappings().one_or_none()
    return dict(row) if row else {}


def test_usage_counts_equal_the_requests_made(client):
    made = provision(client)
    headers = key_headers(made)
    client.post("/v1/memories", json={"content": "the fiscal year starts in April"}, headers=headers)
    client.post("/v1/memories:batch", json={"items": [{"content": f"note {i}"} for i in range(3)]}, headers=headers)
    for question in ("fiscal year", "notes"):
        client.post("/v1/search", json={"question": question}, headers=headers)
    client.get("/v1/memories/1", headers=headers)
    client.post("/v1/memories", json={"content": ""}, headers=headers)  # refused with 422: a request, no save
    # 6 calls so far; this read is the 7th.
    usage = client.get("/v1/usage", headers=headers).json()
    assert usage["usage"]["requests"] == 7
    assert usage["usage"]["searches"] == 2
    assert usage["usage"]["saves"] == 4
    assert usage["usage"]["memories"] == 4 and usage["usage"]["datasources"] == 0
    assert usage["usage"]["embedding_tokens"] == 0
    assert set(usage["quotas"]) == {"max_memories", "max_datasources", "requests_per_minute", "embedding_texts_per_day"}
    # The operator sees the same figures, and the operator's own calls are not the tenant's.
    seen = client.get(f"/v1/tenants/{made['tenant']}", headers=OPERATOR).json()["usage"]
    assert (seen["requests"], seen["searches"], seen["saves"]) == (7, 2, 4)


def test_counts_are_flushed_to_postgresql_once(client):
    from core.tenancy.usage import buffer

    made = provision(client)
    headers = key_headers(made)
    for _ in range(3):
        client.get("/v1/memories", headers=headers)
    buffer.flush()
    assert _stored(made["tenant"])["requests"] == 3
    # A flush that committed but whose answer was lost is retried with the same id: counted once.
    client.get("/v1/memories", headers=headers)
    buffer.flush()
    assert _stored(made["tenant"])["requests"] == 4
    from core.db import system_session

    with system_session() as session:
        last = session.execute(text("SELECT id FROM usage_flushes ORDER BY at DESC LIMIT 1")).scalar_one()
    buffer._pending = (last, [{"tenant_id": tenant_id_of(made["tenant"]), "day": datetime.now(UTC).date().isoformat(),
                               "requests": 1, "searches": 0, "saves": 0}])  # fmt: skip
    buffer.flush()
    assert _stored(made["tenant"])["requests"] == 4
    assert client.get("/v1/usage", headers=headers).json()["usage"]["requests"] == 5


def test_usage_by_day(client):
    made = provision(client)
    headers = key_headers(made)
    client.post("/v1/memories", json={"content": "today"}, headers=headers)
    today = datetime.now(UTC).date()
    first = today - timedelta(days=2)
    report = client.get("/v1/usage", params={"from": first.isoformat(), "to": today.isoformat()}, headers=headers)
    days = report.json()["days"]
    assert [d["date"] for d in days] == [(first + timedelta(days=i)).isoformat() for i in range(3)]
    assert days[0]["requests"] == 0 and days[-1]["saves"] == 1
    for params, field in (
        ({"from": "yesterday"}, "from"),
        ({"from": today.isoformat(), "to": first.isoformat()}, "from"),
        ({"from": "2000-01-01", "to": today.isoformat()}, "from"),
    ):
        refused = client.get("/v1/usage", params=params, headers=headers)
        assert refused.status_code == 422 and refused.json()["error"]["field"] == field


def test_usage_needs_the_tenants_admin(client):
    made = provision(client)
    member = client.post("/v1/keys", json={"user": "m@example.com"}, headers=key_headers(made)).json()["api_key"]
    assert client.get("/v1/usage", headers={"Authorization": f"Bearer {member}"}).status_code == 403
    assert client.get("/v1/usage", headers=OPERATOR).status_code == 403


def test_storage_is_measured_for_tenants_that_changed(client):
    from core.tenancy.usage import measure_storage

    made = provision(client)
    headers = key_headers(made)
    client.post("/v1/memories", json={"content": secrets.token_hex(2500)}, headers=headers)
    measure_storage(max_tenants=10_000)
    first = client.get("/v1/usage", headers=headers).json()["usage"]["storage_bytes"]
    assert first > 5000
    client.post("/v1/memories", json={"content": secrets.token_hex(10000)}, headers=headers)
    measure_storage(max_tenants=10_000)
    assert client.get("/v1/usage", headers=headers).json()["usage"]["storage_bytes"] > first + 10000
