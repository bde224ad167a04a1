"""A PATCH or a DELETE of one memory is two round trips (core.memories.edits): the tenant's row and the memory's,
locked in that order; then everything the edit leaves behind, with the COMMIT. No ORM statement either way."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from core.db import system_session
from tests.helpers.events import listening, sql_calls

LOCK = [("advance-change-seq",), "edit-lock"]


def save(client, tenant, body):  # type: ignore[no-untyped-def]
    response = client.post("/v1/memories", json=body, headers=tenant.headers())
    assert response.status_code == 201, response.text
    return response.json()["memory_id"]


@contextmanager
def recorded(tenant_id: int) -> Iterator[dict[str, list[Any]]]:
    """The keys of each core.sql call's statements, the ORM statements the tenant's sessions run, and the outbox
    at each commit (the app's background work, such as usage metering, has sessions of its own)."""
    seen: dict[str, list[Any]] = {"calls": [], "orm": [], "outbox": []}

    def orm(state: Any) -> None:
        if state.session.info.get("tenant_id") == tenant_id:
            seen["orm"].append(state.statement)

    def committing(session: Session) -> None:
        seen["outbox"].append(list(session.info.get("outbox", [])))

    with sql_calls(tenant_id) as calls, listening(Session, do_orm_execute=orm, before_commit=committing):
        yield seen
    seen["calls"] = [[key if key[0] != "edit-lock" else "edit-lock" for key in keys] for keys in calls]


def _rows(statement: str, **params: Any) -> list[Any]:
    with system_session() as session:
        return list(session.execute(text(statement), params).all())


def test_a_patch_is_two_round_trips_and_writes_its_revision_embed_job_and_trail(client, tenant):
    mid = save(client, tenant, {"content": "refunds take 30 days", "kind": "fact", "tags": ["policy"]})
    body = {"content": "refunds take 14 days", "kind": "decision"}
    with recorded(tenant.tenant_id) as seen:
        response = client.patch(f"/v1/memories/{mid}", json=body, headers=tenant.headers())
    assert response.status_code == 200, response.text
    revise = ("revise", ("content", "importance", "kind"))  # a new kind brings its default importance
    assert seen["calls"] == [LOCK, [revise, ("record-versions",), ("enqueue",), ("memory-trail",)]]
    assert seen["orm"] == []
    out = response.json()
    got = client.get(f"/v1/memories/{mid}", headers=tenant.headers()).json()
    assert {k: v for k, v in out.items() if k not in ("access_count", "last_accessed_at")} == {
        k: v for k, v in got.items() if k not in ("access_count", "last_accessed_at")
    }
    assert (out["content"], out["kind"], out["tags"]) == ("refunds take 14 days", "decision", ["policy"])
    versions = client.get(f"/v1/memories/{mid}/history", headers=tenant.headers()).json()["versions"]
    assert [v["content"] for v in versions] == ["refunds take 14 days", "refunds take 30 days"]
    # The embed job of the new content, committed with the edit and handed to the outbox at its commit.
    jobs = _rows(
        "SELECT id FROM jobs WHERE tenant_id = :t AND kind = 'embed' AND payload -> 'doc_ids' ? :doc"
        " ORDER BY created_at",
        t=tenant.tenant_id,
        doc=f"memory:{mid}",
    )
    assert len(jobs) == 2 and [jobs[1][0]] in seen["outbox"]
    audit = client.get("/v1/audit", params={"action": "memory.update"}, headers=tenant.headers()).json()
    assert [e["target"] for e in audit["entries"]] == [f"memory:{mid}"]


def test_a_patch_of_tags_alone_queues_no_embed_job_and_keeps_a_revision(client, tenant):
    mid = save(client, tenant, {"content": "invoices close monthly"})
    with recorded(tenant.tenant_id) as seen:
        response = client.patch(f"/v1/memories/{mid}", json={"tags": ["billing"]}, headers=tenant.headers())
    assert response.status_code == 200 and response.json()["tags"] == ["billing"]
    assert seen["calls"] == [LOCK, [("revise", ("tags",)), ("record-versions",), ("memory-trail",)]]
    # Nothing versioned changes: no revision.
    with recorded(tenant.tenant_id) as seen:
        response = client.patch(f"/v1/memories/{mid}", json={"source": "the wiki"}, headers=tenant.headers())
    assert response.status_code == 200 and response.json()["source"] == "the wiki"
    assert seen["calls"] == [LOCK, [("revise", ("source",)), ("memory-trail",)]]
    assert len(client.get(f"/v1/memories/{mid}/history", headers=tenant.headers()).json()["versions"]) == 2


def test_a_refused_edit_writes_nothing(client, tenant, member_key):
    mid = save(client, tenant, {"content": "owned by the admin key", "category": "workspace"})
    seq = _rows("SELECT change_seq FROM tenants WHERE id = :t", t=tenant.tenant_id)
    other = member_key("someone-else@example.com")
    assert client.patch(f"/v1/memories/{mid}", json={"content": "x"}, headers=tenant.headers(other)).status_code == 403
    assert client.delete(f"/v1/memories/{mid}", headers=tenant.headers(other)).status_code == 403
    assert client.patch("/v1/memories/no-such", json={"content": "x"}, headers=tenant.headers()).status_code == 404
    assert client.patch(f"/v1/memories/{mid}", json={"kind": None}, headers=tenant.headers()).status_code == 422
    assert _rows("SELECT change_seq FROM tenants WHERE id = :t", t=tenant.tenant_id) == seq
    assert client.get(f"/v1/memories/{mid}", headers=tenant.headers()).json()["content"] == "owned by the admin key"


def test_a_forget_is_two_round_trips_and_strips_the_references_to_it(client, tenant):
    mid = save(client, tenant, {"content": "the old rule"})
    referrer = save(client, tenant, {"content": "see the old rule", "linked_entities": [f"memory:{mid}"]})
    with recorded(tenant.tenant_id) as seen:
        response = client.delete(f"/v1/memories/{mid}", params={"reason": "outdated"}, headers=tenant.headers())
    assert response.status_code == 200 and response.json() == {"memory_id": mid, "status": "forgotten"}
    assert seen["calls"] == [LOCK, [("forget", "strip"), ("forget", "forget"), ("memory-trail",)]]
    assert seen["orm"] == []
    assert client.get(f"/v1/memories/{mid}", headers=tenant.headers()).status_code == 404
    gone = client.get(f"/v1/memories/{mid}", params={"include_forgotten": "true"}, headers=tenant.headers()).json()
    assert (gone["status"], gone["forget_reason"]) == ("forgotten", "outdated")
    kept = client.get(f"/v1/memories/{referrer}", headers=tenant.headers()).json()
    assert kept["entities"] == []
    versions = client.get(f"/v1/memories/{referrer}/history", headers=tenant.headers()).json()["versions"]
    assert [v["entities"] for v in versions] == [[], [f"memory:{mid}"]]
    audit = client.get("/v1/audit", params={"action": "memory.forget"}, headers=tenant.headers()).json()
    assert [e["target"] for e in audit["entries"]] == [f"memory:{mid}"]


def test_a_purge_removes_the_row_its_revisions_vectors_and_links_and_leaves_a_tombstone(client, tenant):
    target = save(client, tenant, {"content": "a neighbour"})
    mid = save(
        client,
        tenant,
        {"content": "to be purged", "associations": [{"target_id": target, "relation_type": "related_to"}]},
    )
    client.patch(f"/v1/memories/{mid}", json={"content": "to be purged for good"}, headers=tenant.headers())
    with system_session() as session:  # a vector of the memory (as the embed job would write)
        session.execute(
            text(
                "INSERT INTO embeddings (tenant_id, canonical_id, model, doc_kind, dims, content_hash, embedding)"
                " VALUES (:t, :doc, 'test-model', 'memory', 3, 'h', '[1,0,0]')"
            ),
            {"t": tenant.tenant_id, "doc": f"memory:{mid}"},
        )
    with recorded(tenant.tenant_id) as seen:
        response = client.delete(f"/v1/memories/{mid}", params={"purge": "true"}, headers=tenant.headers())
    assert response.status_code == 200 and response.json() == {"memory_id": mid, "status": "purged"}
    purge = [("forget", step) for step in ("drop_vectors", "drop_versions", "drop_links", "drop_memory", "tombstone")]
    assert seen["calls"] == [LOCK, [("forget", "strip"), *purge, ("memory-trail",)]]
    params = {"t": tenant.tenant_id, "id": mid, "doc": f"memory:{mid}"}
    for table, where in (
        ("memories", "id = :id"),
        ("memory_versions", "memory_id = :id"),
        ("associations", "source_id = :id OR target_id = :id"),
        ("embeddings", "canonical_id = :doc"),
    ):
        assert _rows(f"SELECT 1 FROM {table} WHERE tenant_id = :t AND ({where})", **params) == [], table
    seq = _rows("SELECT change_seq FROM tenants WHERE id = :t", t=tenant.tenant_id)[0][0]
    assert _rows("SELECT change_seq FROM tombstones WHERE tenant_id = :t AND doc_id = :doc", **params) == [(seq,)]
    assert _rows("SELECT 1 FROM memories WHERE tenant_id = :t AND id = :id", t=tenant.tenant_id, id=target) == [(1,)]


def test_a_patch_of_links_and_associations_resolves_and_checks_them_between_the_round_trips(client, tenant, tmp_path):
    """Entities (an inline example query here) are resolved as on a save, a stale memory they re-link is active
    again, and associations replace the memory's own after their targets are checked."""
    import sqlite3

    db = tmp_path / "shop.db"
    sqlite3.connect(db).close()
    headers = tenant.headers()
    assert client.post("/v1/datasources", json={"name": "shop", "url": f"sqlite:///{db}"}, headers=headers).is_success
    columns = {"columns": [{"name": "amount", "type": "INTEGER"}, {"name": "status", "type": "TEXT"}]}
    assert client.put("/v1/models/shop/orders", json=columns, headers=headers).is_success
    by_status = {"source_model": "orders", "dimensions": ["status"]}
    mid = save(client, tenant, {"content": "orders by status", "linked_entities": by_status})
    other = save(client, tenant, {"content": "a neighbour"})
    assert client.patch("/v1/models/shop/orders", json={"remove_columns": ["status"]}, headers=headers).is_success
    assert client.get(f"/v1/memories/{mid}", headers=headers).json()["status"] == "stale"

    query = {"source_model": "orders", "measures": [{"formula": "amount:sum"}]}
    response = client.patch(f"/v1/memories/{mid}", json={"linked_entities": query}, headers=headers)
    assert response.status_code == 200, response.text
    out = response.json()
    assert (out["status"], out["stale_reason"], out["query"]) == ("active", None, query)
    assert set(out["entities"]) == {"shop.orders", "shop.orders.amount"}

    links = [{"target_id": other, "relation_type": "related_to", "weight": 0.7}]
    response = client.patch(f"/v1/memories/{mid}", json={"associations": links}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["associations"] == [{"target_id": other, "relation_type": "related_to", "weight": 0.7}]
    missing = [{"target_id": "no-such", "relation_type": "related_to"}]
    response = client.patch(f"/v1/memories/{mid}", json={"associations": missing, "content": "x"}, headers=headers)
    assert response.status_code == 422 and response.json()["error"]["field"] == "associations.0.target_id"
    kept = client.get(f"/v1/memories/{mid}", headers=headers).json()
    assert kept["content"] == "orders by status"
    assert kept["associations"] == [{"target_id": other, "relation_type": "related_to", "weight": 0.7}]
