"""Bounded per-process caches of per-tenant state, with their size, hits and evictions as metrics.

An API process keeps derived state per tenant (full-text index handles, vector matrices, eligibility
facts, catalog snapshots). With thousands of tenants none of it may grow without bound: each cache here
holds at most ``max_entries`` tenants (and, when the caller weighs entries, ``max_bytes``), evicting the
least recently used first. Everything in these caches is rebuilt from PostgreSQL on a miss, so eviction
changes latency, never an answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge

V = TypeVar("V")

CACHE_ENTRIES = Gauge("engram_cache_entries", "Entries held by a per-process cache", ["cache"])
CACHE_BYTES = Gauge("engram_cache_bytes", "Approximate bytes held by a per-process cache", ["cache"])
CACHE_HITS = Counter("engram_cache_hits_total", "Lookups answered by a per-process cache", ["cache"])
CACHE_MISSES = Counter("engram_cache_misses_total", "Lookups a per-process cache could not answer", ["cache"])
CACHE_EVICTIONS = Counter("engram_cache_evictions_total", "Entries evicted to keep a cache in bounds", ["cache"])

_registry: dict[str, BoundedCache[object]] = {}
_registry_lock = threading.Lock()


class BoundedCache(Generic[V]):
    """A thread-safe LRU map bounded by entry count and, optionally, by the bytes ``weigh`` reports."""

    def __init__(
        self,
        name: str,
        *,
        max_entries: Callable[[], int],
        max_bytes: Callable[[], int] | None = None,
        weigh: Callable[[V], int] | None = None,
        on_evict: Callable[[Hashable, V], None] | None = None,
    ) -> None:
        self.name = name
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._weigh = weigh
        self._on_evict = on_evict
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        # The cache's counters, labelled once (a search looks up a handful of caches; labels() per lookup
        # cost more than the lookup).
        self._hits, self._misses = CACHE_HITS.labels(name), CACHE_MISSES.labels(name)
        with _registry_lock:
            _registry[name] = self  # type: ignore[assignment]

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
        (self._hits if hit is not None else self._misses).inc()
        return None if hit is None else hit[0]

    def peek(self, key: Hashable) -> V | None:
        """The cached value, as :meth:`get` but neither counted as a lookup nor moved up the LRU order."""
        hit = self._items.get(key)  # (one dict lookup: atomic under the GIL)
        return None if hit is None else hit[0]

    def put(self, key: Hashable, value: V) -> None:
        weight = self._weigh(value) if self._weigh is not None else 0
        evicted: list[tuple[Hashable, V]] = []
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, weight)
            self._bytes += weight
            evicted = self._shrink_locked(keep=key)
            self._publish_locked()
        self._evicted(evicted)

    def get_or_create(self, key: Hashable, create: Callable[[], V]) -> V:
        """The cached value, or ``create()`` stored under ``key`` (created under the lock: at most once)."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
        if hit is not None:
            self._hits.inc()
            return hit[0]
        self._misses.inc()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                return hit[0]
            value = create()
            weight = self._weigh(value) if self._weigh is not None else 0
            self._items[key] = (value, weight)
            self._bytes += weight
            evicted = self._shrink_locked(keep=key)
            self._publish_locked()
        self._evicted(evicted)
        return value

    def pop(self, key: Hashable) -> V | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._publish_locked()
        return None if old is None else old[0]

    def drop_tenant(self, tenant_id: int) -> int:
        """Drop the entries of one tenant (keyed by its id, or by a tuple leading with it); returns how many."""
        dropped: list[tuple[Hashable, V]] = []
        with self._lock:
            for key in list(self._items):
                if key == tenant_id or (isinstance(key, tuple) and key and key[0] == tenant_id):
                    value, weight = self._items.pop(key)
                    self._bytes -= weight
                    dropped.append((key, value))
            self._publish_locked()
        if self._on_evict is not None:
            for key, value in dropped:
                self._on_evict(key, value)
        return len(dropped)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
            self._publish_locked()

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._items)

    def values(self) -> list[V]:
        with self._lock:
            return [value for value, _ in self._items.values()]

    def items(self) -> list[tuple[Hashable, V]]:
        with self._lock:
            return [(key, value) for key, (value, _) in self._items.items()]

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _shrink_locked(self, *, keep: Hashable) -> list[tuple[Hashable, V]]:
        evicted: list[tuple[Hashable, V]] = []
        max_entries = max(1, self._max_entries())
        max_bytes = self._max_bytes() if self._max_bytes is not None else 0
        while len(self._items) > max_entries or (max_bytes > 0 and self._bytes > max_bytes and len(self._items) > 1):
            key, (value, weight) = next(iter(self._items.items()))
            if key == keep:  # the entry just used stays, even alone over the byte bound
                self._items.move_to_end(key)
                if len(self._items) == 1:
                    break
                continue
            del self._items[key]
            self._bytes -= weight
            evicted.append((key, value))
        return evicted

    def _publish_locked(self) -> None:
        CACHE_ENTRIES.labels(self.name).set(len(self._items))
        CACHE_BYTES.labels(self.name).set(self._bytes)

    def _evicted(self, evicted: list[tuple[Hashable, V]]) -> None:
        if not evicted:
            return
        CACHE_EVICTIONS.labels(self.name).inc(len(evicted))
        if self._on_evict is not None:
            for key, value in evicted:
                self._on_evict(key, value)


def drop_tenant_everywhere(tenant_id: int) -> int:
    """Drop one tenant's entries from every registered cache (an offboarded tenant's state is erased)."""
    with _registry_lock:
        caches = list(_registry.values())
    return sum(cache.drop_tenant(tenant_id) for cache in caches)


def cache_sizes() -> dict[str, tuple[int, int]]:
    """Entries and bytes of every registered cache, by name (for operators and tests)."""
    with _registry_lock:
        caches = list(_registry.values())
    return {cache.name: (len(cache), cache.bytes) for cache in caches}
