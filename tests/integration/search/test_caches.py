"""Per-process caches are bounded, report their size, hits and evictions, and eviction never changes an
answer (only latency)."""

from __future__ import annotations

import pytest

from core.caches import CACHE_EVICTIONS, BoundedCache, cache_sizes
from tests.helpers.api import save, search


@pytest.mark.parametrize(
    ("max_entries", "max_bytes", "puts", "kept"),
    [
        # Rule: the least recently used entry goes first once the entry bound is passed.
        (2, 0, ["a", "b", "c"], ["b", "c"]),
        # Rule: a byte bound evicts until the total fits, oldest first.
        (10, 25, ["a", "b", "c"], ["b", "c"]),
        # Rule: the entry just stored stays even when it alone passes the byte bound.
        (10, 5, ["a", "b"], ["b"]),
    ],
)
def test_bounded_cache_evicts_least_recently_used(max_entries, max_bytes, puts, kept):
    evicted: list[object] = []
    cache: BoundedCache[str] = BoundedCache(
        f"test-{max_entries}-{max_bytes}",
        max_entries=lambda: max_entries,
        max_bytes=(lambda: max_bytes) if max_bytes else None,
        weigh=lambda _value: 10,
        on_evict=lambda key, _value: evicted.append(key),
    )
    for key in puts:
        cache.put(key, key.upper())
    assert cache.keys() == kept
    assert sorted(evicted) == sorted(set(puts) - set(kept))
    assert cache_sizes()[cache.name] == (len(kept), 10 * len(kept))


def test_a_hit_makes_an_entry_recent():
    cache: BoundedCache[int] = BoundedCache("test-recency", max_entries=lambda: 2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recent
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"] and cache.get("b") is None
    assert cache.get_or_create("b", lambda: 4) == 4 and cache.keys() == ["c", "b"]


def test_evicting_a_tenants_index_handle_keeps_its_answers(client, make_tenant, monkeypatch):
    """With room for one open full-text index, searching another tenant evicts the first tenant's handle;
    the first tenant's next search reopens it and answers exactly as before."""
    from core.config import get_settings

    monkeypatch.setattr(get_settings(), "fulltext_max_open_indexes", 1)
    first, second = make_tenant("cache"), make_tenant("cache")
    for i in range(8):
        save(client, first, {"content": f"parcel {i} ships from warehouse {i % 3} by courier"})
        save(client, second, {"content": f"ledger {i} closes on day {i % 5} of the month"})
    body = {"question": "courier warehouse parcel", "max_memories": 5}
    before = search(client, first, body)
    evictions = CACHE_EVICTIONS.labels("fulltext_indexes")._value.get()
    search(client, second, {"question": "ledger closes"})
    assert CACHE_EVICTIONS.labels("fulltext_indexes")._value.get() > evictions
    after = search(client, first, body)
    assert [(h["id"], h["score"]) for h in after["memories"]] == [(h["id"], h["score"]) for h in before["memories"]]
    assert cache_sizes()["fulltext_indexes"][0] == 1


def test_every_per_tenant_cache_reports_its_size_on_metrics(client, tenant):
    """Operators see each bounded cache's entries, bytes, hits, misses and evictions by name."""
    from tests.helpers.api import OPERATOR_KEY

    save(client, tenant, {"content": "metrics of the caches after one search", "sync_embed": True})
    search(client, tenant, {"question": "caches metrics", "entities": ["memory:1"]})
    text = client.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR_KEY}"}).text
    for cache in ("fulltext_indexes", "search_facts", "catalog_snapshots", "dense_matrices", "dense_layouts"):
        assert f'engram_cache_entries{{cache="{cache}"}}' in text, cache
        assert f'engram_cache_misses_total{{cache="{cache}"}}' in text, cache


def test_evicting_a_tenants_vector_matrix_keeps_its_answers(client, make_tenant, monkeypatch):
    """With room for one tenant's vectors, another tenant's question search evicts the first tenant's
    matrix; the first tenant's next search reads its vectors again and ranks and scores exactly as before."""
    from core.config import get_settings

    monkeypatch.setattr(get_settings(), "dense_cache_max_tenants", 1)
    first, second = make_tenant("dense"), make_tenant("dense")
    for i in range(6):
        save(client, first, {"content": f"the nightly export {i} writes invoices to storage", "sync_embed": True})
        save(client, second, {"content": f"the pager rota {i} changes every monday", "sync_embed": True})
    body = {"question": "where do invoices get exported", "max_memories": 6}
    before = search(client, first, body)
    evictions = CACHE_EVICTIONS.labels("dense_matrices")._value.get()
    search(client, second, {"question": "who is on the pager"})
    assert CACHE_EVICTIONS.labels("dense_matrices")._value.get() > evictions
    after = search(client, first, body)
    assert before["channels"]["dense"] and not before["degraded"]
    assert [(h["id"], h["score"]) for h in after["memories"]] == [(h["id"], h["score"]) for h in before["memories"]]


def test_catalog_snapshots_are_bounded_by_bytes_and_take_their_memo_along(monkeypatch):
    """Catalog snapshots are weighed by their entities; one evicted to fit the MB bound drops what search
    memoised on it (a later search of that tenant reloads both, as after any eviction)."""
    from core.config import get_settings
    from core.entities.canonical import CatalogSnapshot
    from core.search import catalog

    def shop() -> CatalogSnapshot:  # 1 datasource + 50 models of 19 columns: 1,001 entities, ~0.8 MB counted
        models = [{"name": f"m{i}", "columns": [f"c{j}" for j in range(19)]} for i in range(50)]
        return CatalogSnapshot.from_dicts([{"name": "shop", "models": models}])

    monkeypatch.setattr(get_settings(), "catalog_cache_max_mb", 1)
    first, second = shop(), shop()
    assert catalog.catalog_entities(first) == 1_001
    catalog.clear_cache()  # only these two snapshots are weighed
    try:
        catalog._snapshots.put(-1, (1, first, None))
        catalog.snapshot_memo(first)["shown"] = {"shop.m1": True}
        evictions = CACHE_EVICTIONS.labels("catalog_snapshots")._value.get()
        catalog._snapshots.put(-2, (1, second, None))
        assert CACHE_EVICTIONS.labels("catalog_snapshots")._value.get() == evictions + 1
        assert catalog._snapshots.get(-1) is None and catalog._snapshots.get(-2) is not None
        assert catalog.snapshot_memo(first) == {}  # a fresh memo: the old one went with its snapshot
        # A snapshot replaced by a newer version of its tenant's catalog takes its memo along too.
        from core.entities import store

        monkeypatch.setattr(store, "load_snapshot", lambda _session, _tenant_id: shop())
        empty = catalog.load_snapshot(None, tenant_id=-3, version=0)  # type: ignore[arg-type]
        assert catalog.catalog_entities(empty) == 0  # version 0: no catalog, the loader is not asked
        catalog.snapshot_memo(empty)["shown"] = {"shop": False}
        assert id(empty) in catalog._memos.keys()
        newer = catalog.load_snapshot(None, tenant_id=-3, version=5)  # type: ignore[arg-type]
        assert catalog.catalog_entities(newer) == 1_001
        assert id(empty) not in catalog._memos.keys()
    finally:
        catalog.clear_cache()
