"""Bearer-key authentication, with a short in-process cache so a request costs no extra round trip."""

from __future__ import annotations

import hmac
import threading
import time

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from core.config import get_settings
from core.db import system_session
from core.errors import Forbidden, RateLimited, Unauthorized
from core.tenancy.context import Caller
from core.tenancy.service import authenticate, hash_key

# Revocations made through this process apply at once; other processes see them within the TTL.
_CACHE_TTL_SECONDS = 5.0
_cache: dict[str, tuple[float, Caller]] = {}
_cache_lock = threading.Lock()


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def forget_cached_keys() -> None:
    with _cache_lock:
        _cache.clear()


def caller_for_key(api_key: str) -> Caller:
    digest = hash_key(api_key)
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(digest)
    if hit is not None and hit[0] > now:
        return hit[1]
    with system_session() as session:
        caller = authenticate(session, api_key=api_key)
    with _cache_lock:
        _cache[digest] = (now + _CACHE_TTL_SECONDS, caller)
    return caller


class _TokenBucket:
    """Per-key request budget: `rate` requests a second on average, bursts up to `burst`."""

    def __init__(self) -> None:
        self._state: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, key_id: str, *, rate: float, burst: float) -> bool:
        now = time.monotonic()
        with self._lock:
            tokens, last = self._state.get(key_id, (burst, now))
            tokens = min(burst, tokens + (now - last) * rate)
            if tokens < 1.0:
                self._state[key_id] = (tokens, now)
                return False
            self._state[key_id] = (tokens - 1.0, now)
            return True


_buckets = _TokenBucket()


def caller_from_request(request: Request) -> Caller:
    """The tenant caller behind the Authorization header (401 otherwise); may query the database."""
    token = bearer_token(request)
    if token is None:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <api_key>'")
    if is_operator_key(token):
        raise Forbidden("the operator key has no tenant; use a tenant API key for /v1 data calls")
    return _rate_limited(caller_for_key(token))


def _rate_limited(caller: Caller) -> Caller:
    settings = get_settings()
    if settings.rate_limit_per_second > 0 and not _buckets.allow(
        caller.key_id, rate=settings.rate_limit_per_second, burst=settings.rate_limit_burst
    ):
        raise RateLimited(f"rate limit of {settings.rate_limit_per_second:g} requests/s for this key exceeded")
    return caller


def _cached_caller(request: Request) -> Caller | None:
    token = bearer_token(request)
    if token is None or is_operator_key(token):
        return None
    hit = _cache.get(hash_key(token))
    if hit is None or hit[0] <= time.monotonic():
        return None
    return _rate_limited(hit[1])


async def require_caller(request: Request) -> Caller:
    """FastAPI dependency. A cached key is answered on the event loop; only a miss goes to the threadpool
    (a sync dependency would cost a thread hop on every request)."""
    cached = _cached_caller(request)
    if cached is not None:
        return cached
    return await run_in_threadpool(caller_from_request, request)


async def require_admin(request: Request) -> Caller:
    caller = await require_caller(request)
    if not caller.is_admin:
        raise Forbidden("this call needs an admin key")
    return caller


def is_operator_key(token: str | None) -> bool:
    operator_key = get_settings().operator_key
    if not token or not operator_key:
        return False
    # Bytes, not str: compare_digest raises TypeError on non-ASCII text, which any client can send.
    return hmac.compare_digest(token.encode("utf-8", "surrogatepass"), operator_key.encode("utf-8", "surrogatepass"))
