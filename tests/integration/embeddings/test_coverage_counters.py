"""Coverage from counters (core.embeddings.coverage): every write that changes whether a memory's vector
matches its content moves the count in its own transaction; reconcile folds the deltas and sets a converged
tenant's exact count; the operator's view reads every tenant at once."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from core.config import get_settings
from tests.helpers.embeddings import coverage_by_kind, run_pending_jobs


def _model() -> str:
    from core.embeddings.providers import get_embedder

    return get_embedder(get_settings().embedding_model).name


def _memory_row(client, tenant) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    row = coverage_by_kind(client, tenant)[("memory", _model())]
    return row["indexed"], row["expected"]


def _exact(tenant_id: int) -> tuple[int, int]:
    """The count the old per-call query computed: vectors whose hash matches their memory's content."""
    from core.db import system_connection

    with system_connection() as connection:
        indexed = connection.execute(
            text(
                "SELECT count(*) FROM embeddings e JOIN memories m ON m.tenant_id = e.tenant_id"
                " AND 'memory:' || m.id = e.canonical_id WHERE e.tenant_id = :t AND e.model = :model"
                " AND m.status <> 'forgotten' AND e.content_hash = encode(sha256(convert_to(m.content, 'UTF8')), 'hex')"
            ),
            {"t": tenant_id, "model": _model()},
        ).scalar_one()
        expected = connection.execute(
            text("SELECT count(*) FROM memories WHERE tenant_id = :t AND status <> 'forgotten'"), {"t": tenant_id}
        ).scalar_one()
    return int(indexed), int(expected)


def _save(client, tenant, content: str) -> str:  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json={"content": content}, headers=tenant.headers())
    assert response.status_code == 201, response.text
    return str(response.json()["memory_id"])


# Each step: what the client does, then the (indexed, expected) coverage must show, equal to the exact count.
STEPS = [
    ("save two", (0, 2)),
    ("embed", (2, 2)),
    ("edit one", (1, 2)),
    ("embed", (2, 2)),
    ("re-save the same content", (2, 2)),
    ("forget one", (1, 1)),
    ("save one", (1, 2)),
    ("embed", (2, 2)),
    ("purge one", (1, 1)),
]


def test_each_write_moves_the_count_in_its_own_transaction(client, tenant):
    ids: list[str] = []
    h = tenant.headers()
    for step, expected in STEPS:
        if step == "save two":
            ids += [_save(client, tenant, "the orders table is daily"), _save(client, tenant, "refunds lag a day")]
        elif step == "save one":
            ids.append(_save(client, tenant, "a third note about invoices"))
        elif step == "embed":
            run_pending_jobs(tenant.tenant_id)
        elif step == "edit one":
            response = client.patch(f"/v1/memories/{ids[0]}", json={"content": "the orders table is hourly"}, headers=h)
            assert response.status_code == 200, response.text
        elif step == "re-save the same content":
            response = client.post("/v1/memories", json={"id": ids[1], "content": "refunds lag a day"}, headers=h)
            assert response.status_code in (200, 201), response.text
        elif step == "forget one":
            assert client.delete(f"/v1/memories/{ids[1]}", headers=h).status_code in (200, 204)
        elif step == "purge one":
            response = client.delete(f"/v1/memories/{ids[0]}", params={"purge": "true"}, headers=h)
            assert response.status_code in (200, 204), response.text
        assert _memory_row(client, tenant) == expected == _exact(tenant.tenant_id), step


def test_reconcile_folds_deltas_and_sets_a_converged_tenants_exact_count(client, tenant):
    from core.db import system_connection
    from core.embeddings.reconcile import reconcile_embeddings

    for n in range(3):
        _save(client, tenant, f"note {n} on the nightly load")
    run_pending_jobs(tenant.tenant_id)
    assert _memory_row(client, tenant) == (3, 3)
    # A delta neither transaction of a race could see right (a memory edited while its vector was written).
    with system_connection() as connection:
        connection.execute(
            text(
                "INSERT INTO embedding_coverage_deltas (tenant_id, doc_kind, model, delta)"
                " VALUES (:t, 'memory', :m, -2)"
            ),
            {"t": tenant.tenant_id, "m": _model()},
        )
        # ... and a write since the last check, so reconcile looks at the tenant again.
        bump = text("UPDATE tenants SET change_seq = change_seq + 1 WHERE id = :t")
        connection.execute(bump, {"t": tenant.tenant_id})
    assert _memory_row(client, tenant) == (1, 3)
    assert tenant.tenant_id not in reconcile_embeddings(model=_model())
    assert _memory_row(client, tenant) == (3, 3)
    with system_connection() as connection:
        pending = connection.execute(
            text("SELECT count(*) FROM embedding_coverage_deltas WHERE tenant_id = :t"), {"t": tenant.tenant_id}
        ).scalar_one()
    assert pending == 0


@pytest.mark.parametrize("tenants", [12])
def test_the_operators_view_counts_every_tenant(client, make_tenant, tenants):
    from tests.helpers.api import OPERATOR_KEY

    made = [make_tenant("cov") for _ in range(tenants)]
    for n, t in enumerate(made):
        for k in range(n % 3):
            _save(client, t, f"tenant {n} note {k}")
        if n % 2:
            run_pending_jobs(t.tenant_id)
    response = client.get("/v1/ops/coverage", headers={"Authorization": f"Bearer {OPERATOR_KEY}"})
    assert response.status_code == 200, response.text
    rows = {r["tenant"]: r for r in response.json()["coverage"] if r["doc_kind"] == "memory"}
    for t in made:
        assert (rows[t.name]["indexed"], rows[t.name]["expected"]) == _exact(t.tenant_id), t.name
