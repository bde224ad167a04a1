"""What search keeps between calls (compiled queries, dense matrices, catalog memos) never outlives a write."""

from __future__ import annotations

from tests.helpers.api import ids, save, search


def test_writes_and_forgets_show_in_the_next_search(client, tenant):
    """A warmed search sees the next revision, forget and association at once (hits and graph hops alike)."""
    top = save(client, tenant, {"content": "invoice reconciliation runs nightly", "sync_embed": True})
    hop = save(
        client,
        tenant,
        {"content": "see the runbook", "associations": [{"target_id": top, "weight": 0.9}], "sync_embed": True},
    )
    body = {"question": "invoice reconciliation", "max_memories": 3}
    for _ in range(3):  # warm every cache on this corpus
        out = search(client, tenant, body)
    assert ids(out["memories"])[:2] == [top, hop]
    response = client.patch(
        f"/v1/memories/{top}", json={"content": "invoice reconciliation runs hourly"}, headers=tenant.headers()
    )
    assert response.status_code == 200, response.text
    out = search(client, tenant, body)
    assert out["memories"][0]["id"] == top and out["memories"][0]["text"] == "invoice reconciliation runs hourly"
    assert client.delete(f"/v1/memories/{hop}", headers=tenant.headers()).status_code == 200
    assert ids(search(client, tenant, body)["memories"]) == [top]
    assert client.delete(f"/v1/memories/{top}", headers=tenant.headers()).status_code == 200
    assert search(client, tenant, body)["memories"] == []
    assert search(client, tenant, {"entities": [f"memory:{top}"]})["memories"] == []


def test_callers_never_share_compiled_visibility(client, tenant, member_key):
    """Compiled queries are keyed by caller and filters: one caller's visibility never serves another."""
    key = member_key()
    a = save(client, tenant, {"content": "ledger close checklist", "agent_id": "a"}, key=key)
    b = save(client, tenant, {"content": "ledger close checklist too", "agent_id": "b"}, key=key)
    for _ in range(2):
        for agent, expected in (("a", {a}), ("b", {b})):
            for body in ({"question": "ledger close"}, {"entities": [f"memory:{a}", f"memory:{b}"]}):
                seen = set(ids(search(client, tenant, {**body, "agent_id": agent}, key=key)["memories"]))
                assert seen == expected, (agent, body)
        for kind, expected in (("fact", {a, b}), ("todo", set())):
            seen = set(ids(search(client, tenant, {"question": "ledger close", "kind": kind})["memories"]))
            assert seen == expected


def test_exact_matrix_is_refreshed_with_new_vectors_not_reread(client, tenant, monkeypatch):
    """A search after a write reads only the vectors written since the cached matrix (the whole matrix only
    when a vector was deleted), and ranks exactly as a matrix read whole would."""
    import numpy as np

    from core.db import tenant_session
    from core.embeddings import matrix as shared

    loads: list[int] = []
    full_load = shared.load_matrix

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        loads.append(1)
        return full_load(*args, **kwargs)

    monkeypatch.setattr(shared, "load_matrix", counted)
    body = {"question": "warehouse freight costs"}
    first = save(client, tenant, {"content": "warehouse freight costs rose in march", "sync_embed": True})
    search(client, tenant, body)
    assert len(loads) == 1
    key = next(k for k in shared.cached_keys() if k[0] == tenant.tenant_id)  # type: ignore[index]
    before = shared.cached(key).memories  # type: ignore[union-attr]
    old_vector = before.matrix[before.row(f"memory:{first}")].copy()
    second = save(client, tenant, {"content": "freight invoices from the warehouse", "sync_embed": True})
    assert (
        client.patch(
            f"/v1/memories/{first}",
            json={"content": "warehouse freight costs fell in april", "sync_embed": True},
            headers=tenant.headers(),
        ).status_code
        == 200
    )
    out = search(client, tenant, body)
    assert set(ids(out["memories"])) == {first, second} and out["channels"]["dense"]
    assert len(loads) == 1  # refreshed, not read again
    refreshed = shared.cached(key)
    assert refreshed is not None
    # The edited memory's vector was replaced (sync_embed on the edit), the new one added.
    assert not np.allclose(refreshed.memories.matrix[refreshed.memories.row(f"memory:{first}")], old_vector)
    assert f"memory:{second}" in refreshed.memories
    with tenant_session(tenant.tenant_id) as session:
        whole = full_load(session, tenant_id=tenant.tenant_id, model=key[1], dims=key[2])
    assert whole.version == refreshed.version
    for side in ("memories", "entities"):
        got, want = getattr(refreshed, side), getattr(whole, side)
        assert sorted(got.ids) == sorted(want.ids)
        for doc_id in want.ids:
            assert np.allclose(got.matrix[got.row(doc_id)], want.matrix[want.row(doc_id)], atol=1e-6)
    assert client.delete(f"/v1/memories/{second}?purge=true", headers=tenant.headers()).status_code == 200
    assert ids(search(client, tenant, body)["memories"]) == [first]
    assert len(loads) == 2  # a deleted vector: read whole again


def test_fulltext_started_before_the_head_still_reads_your_writes(client, tenant):
    """With entities and a question, full-text starts from the change seq this process saw last while the
    head is read; a write in between is still found (the head shows it, and full-text runs again)."""
    from core.search import service

    assert service.EARLY_FULLTEXT
    anchor = save(client, tenant, {"content": "glacier survey index"})
    body = {"entities": [f"memory:{anchor}"], "question": "glacier melt rates"}
    assert ids(search(client, tenant, body)["memories"]) == [anchor]
    assert service._last_heads[tenant.tenant_id].change_seq > 0
    later = save(client, tenant, {"content": "glacier melt rates doubled"})
    assert later in ids(search(client, tenant, body)["memories"])


def test_dense_layout_is_kept_across_writes_that_touch_none_of_its_memories(client, tenant):
    """The exact path's layout (query rows, run neighbours) survives a plain note saved, and is extended when a
    plain note's vector adds a row; a write to a memory in a run rebuilds it; either way the search ranks as
    with a layout made afresh."""
    from core.search import dense

    for i in range(6):
        body = {"content": f"turn {i} about the harbour crane schedule", "run_id": f"run-{i % 2}", "sync_embed": True}
        if i == 3:
            body["query"] = {"measures": ["crane_hours"]}
        save(client, tenant, body)
    question = {"question": "harbour crane schedule", "max_memories": 8}

    def layout() -> dense._Layout:
        return next(v for k, v in dense._layouts.items() if k[0] == tenant.tenant_id)  # type: ignore[index]

    def same_as_fresh(out: dict) -> None:  # type: ignore[type-arg]
        dense._layouts.clear()
        fresh = search(client, tenant, question)
        assert [(h["id"], h["score"]) for h in out["memories"]] == [(h["id"], h["score"]) for h in fresh["memories"]]

    search(client, tenant, question)
    built = layout()
    assert built.has_context and len(built.members) == 6
    save(client, tenant, {"content": "a plain note about cranes"})  # no run, no query: not a member
    out = search(client, tenant, question)
    assert layout().rows is built.rows and layout().change_seq > built.change_seq
    same_as_fresh(out)
    kept = layout()
    joined = save(client, tenant, {"content": "turn 6 about the harbour crane schedule", "run_id": "run-0"})
    out = search(client, tenant, question)
    assert layout().rows is not kept.rows and joined in layout().members
    same_as_fresh(out)
    rebuilt = layout()
    member = sorted(rebuilt.members)[0]
    assert client.delete(f"/v1/memories/{member}", headers=tenant.headers()).status_code == 200
    out = search(client, tenant, question)
    assert member not in layout().members
    same_as_fresh(out)
    # A plain note whose vector lands (sync_embed) adds a matrix row: the layout is extended, not rebuilt.
    base = layout()
    plain = save(client, tenant, {"content": "crane schedule printed for the harbour office", "sync_embed": True})
    out = search(client, tenant, question)
    extended = layout()
    assert extended.n == base.n + 1 and extended.lineage == base.lineage
    assert extended.rows["example_queries"] is base.rows["example_queries"] and plain not in extended.members
    assert plain in ids(out["memories"])
    same_as_fresh(out)


def test_a_tenant_without_a_catalog_sees_its_first_datasource_at_once(client, tenant, tmp_path):
    """A tenant that never wrote its catalog (version 0) is searched with an empty catalog without reading
    it, and its full-text catch-ups skip the catalog's tables while it has no datasource; its first catalog
    write moves the version and adds a datasource, so the next search resolves and finds the new entity."""
    from tests.helpers.catalog import sqlite_source

    save(client, tenant, {"content": "orders are counted once per customer"})
    before = search(client, tenant, {"entities": ["shop"], "question": "orders counted"})
    assert before["resolved_input_entities"] == [] and any("shop" in w for w in before["warnings"])
    with sqlite_source(tmp_path) as (url, _):
        response = client.post("/v1/datasources", json={"name": "shop", "url": url}, headers=tenant.headers())
        assert response.status_code == 201, response.text
    after = search(client, tenant, {"entities": ["shop"], "question": "orders counted"})
    assert after["resolved_input_entities"] == ["shop"]
    assert "shop" in [hit["id"] for hit in search(client, tenant, {"question": "shop datasource"})["entities"]]


def test_a_search_behind_the_cached_dense_layout_takes_it_as_it_was(client, tenant):
    """While saves and vectors land, a search whose snapshot or matrix is older than the cached layout's takes
    that layout, cut to its own matrix, without reading one afresh (each is what a fresh read gives); one older
    than the layout's members rebuilds, and never replaces the cached layout with its older one."""
    import numpy as np

    from core.db import tenant_session
    from core.embeddings import matrix as shared
    from core.embeddings.providers import get_embedder
    from core.embeddings.refresh import embed_docs
    from core.search import dense

    question = {"question": "quarry blasting schedule", "max_memories": 8}
    for i in range(5):
        body = {"content": f"turn {i} of the quarry blasting schedule", "run_id": "quarry", "sync_embed": True}
        save(client, tenant, body)
    # A member whose vector lands later: in the layout's runs from the start, in its matrix once embedded.
    late = save(client, tenant, {"content": "turn 5 of the quarry blasting schedule", "run_id": "quarry"})
    search(client, tenant, question)

    def cached() -> dense._Layout:
        return next(v for k, v in dense._layouts.items() if k[0] == tenant.tenant_id)  # type: ignore[index]

    def layout_for(matrix: shared.TenantMatrix, change_seq: int) -> dense._Layout:
        with tenant_session(tenant.tenant_id) as session:
            return dense._layout(
                session, tenant_id=tenant.tenant_id, model=model, matrix=matrix, change_seq=change_seq
            )

    def same(got: dense._Layout, want: dense._Layout) -> None:
        assert got.n == want.n and got.has_context == want.has_context and got.members == want.members
        for bucket in dense.MEMORY_BUCKETS:
            assert np.array_equal(got.rows[bucket], want.rows[bucket]), bucket
            assert np.array_equal(got.neighbours[bucket], want.neighbours[bucket]), bucket

    key = next(k for k in shared.cached_keys() if k[0] == tenant.tenant_id)  # type: ignore[index]
    model = key[1]
    old_matrix = shared.cached(key)
    assert old_matrix is not None
    before = cached()
    old_seq = before.change_seq
    assert late in before.members and old_matrix.memories.row(f"memory:{late}") is None
    with tenant_session(tenant.tenant_id) as session:
        embed_docs(session, tenant_id=tenant.tenant_id, doc_ids=[f"memory:{late}"], embedder=get_embedder("local"))
    for i in range(2):  # plain notes with vectors: rows past the late member's
        save(client, tenant, {"content": f"a plain note {i} on blasting", "sync_embed": True})
    search(client, tenant, question)
    latest = cached()
    assert latest.n == old_matrix.memories.n + 3 and latest.change_seq > old_seq
    assert (latest.neighbours["memories"] == old_matrix.memories.n).any()  # the late member is a neighbour now

    new_matrix = shared.cached(key)
    assert new_matrix is not None
    behind = layout_for(old_matrix, old_seq)  # the older snapshot and matrix of a search begun before
    older_snapshot = layout_for(new_matrix, old_seq)  # the latest matrix, an older snapshot
    # Both taken from the cached layout, not read, and the cached one left as it was.
    assert behind.members is latest.members and older_snapshot.members is latest.members
    assert cached() is latest
    assert (behind.neighbours["memories"] < old_matrix.memories.n).all()
    dense._layouts.clear()
    same(behind, layout_for(old_matrix, old_seq))
    dense._layouts.clear()
    same(older_snapshot, layout_for(new_matrix, old_seq))

    # A member written: the layout is read afresh from then on, and a search from before it reads its own.
    dense._layouts.clear()
    joined = save(client, tenant, {"content": "turn 6 of the quarry blasting schedule", "run_id": "quarry"})
    search(client, tenant, question)
    rebuilt = cached()
    assert joined in rebuilt.members and rebuilt.since > old_seq
    before_it = layout_for(new_matrix, old_seq)
    assert before_it.members is not rebuilt.members and cached() is rebuilt


def test_an_extended_layout_scores_the_memories_bucket_from_its_own_rows(client, tenant):
    """When most memories carry a query, the memories bucket is scored from a copy of its few rows' vectors; a
    plain note whose vector lands in the same matrix buffer extends the layout, and is scored with the rest
    (not left out by the copy made before it)."""
    from core.db import tenant_session
    from core.embeddings import matrix as shared
    from core.search import dense

    for i in range(8):
        body = {"content": f"lighthouse lamp maintenance report {i}", "query": {"measures": [f"lamp_hours_{i}"]}}
        save(client, tenant, {**body, "sync_embed": True})
    first = save(client, tenant, {"content": "lighthouse lamp maintenance notes", "sync_embed": True})
    question = {"question": "lighthouse lamp maintenance", "max_memories": 8}
    assert ids(search(client, tenant, question)["memories"]) == [first]
    key = next(k for k in shared.cached_keys() if k[0] == tenant.tenant_id)  # type: ignore[index]
    before = shared.cached(key)
    layout = next(v for k, v in dense._layouts.items() if k[0] == tenant.tenant_id)  # type: ignore[index]
    assert "memories" in layout.blocks  # the minority bucket's copy
    second = save(client, tenant, {"content": "lighthouse lamp maintenance log", "sync_embed": True})
    out = search(client, tenant, question)
    after = shared.cached(key)
    assert before is not None and after is not None
    assert after.memories.matrix.base is before.memories.matrix.base  # the same buffer, one more row
    assert sorted(ids(out["memories"])) == sorted([first, second])
    extended = next(v for k, v in dense._layouts.items() if k[0] == tenant.tenant_id)  # type: ignore[index]
    assert extended.n == layout.n + 1 and len(extended.rows["memories"]) == 2
    held = extended.blocks.get("memories")
    assert held is None or held[1].shape[1] == 2  # never the copy of the one row it had before
    with tenant_session(tenant.tenant_id) as session:
        searched = dense.DenseSearch(session, tenant_id=tenant.tenant_id, question=question["question"])
        ranked = searched.rank("memories", 8)
    assert sorted(doc_id for doc_id, _ in ranked) == sorted([first, second])
