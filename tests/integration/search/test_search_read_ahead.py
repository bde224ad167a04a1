"""While a tenant's writes stream in, a search reads the change feeds of its caches (the full-text index, the
tenant's facts, the dense layout) ahead, with its head, instead of in a round trip each after it (core.search.service's
_head_queries); a feed that does not start where a cache stands is left unused."""

from __future__ import annotations

from typing import Any
from unittest.mock import ANY

from core.db import read_one_snapshot, tenant_session
from core.search import facts, index
from tests.helpers.api import ids, save, search
from tests.helpers.events import sql_calls

FEEDS = {"feed-changes", "feed-gone"}
# The caches' own feeds: the full-text index's (its seq and whether a catalog exists among them), the facts', the
# dense layout's. The head gives what the index's own read of its seq and catalog would.
OWN_FEEDS = {
    "feed-memories",
    "feed-tombstones",
    "feed-seq",
    "feed-has-catalog",
    "facts",
    "facts-gone",
    "layout-changes",
}
QUESTION = {"question": "which harbour ships the zinc crates"}


def _feeds(keys: list[Any]) -> set[str]:
    return {key for key in keys if isinstance(key, str) and key in FEEDS}


def _split(seen: list[list[Any]]) -> tuple[list[Any], list[list[Any]]]:
    """The search's call holding its head, and every other call."""
    (first,) = [keys for keys in seen if "head" in keys]
    return first, [keys for keys in seen if keys is not first]


def _read_ahead(session: Any, tenant_id: int, points: dict[str, int]) -> dict[str, Any]:
    """The feeds of ``points`` read with the head, in one round trip, as a search reads them."""
    from core import sql
    from core.search import feeds
    from core.search.rankings import head_from_rows, head_query

    head_rows, *rows = sql.run_many(
        session, [head_query(tenant_id=tenant_id, model=None), *feeds.queries(tenant_id, points)]
    )
    head = head_from_rows(head_rows, model=None)
    return feeds.split(points, rows, change_seq=head.change_seq, has_catalog=head.has_catalog)


def _filled(client, tenant) -> None:  # type: ignore[no-untyped-def]
    # Enough memories for the index to hold changes in memory (core.search.fulltext's DELTA_MIN_READER_DOCS).
    items = [{"content": f"ledger line {n}: the inland depot ships crates"} for n in range(300)]
    response = client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
    assert response.status_code == 200, response.text
    search(client, tenant, QUESTION)  # (the index opened, the facts loaded)


def test_a_search_under_writes_reads_the_feeds_with_its_head_and_finds_the_write(client, tenant):
    _filled(client, tenant)
    save(client, tenant, {"content": "a first write of the stream"})
    search(client, tenant, QUESTION)  # the head moved: the tenant's writes stream in
    fresh = save(client, tenant, {"content": "the harbour ships the zinc crates on Fridays"})
    with sql_calls(tenant.tenant_id) as seen:
        found = search(client, tenant, QUESTION)
    assert ids(found["memories"])[0] == fresh  # read-your-writes, through the feeds read ahead
    first, rest = _split(seen)
    assert _feeds(first) == FEEDS
    # Neither catch-up read a feed of its own (the full-text index's seq and catalog flag came with the head).
    assert not any(OWN_FEEDS & {key for key in keys if isinstance(key, str)} for keys in seen), seen
    assert all(not _feeds(keys) for keys in rest), seen
    seq = facts.held_seq(tenant.tenant_id)
    assert seq is not None and index.held_seq(tenant.tenant_id) == seq  # both caught up to the same head

    # No write since: the feeds come back empty, and the next search stops reading them.
    with sql_calls(tenant.tenant_id) as seen:
        search(client, tenant, QUESTION)
    assert _feeds(_split(seen)[0]) == FEEDS
    with sql_calls(tenant.tenant_id) as seen:
        again = search(client, tenant, QUESTION)
    assert not any(_feeds(keys) for keys in seen), seen
    assert ids(again["memories"])[0] == fresh


def test_a_quiet_tenants_search_reads_no_feed(client, tenant):
    _filled(client, tenant)
    with sql_calls(tenant.tenant_id) as seen:
        search(client, tenant, QUESTION)
        search(client, tenant, QUESTION)
    assert not any(_feeds(keys) for keys in seen), seen


def test_a_feed_read_after_another_seq_is_left_unused(client, tenant):
    """Rows read ahead from another point than where the cache stands (another search caught it up meanwhile)
    are not applied: the cache reads its own."""
    _filled(client, tenant)
    tenant_id = tenant.tenant_id
    kept = save(client, tenant, {"content": "a memory both caches must hold"})
    facts_seq, index_seq = facts.held_seq(tenant_id), index.held_seq(tenant_id)
    assert facts_seq is not None and index_seq is not None
    bogus = [("bogus", "active", None, None, "core", "fact", None, False, [], [])]
    with tenant_session(tenant_id) as session:
        read_one_snapshot(session)
        current = index._change_seq(session, tenant_id)
        held = facts.tenant_facts(
            session,
            tenant_id=tenant_id,
            current_seq=current,
            memories=301,
            fed=facts.Fed(facts_seq - 1, [bogus, []]),
        )
        assert held is not None and held.get("bogus") is None and held.get(kept) is not None
        assert index.catch_up_in(
            session, tenant_id, current_seq=current, fed=facts.Fed(index_seq - 1, [[(current,)], [], [], []])
        )
    assert ids(search(client, tenant, {"question": "a memory both caches must hold"})["memories"])[0] == kept


def test_the_dense_layouts_changes_are_read_with_the_head_under_writes(client, tenant, monkeypatch):
    """The dense channel's layout (core.search.dense) checks the memories written since it against those it is
    made from: under writes that check's rows come with the head, and a member written is still seen."""
    from core.search import dense, feeds

    asked: list[dict[str, int]] = []
    queries = feeds.queries

    def recorded(tenant_id: int, points: dict[str, int]):  # type: ignore[no-untyped-def]
        asked.append(dict(points))
        return queries(tenant_id, points)

    monkeypatch.setattr(feeds, "queries", recorded)

    _filled(client, tenant)
    for n in range(4):
        save(client, tenant, {"content": f"the zinc crates leave harbour {n}", "run_id": "r", "sync_embed": True})
    search(client, tenant, QUESTION)

    def layout() -> dense._Layout:
        return next(v for k, v in dense._layouts.items() if k[0] == tenant.tenant_id)  # type: ignore[index]

    save(client, tenant, {"content": "a plain note"})
    search(client, tenant, QUESTION)  # the head moved: the tenant's writes stream in
    built = layout()
    save(client, tenant, {"content": "another plain note"})
    asked.clear()
    with sql_calls(tenant.tenant_id) as seen:
        search(client, tenant, QUESTION)
    first, rest = _split(seen)
    assert asked == [{"fulltext": ANY, "facts": ANY, "dense": built.change_seq}]
    assert "feed-changes" in first and not any("layout-changes" in keys for keys in seen), seen
    assert layout().rows is built.rows and layout().change_seq > built.change_seq  # kept: no member written
    joined = save(client, tenant, {"content": "the zinc crates leave harbour 9", "run_id": "r", "sync_embed": True})
    asked.clear()
    with sql_calls(tenant.tenant_id) as seen:
        found = search(client, tenant, QUESTION)
    first, rest = _split(seen)
    assert [set(points) for points in asked] == [{"fulltext", "facts", "dense"}]
    assert "feed-changes" in first and not any("layout-changes" in keys for keys in seen), seen
    assert joined in layout().members and joined in ids(found["memories"])
    # A search without a question runs no dense channel: it does not ask for the layout's changes.
    save(client, tenant, {"content": "a third plain note"})
    asked.clear()
    with sql_calls(tenant.tenant_id) as seen:
        search(client, tenant, {"entities": [f"memory:{joined}"]})
    assert any("head" in keys for keys in seen) and not any("layout-changes" in keys for keys in seen), seen
    assert all("dense" not in points for points in asked), asked

    # Rows read from another point than where the layout stands are not used: it reads its own.
    held = layout()
    with tenant_session(tenant.tenant_id) as session:
        read_one_snapshot(session)
        bogus = facts.Fed(held.change_seq - 1, [[("not-a-member", False)]])
        assert dense._still_holds(session, held, tenant_id=tenant.tenant_id, fed=bogus)
        member = facts.Fed(held.change_seq, [[(sorted(held.members)[0], True)]])
        assert not dense._still_holds(session, held, tenant_id=tenant.tenant_id, fed=member)


def test_each_cache_gets_from_the_merged_feed_what_its_own_feed_returns(client, catalog):
    """The feeds read once for all three caches (core.search.feeds) give each cache the rows its own statements
    return after its own point, or after a later one, in the same snapshot: memories of every kind written,
    forgotten and purged, and a catalog doc deleted."""
    from core import sql
    from core.search import dense, feeds

    tenant = catalog
    tenant_id = tenant.tenant_id
    with tenant_session(tenant_id) as session:
        start = index._change_seq(session, tenant_id)
    save(client, tenant, {"content": "a plain note about the depot"})
    save(client, tenant, {"content": "a turn of a conversation", "run_id": "talk"})
    forgotten = save(client, tenant, {"content": "a note to forget"})
    save(client, tenant, {"content": "revenue by month", "query": {"measures": ["revenue"]}})
    save(client, tenant, {"content": "the depot opened", "occurred_at": "2024-03-01T09:00:00Z"})
    purged = save(client, tenant, {"content": "a note to purge", "run_id": "talk"})
    assert client.delete(f"/v1/memories/{forgotten}", headers=tenant.headers()).status_code == 200
    assert client.delete(f"/v1/memories/{purged}?purge=true", headers=tenant.headers()).status_code == 200
    assert client.delete("/v1/models/shop/orders", headers=tenant.headers()).status_code == 200

    def own(name: str, since: int) -> list[Any]:
        if name == feeds.FULLTEXT:
            return sql.run_many(session, index.feed_queries(tenant_id, since))
        if name == feeds.FACTS:
            return sql.run_many(session, facts.feed_queries(tenant_id, since))
        return sql.run_many(session, dense.layout_feed_queries(tenant_id, since))

    def same(rows: list[Any]) -> list[list[Any]]:
        return [sorted(map(repr, statement)) for statement in rows]

    with tenant_session(tenant_id) as session:
        read_one_snapshot(session)
        current = index._change_seq(session, tenant_id)
        assert current - start >= 9
        for points in (
            {feeds.FULLTEXT: start, feeds.FACTS: start, feeds.DENSE: start},
            {feeds.FULLTEXT: start + 3, feeds.FACTS: start + 1, feeds.DENSE: start + 5},
            {feeds.FACTS: start + 2, feeds.DENSE: start},
            {feeds.DENSE: start + 4},
            {feeds.FULLTEXT: current, feeds.FACTS: start},
        ):
            fed = _read_ahead(session, tenant_id, points)
            assert set(fed) == set(points)
            for name, since in points.items():
                assert fed[name].since == since
                assert same(fed[name].rows) == same(own(name, since)), (name, since)
                # A cache another search caught up meanwhile takes the rows after its own point; one behind
                # the feed reads its own.
                for later in range(since + 1, current + 1):
                    assert same(fed[name].rows_after(later)) == same(own(name, later)), (name, since, later)
                assert fed[name].rows_after(since - 1) is None
            if feeds.DENSE in points and points[feeds.DENSE] == start:
                assert any(member for _, member in fed[feeds.DENSE].rows[0])  # (the layout's members are seen)


def test_a_cache_caught_up_past_the_feeds_point_takes_its_rows_from_the_feed(client, tenant):
    """Another search caught the caches up after this one read its feeds: each takes the feed's rows after
    where it stands now, and reads nothing of its own. (A tenant without a catalog: the head says so, as the
    full-text index's own statement would.)"""
    from core import sql
    from core.search import feeds

    _filled(client, tenant)
    tenant_id = tenant.tenant_id
    first = save(client, tenant, {"content": "a memory written before the feed's point"})
    search(client, tenant, QUESTION)  # both caches hold the first
    kept = save(client, tenant, {"content": "a memory both caches must take from the feed"})
    facts_seq, index_seq = facts.held_seq(tenant_id), index.held_seq(tenant_id)
    assert facts_seq is not None and index_seq is not None
    with tenant_session(tenant_id) as session:
        read_one_snapshot(session)
        points = {feeds.FULLTEXT: index_seq - 2, feeds.FACTS: facts_seq - 2}
        fed = _read_ahead(session, tenant_id, points)
        current = index._change_seq(session, tenant_id)
        own_seq, _, _, own_catalogs = sql.run_many(session, index.feed_queries(tenant_id, points[feeds.FULLTEXT]))
        assert own_catalogs == [] and fed[feeds.FULLTEXT].rows[3] == own_catalogs
        assert fed[feeds.FULLTEXT].rows[0] == own_seq == [(current,)]
        with sql_calls(tenant_id) as seen:
            held = facts.tenant_facts(
                session, tenant_id=tenant_id, current_seq=current, memories=302, fed=fed[feeds.FACTS]
            )
            assert index.catch_up_in(session, tenant_id, current_seq=current, fed=fed[feeds.FULLTEXT])
        assert not any(OWN_FEEDS & {key for key in keys if isinstance(key, str)} for keys in seen), seen
        assert held is not None and held.get(kept) is not None and held.get(first) is not None
        assert facts.held_seq(tenant_id) == index.held_seq(tenant_id) == current
    found = ids(search(client, tenant, {"question": "a memory both caches must take from the feed"})["memories"])
    assert found[0] == kept


def test_a_search_reads_ahead_for_a_cache_behind_the_last_head_even_when_the_head_held(client, tenant):
    """The head did not move between this process's last two reads of it, but the full-text index still stands
    behind it (the searches that read it ranked no question): the question's search reads the feeds with its
    head, not the index's own feed after it."""
    from core.search import service

    _filled(client, tenant)
    fresh = save(client, tenant, {"content": "the harbour ships the zinc crates on Fridays"})
    entities = {"entities": ["memory:" + fresh]}
    search(client, tenant, entities)  # reads the moved head; catches up no full-text index
    search(client, tenant, entities)  # the same head again: no longer moving
    last = service._last_heads[tenant.tenant_id].change_seq
    assert tenant.tenant_id not in service._moving and index.held_seq(tenant.tenant_id) < last  # type: ignore[operator]
    with sql_calls(tenant.tenant_id) as seen:
        found = search(client, tenant, QUESTION)
    first, rest = _split(seen)
    assert "feed-changes" in first, seen
    assert not any(OWN_FEEDS & {key for key in keys if isinstance(key, str)} for keys in rest), seen
    assert ids(found["memories"])[0] == fresh


def test_a_cache_far_behind_the_head_reads_its_own_feed(client, tenant, monkeypatch):
    """Caches more than AHEAD_SPAN changes behind the last head are left out of the read ahead: each reads its
    own feed when it catches up, and the search still finds every write."""
    from core.search import service

    _filled(client, tenant)
    save(client, tenant, {"content": "a first write of the stream"})
    search(client, tenant, QUESTION)  # the head moved: the tenant's writes stream in
    monkeypatch.setattr(service, "AHEAD_SPAN", 0)
    fresh = save(client, tenant, {"content": "the harbour ships the zinc crates on Fridays"})
    search(client, tenant, {"entities": ["memory:" + fresh]})  # the last head: the fresh write's
    with sql_calls(tenant.tenant_id) as seen:
        found = search(client, tenant, QUESTION)
    first, rest = _split(seen)
    assert not _feeds(first), seen
    assert any("feed-memories" in keys for keys in rest), seen  # the index read its own
    assert ids(found["memories"])[0] == fresh


def test_the_change_feeds_run_on_generic_plans_that_scan_the_change_seq_index(client, tenant, stack):
    """Every change feed statement (core.changes.feed_range) is prepared once per connection and runs on its
    generic plan, never planned for its values, and for the memories that plan is a range scan of the
    (tenant_id, change_seq) index: not a scan of the table, which an open-ended range's plan without values is."""
    import psycopg

    from core import sql
    from core.search import dense, feeds

    _filled(client, tenant)
    with psycopg.connect(stack.database_url.replace("postgresql+psycopg://", "postgresql://")) as owner:
        owner.execute("ANALYZE memories")
    tenant_id = tenant.tenant_id
    with tenant_session(tenant_id) as session:
        since = index._change_seq(session, tenant_id)
    save(client, tenant, {"content": "one more crate shipped from the depot"})
    points = {feeds.FULLTEXT: since, feeds.FACTS: since, feeds.DENSE: since}
    with tenant_session(tenant_id) as session:
        read_one_snapshot(session)
        for _ in range(2):  # (the second time on statements the connection has prepared)
            for queries in (
                feeds.queries(tenant_id, points),
                index.feed_queries(tenant_id, since),
                facts.feed_queries(tenant_id, since),
                dense.layout_feed_queries(tenant_id, since),
            ):
                results = sql.run_many(session, queries)
                assert any(rows for rows in results)  # (the note saved after ``since``)
        driver = session.connection().connection.driver_connection
        prepared = driver.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE name LIKE 'engram_%' AND statement LIKE '%change_seq <=%'"
        ).fetchall()
        # feed-changes, feed-gone, feed-memories, feed-tombstones, facts, facts-gone, layout-changes (and those
        # of the earlier searches on this pooled connection)
        assert len(prepared) >= 7, prepared
        for statement, generic_plans, custom_plans in prepared:
            assert generic_plans >= 2 and custom_plans == 0, statement
            if "FROM memories" in statement:
                plan = "\n".join(row[0] for row in driver.execute(f"EXPLAIN (GENERIC_PLAN) {statement}"))
                assert "ix_memories_tenant_seq" in plan and "Seq Scan on memories" not in plan, plan
