"""Request budgets kept in Redis, so they hold across API replicas (the `limits` library, sliding window).

Three budgets: per API key (ENGRAM_RATE_LIMIT_PER_SECOND on average, bursts up to ENGRAM_RATE_LIMIT_BURST),
per tenant (its requests_per_minute quota, every key together), and per client address for keys that fail
to authenticate (past it, a failed lookup is answered 429 rather than 401; a valid key is never refused).
A process spends a large budget from a lease: one Redis hit takes a small share of it at once (see
``lease_size``; never more than the key's requests in this process over the last lease period, so a slow
client hits Redis once a request), and the requests that follow are admitted from that share in memory, so
most requests cost no Redis round trip (it was the largest part of a request's CPU outside its work: the send to Redis
alone ~0.12 ms). The leased share is counted in Redis when taken, so every replica together still never
admits more than the budget; a lease not used up within ``_LEASE_SECONDS`` is dropped, which can refuse
others at most that share early. Budgets under ``_LEASE_FROM_LIMIT`` requests (a tight key budget, a small
requests_per_minute quota, the bad-key budget) are hit once per request, exactly as before.
When Redis is unreachable the limiter fails open: a save must not fail because its budget
cannot be read. It then logs a warning and leaves Redis alone for a few seconds, so an outage does not add
a connect timeout to every request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from limits import RateLimitItem, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.aio.storage import RedisStorage as AsyncRedisStorage
from limits.aio.strategies import SlidingWindowCounterRateLimiter as AsyncSlidingWindowCounterRateLimiter
from limits.storage import RedisStorage
from limits.strategies import SlidingWindowCounterRateLimiter
from starlette.types import Scope

from core.config import get_settings
from core.runtime import ServiceNotRunning, resolve_redis_url

log = logging.getLogger("engram.ratelimit")

_RETRY_REDIS_AFTER_SECONDS = 5.0
# An admitted request's RateLimit-Remaining comes from the window read from Redis at most this long ago, less
# the requests this process admitted since: one Redis call per request (the hit) instead of two. The budget
# itself is enforced by the hit, exactly and across replicas; a refusal always reads the window afresh.
_STATS_MAX_AGE_SECONDS = 1.0
_STATS_MAX_KEYS = 10_000
# Leases (see the module docstring): a budget of at least _LEASE_FROM_LIMIT requests is taken from Redis a
# hundredth at a time (at most _LEASE_MAX), and a lease serves requests for at most _LEASE_SECONDS.
_LEASE_FROM_LIMIT = 200
_LEASE_MAX = 20
_LEASE_SECONDS = 0.5
# A client address may fail authentication this often per minute before it gets 429 without a lookup.
INVALID_KEYS_PER_MINUTE = 120


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    limit: int
    remaining: int
    reset_seconds: int

    def headers(self) -> dict[str, str]:
        """The IETF RateLimit header fields (and Retry-After when refused)."""
        headers = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset_seconds),
        }
        if not self.allowed:
            headers["Retry-After"] = str(max(1, self.reset_seconds))
        return headers


# Where an admitted request's verdict waits for its response (api.observe adds the header fields to it).
SCOPE_KEY = "engram.ratelimit"


def remember_verdict(scope: Scope, verdict: Verdict) -> None:
    """Keep the key's budget on the request, so every answer to it says the budget: a route's own Response,
    an error raised after admission, a streamed body."""
    scope[SCOPE_KEY] = verdict


def header_fields(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The RateLimit header fields of the request's admitted verdict, as ASGI headers (none if unmetered)."""
    verdict = scope.get(SCOPE_KEY)
    if verdict is None:
        return []
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in verdict.headers().items()]


class RedisRateLimiter:
    """One budget store, two ways in: ``hit`` for sync callers (a thread), ``ahit`` for the event loop.

    Both spend the same Redis counters (the same `limits` keys). The event loop's way uses redis-py's asyncio
    client: a request's Redis round trip then no longer stalls every other request on the loop, at the same
    CPU as the sync call (~0.07 ms a hit) where a thread hop around the sync call costs twice that.
    """

    _CONNECT_OPTIONS: dict[str, Any] = {"socket_connect_timeout": 0.25, "socket_timeout": 0.25}

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._limiter: SlidingWindowCounterRateLimiter | None = None
        self._url = ""
        # The asyncio client is bound to the loop it was made on (a test client runs a loop per client).
        self._async_limiter: AsyncSlidingWindowCounterRateLimiter | None = None
        self._async_key: tuple[str, asyncio.AbstractEventLoop | None] = ("", None)
        self._down_until = 0.0
        # identifier key -> [read at (monotonic), remaining then, reset time (epoch), admitted here since]
        self._windows: dict[str, list[float]] = {}
        # identifier key -> [expires (monotonic), requests left, remaining besides them, reset time (epoch)]
        self._leases: dict[str, list[float]] = {}
        # identifier key -> [period start (monotonic), requests in it, requests in the period before]
        self._paces: dict[str, list[float]] = {}

    def _redis_url(self) -> str | None:
        if time.monotonic() < self._down_until:
            return None
        url = get_settings().redis_url
        if not url:
            try:
                url = resolve_redis_url()
            except ServiceNotRunning:
                return None
        return url

    def _get(self) -> SlidingWindowCounterRateLimiter | None:
        url = self._redis_url()
        if url is None:
            return None
        with self._lock:
            if self._limiter is None or url != self._url:
                storage = RedisStorage(url, **self._CONNECT_OPTIONS)
                self._limiter, self._url = SlidingWindowCounterRateLimiter(storage), url
            return self._limiter

    def _get_async(self) -> AsyncSlidingWindowCounterRateLimiter | None:
        url = self._redis_url()
        if url is None:
            return None
        key = (url, asyncio.get_running_loop())
        if self._async_limiter is None or key != self._async_key:
            storage = AsyncRedisStorage(
                url.replace("redis://", "async+redis://", 1).replace("rediss://", "async+rediss://", 1),
                implementation="redispy",
                **self._CONNECT_OPTIONS,
            )
            self._async_limiter, self._async_key = AsyncSlidingWindowCounterRateLimiter(storage), key
        return self._async_limiter

    def _failed(self, error: Exception) -> None:
        self._down_until = time.monotonic() + _RETRY_REDIS_AFTER_SECONDS
        log.warning("rate limiter unavailable, letting requests through: %s", error)

    def hit(self, item: RateLimitItem, identifier: str) -> Verdict | None:
        """Spend one request of `identifier`'s budget; None when the budget cannot be read (fail open)."""
        key = item.key_for(identifier)
        leased = self._from_lease(item, key)
        if leased is not None:
            return leased
        limiter = self._get()
        if limiter is None:
            return None
        size = min(lease_size(item), self._pace(key))
        try:
            allowed = limiter.hit(item, identifier, cost=size)
            if not allowed and size > 1:  # near the budget's end: one request is still exact
                size = 1
                allowed = limiter.hit(item, identifier)
            window = self._recent_window(key, size) if allowed else None
            if window is None:
                stats = limiter.get_window_stats(item, identifier)
                window = self._remember_window(key, stats.remaining, stats.reset_time, size if allowed else 0)
        except Exception as error:  # noqa: BLE001 - any storage failure must let the request through
            self._failed(error)
            return None
        return self._leased(item, key, allowed=allowed, size=size, window=window)

    async def ahit(self, item: RateLimitItem, identifier: str) -> Verdict | None:
        """``hit`` without blocking the event loop: the same budget, the same verdict, the same fail-open."""
        key = item.key_for(identifier)
        leased = self._from_lease(item, key)
        if leased is not None:
            return leased
        limiter = self._get_async()
        if limiter is None:
            return None
        size = min(lease_size(item), self._pace(key))
        try:
            allowed = await limiter.hit(item, identifier, cost=size)
            if not allowed and size > 1:  # near the budget's end: one request is still exact
                size = 1
                allowed = await limiter.hit(item, identifier)
            window = self._recent_window(key, size) if allowed else None
            if window is None:
                stats = await limiter.get_window_stats(item, identifier)
                window = self._remember_window(key, stats.remaining, stats.reset_time, size if allowed else 0)
        except Exception as error:  # noqa: BLE001 - any storage failure must let the request through
            self._failed(error)
            return None
        return self._leased(item, key, allowed=allowed, size=size, window=window)

    def _pace(self, key: str) -> int:
        """How many requests of `key` this process saw in the current or the last lease period (the more): the
        size of the next share (at least 1). A share is sized to what its caller has been using, so a client
        that slows down leaves at most one recent period's worth unused, and a slow, steady one hits Redis once
        a request."""
        now = time.monotonic()
        with self._lock:
            pace = self._paces.get(key)
            if pace is None or now - pace[0] >= 2 * _LEASE_SECONDS:
                return 1
            return max(1, int(max(pace[1], pace[2]) if now - pace[0] < _LEASE_SECONDS else pace[1]))

    def _count(self, key: str) -> None:
        """One more request of `key` admitted (or asked for) in the current lease period."""
        now = time.monotonic()
        with self._lock:
            pace = self._paces.get(key)
            if pace is None or now - pace[0] >= 2 * _LEASE_SECONDS:
                if len(self._paces) >= _STATS_MAX_KEYS:
                    self._paces.clear()
                self._paces[key] = [now, 1.0, 0.0]
            elif now - pace[0] >= _LEASE_SECONDS:
                pace[:] = [now, 1.0, pace[1]]
            else:
                pace[1] += 1

    def _from_lease(self, item: RateLimitItem, key: str) -> Verdict | None:
        """An admission from this process's lease of `key`'s budget, or None (no lease, spent or expired)."""
        if lease_size(item) > 1:
            self._count(key)
        with self._lock:
            lease = self._leases.get(key)
            if lease is None or lease[1] < 1:
                return None
            if lease[0] <= time.monotonic():
                del self._leases[key]
                return None
            lease[1] -= 1
            left, besides, reset_time = lease[1], lease[2], lease[3]
        return self._verdict(item, allowed=True, remaining=besides + left, reset_time=reset_time)

    def _leased(self, item: RateLimitItem, key: str, *, allowed: bool, size: int, window: list[float]) -> Verdict:
        """The verdict of a hit of `size` requests; the `size - 1` not spent by this one are kept as a lease."""
        besides = window[1] - window[3]  # what Redis has left once the whole hit is counted
        if allowed and size > 1:
            now = time.monotonic()
            with self._lock:
                lease = self._leases.get(key)
                if lease is not None and lease[0] > now:
                    # Requests that found no lease at once (each awaiting its own hit) add to one another's
                    # lease instead of replacing it: no leased request is lost to an overwrite.
                    lease[1] += size - 1
                    lease[0], lease[2], lease[3] = now + _LEASE_SECONDS, besides, window[2]
                    left = lease[1]
                else:
                    if len(self._leases) >= _STATS_MAX_KEYS:
                        self._leases.clear()
                    self._leases[key] = [now + _LEASE_SECONDS, size - 1, besides, window[2]]
                    left = size - 1
            return self._verdict(item, allowed=True, remaining=besides + left, reset_time=window[2])
        return self._verdict(item, allowed=allowed, remaining=besides, reset_time=window[2])

    @staticmethod
    def _verdict(item: RateLimitItem, *, allowed: bool, remaining: float, reset_time: float) -> Verdict:
        reset = max(0, math.ceil(reset_time - time.time()))
        return Verdict(allowed=allowed, limit=item.amount, remaining=max(0, int(remaining)), reset_seconds=reset)

    def _remember_window(self, key: str, remaining: int, reset_time: float, spent: int = 0) -> list[float]:
        """The window as just read from Redis (which counted every hit so far); `spent`: how much of it the hit
        that read it leased and did not spend yet (the lease reports it apart)."""
        window = [time.monotonic(), float(remaining + spent), reset_time, float(spent)]
        with self._lock:
            if len(self._windows) >= _STATS_MAX_KEYS:
                self._windows.clear()
            self._windows[key] = window
        return window

    def _recent_window(self, key: str, spent: int = 1) -> list[float] | None:
        """The window of `key` read less than _STATS_MAX_AGE_SECONDS ago, counting this hit of `spent`
        requests; else None."""
        with self._lock:
            window = self._windows.get(key)
            if window is None or time.monotonic() - window[0] >= _STATS_MAX_AGE_SECONDS:
                return None
            window[3] += spent
            return list(window)


def lease_size(item: RateLimitItem) -> int:
    """How many requests of `item`'s budget one Redis hit takes (1: no lease, every request hits)."""
    if item.amount < _LEASE_FROM_LIMIT:
        return 1
    return min(_LEASE_MAX, item.amount // 100)


def key_budget() -> RateLimitItem | None:
    """The per-key budget as a sliding window: `burst` requests per `burst / rate` seconds keeps both the
    average rate and the largest burst of a token bucket with those settings."""
    settings = get_settings()
    return _key_budget(settings.rate_limit_per_second, settings.rate_limit_burst)


# Built once per setting, not per request (the settings may change, as tests do: they are the cache's key).
@functools.lru_cache(maxsize=16)
def _key_budget(rate: float, burst: float) -> RateLimitItem | None:
    burst = max(burst, 1.0)
    if rate <= 0:
        return None
    seconds = max(1, round(burst / rate))
    return RateLimitItemPerSecond(max(1, round(rate * seconds)), seconds, namespace="engram-key")


@functools.lru_cache(maxsize=1024)
def tenant_budget(requests_per_minute: int) -> RateLimitItem:
    """A tenant's requests_per_minute quota: every key of the tenant together, across replicas."""
    return RateLimitItemPerMinute(requests_per_minute, 1, namespace="engram-tenant")


INVALID_KEY_BUDGET = RateLimitItemPerSecond(INVALID_KEYS_PER_MINUTE, 60, namespace="engram-badkey")

limiter = RedisRateLimiter()
