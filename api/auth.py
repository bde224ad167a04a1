"""Bearer-key authentication, the per-key rate limit and the read-only guard: the one gate of every /v1 call.

Known keys are cached in-process for a few seconds so a request costs no extra round trip; unknown keys are
cached too (briefly), and each client address has a small budget of failed lookups (see api.ratelimit).
"""

from __future__ import annotations

import hmac
import threading
import time

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from api.ratelimit import INVALID_KEY_BUDGET, Verdict, key_budget, limiter, remember_verdict
from core.config import get_settings
from core.db import system_session
from core.errors import Forbidden, RateLimited, Unauthorized
from core.tenancy.context import Caller
from core.tenancy.service import authenticate, hash_key

# Revocations made through this process apply at once; other processes see them within the TTL.
_CACHE_TTL_SECONDS = 5.0
# A key unknown a moment ago is answered 401 from memory; a key issued since is found after this long.
_UNKNOWN_TTL_SECONDS = 2.0
_UNKNOWN_MAX_ENTRIES = 10_000
_cache: dict[str, tuple[float, Caller]] = {}
_unknown: dict[str, float] = {}
_cache_lock = threading.Lock()

# POST calls that only read; every other non-GET /v1 call writes and is refused to a read-only key.
_READING_POSTS = frozenset({"/v1/search", "/v1/hydrate"})


class RateLimitExceeded(RateLimited):
    """429 carrying the RateLimit header fields and Retry-After."""

    def __init__(self, message: str, *, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.headers = headers


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def forget_cached_keys() -> None:
    with _cache_lock:
        _cache.clear()
        _unknown.clear()


def caller_for_key(api_key: str) -> Caller:
    digest = hash_key(api_key)
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(digest)
        unknown_until = _unknown.get(digest, 0.0)
    if hit is not None and hit[0] > now:
        return hit[1]
    if unknown_until > now:
        raise Unauthorized("invalid API key")
    try:
        # Finding a key by its hash spans tenants by nature: the one named system path of authentication.
        with system_session() as session:
            caller = authenticate(session, api_key=api_key)
    except Unauthorized:
        with _cache_lock:
            if len(_unknown) >= _UNKNOWN_MAX_ENTRIES:
                _unknown.clear()
            _unknown[digest] = now + _UNKNOWN_TTL_SECONDS
        raise
    with _cache_lock:
        _cache[digest] = (now + _CACHE_TTL_SECONDS, caller)
    return caller


def _cached(token: str) -> Caller | None:
    """The cached caller of `token`, or None (a miss costs a lookup)."""
    hit = _cache.get(hash_key(token))
    if hit is None or hit[0] <= time.monotonic():
        return None
    return hit[1]


def _client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _lookup(token: str, request: Request) -> Caller:
    """The caller of an uncached key; a client address over its budget of failed lookups gets 429 first."""
    address = _client_address(request)
    refused = limiter.exhausted(INVALID_KEY_BUDGET, address)
    if refused is not None:
        raise RateLimitExceeded("too many requests with invalid API keys from this address", headers=refused.headers())
    try:
        return caller_for_key(token)
    except Unauthorized:
        limiter.hit(INVALID_KEY_BUDGET, address)
        raise


def _writes(request: Request) -> bool:
    """Whether a /v1 call changes anything (MCP's tool calls are all POSTs: its client checks each write)."""
    path = request.url.path
    return path.startswith("/v1/") and request.method not in ("GET", "HEAD", "OPTIONS") and path not in _READING_POSTS


def _admit(caller: Caller, request: Request) -> Verdict | None:
    """Spend one request of the key's budget (429 when spent) and refuse writes to a read-only key."""
    budget = key_budget()
    verdict = limiter.hit(budget, caller.key_id) if budget is not None else None
    if verdict is not None and not verdict.allowed:
        settings = get_settings()
        raise RateLimitExceeded(
            f"rate limit of {settings.rate_limit_per_second:g} requests/s for this key exceeded",
            headers=verdict.headers(),
        )
    if verdict is not None:
        remember_verdict(request.scope, verdict)
    if _writes(request):
        caller.require_write()
    return verdict


def caller_from_request(request: Request) -> Caller:
    """The tenant caller behind the Authorization header (401 otherwise); may query the database."""
    token = bearer_token(request)
    if token is None:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <api_key>'")
    if is_operator_key(token):
        raise Forbidden("the operator key has no tenant; use a tenant API key for /v1 data calls")
    caller = _cached(token)
    if caller is None:
        caller = _lookup(token, request)
    _admit(caller, request)
    return caller


async def require_caller(request: Request) -> Caller:
    """FastAPI dependency. A cached key is answered on the event loop; only a miss goes to the threadpool
    (a sync dependency would cost a thread hop on every request). The budget's RateLimit header fields are
    added to whatever response the request ends with by api.observe.RequestContext."""
    token = bearer_token(request)
    if token is None:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <api_key>'")
    if is_operator_key(token):
        raise Forbidden("the operator key has no tenant; use a tenant API key for /v1 data calls")
    caller = _cached(token)
    if caller is None:
        caller = await run_in_threadpool(_lookup, token, request)
    _admit(caller, request)
    return caller


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
