"""Bearer-key authentication, the per-key rate limit and the read-only guard: the one gate of every /v1 call.

Known keys are cached in-process for a few seconds so a request costs no extra round trip; unknown keys are
cached too (briefly), and each client address has a small budget of failed lookups (see api.ratelimit).
"""

from __future__ import annotations

import hmac
import threading
import time

from fastapi import Request

from api.quota_events import TENANT_SCOPE_KEY
from api.ratelimit import INVALID_KEY_BUDGET, Verdict, key_budget, limiter, remember_verdict, tenant_budget
from api.serve import routed
from api.threads import in_thread
from core.config import get_settings
from core.db import system_session
from core.errors import Forbidden, RateLimited, TenantSuspended, Unauthorized
from core.tenancy.context import Caller
from core.tenancy.service import authenticate, hash_key
from core.tenancy.usage import buffer as usage_buffer

# A key revoked or a tenant changed through this process is dropped from the cache here and, before the answer
# goes out, in the other API processes of this host (forget_tenant_callers); other replicas drop it when the
# database's notification reaches them (api.tenant_events), and whatever misses both expires after this long.
_CACHE_TTL_SECONDS = 5.0
# A key unknown a moment ago is answered 401 from memory; a key issued since is found after this long.
_UNKNOWN_TTL_SECONDS = 2.0
_UNKNOWN_MAX_ENTRIES = 10_000
_cache: dict[str, tuple[float, Caller]] = {}
_unknown: dict[str, float] = {}
_cache_lock = threading.Lock()
# Counts the forgets: a lookup begun before one may have read what it dropped, so its answer is not cached.
_forgets = 0

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


def forget_cached_keys(*, tenant_id: int | None = None) -> None:
    """Drop cached callers: every one, or one tenant's (its state or keys changed, maybe on another replica)."""
    global _forgets
    with _cache_lock:
        _forgets += 1
        if tenant_id is None:
            _cache.clear()
            _unknown.clear()
            return
        for digest in [d for d, (_, caller) in _cache.items() if caller.tenant_id == tenant_id]:
            del _cache[digest]


def forget_tenant_callers(tenant_id: int) -> None:
    """After a change to a tenant's keys, state or quotas committed: drop its cached callers in this process and
    in every other API process of this host, waiting for them (api.serve.routed), so the change applies to the
    next request whichever process serves it. Other replicas hear of it from the database (api.tenant_events)."""
    forget_cached_keys(tenant_id=tenant_id)
    routed.ask_the_others(routed.FORGET, tenant_id)


def caller_for_key(api_key: str) -> Caller:
    digest = hash_key(api_key)
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(digest)
        unknown_until = _unknown.get(digest, 0.0)
        forgets = _forgets
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
        if forgets == _forgets:  # (else a revocation may have committed after this lookup read the key)
            _cache[digest] = (now + _CACHE_TTL_SECONDS, caller)
    routed.learned(api_key, caller.tenant_id)  # with ENGRAM_API_WORKERS > 1: route its tenant to one process
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
    """The caller of an uncached key. A valid key is always admitted, whoever shares its address; a failed
    lookup spends the address's budget of failures, and past it the answer is 429 instead of 401, so only
    the client sending bad keys is told to back off (behind a proxy, the address is the forwarded client's
    when the proxy is trusted: ENGRAM_TRUSTED_PROXIES)."""
    try:
        return caller_for_key(token)
    except Unauthorized:
        verdict = limiter.hit(INVALID_KEY_BUDGET, _client_address(request))
        if verdict is not None and not verdict.allowed:
            raise RateLimitExceeded(
                "too many requests with invalid API keys from this address", headers=verdict.headers()
            ) from None
        raise


def _writes(request: Request) -> bool:
    """Whether a /v1 call changes anything (MCP's tool calls are all POSTs: its client checks each write)."""
    path = request.scope["path"]  # not request.url, which builds a URL object per request
    return path.startswith("/v1/") and request.method not in ("GET", "HEAD", "OPTIONS") and path not in _READING_POSTS


def _admit(caller: Caller, request: Request, *, meter: bool = True) -> Verdict | None:
    """Refuse a suspended tenant's keys, spend one request of the key's budget and of the tenant's
    requests_per_minute (429 when either is spent), refuse writes to a read-only key, and count the request
    in the tenant's usage (``meter``; an MCP call over HTTP counts as the REST calls its tools make)."""
    _refuse_suspended(caller)
    budget = key_budget()
    verdict = _within_key_budget(limiter.hit(budget, caller.key_id) if budget is not None else None)
    tenant_verdict = None
    if caller.tenant_requests_per_minute is not None:
        tenant_verdict = _within_tenant_quota(
            caller, limiter.hit(tenant_budget(caller.tenant_requests_per_minute), str(caller.tenant_id))
        )
    return _admitted(caller, request, verdict, tenant_verdict, meter=meter)


async def _admit_on_loop(caller: Caller, request: Request) -> Verdict | None:
    """``_admit`` for the event loop: the budgets' Redis round trips are awaited, so one request's wait for
    Redis never holds up the others (a blocking call here stalled every request of the process)."""
    _refuse_suspended(caller)
    budget = key_budget()
    verdict = _within_key_budget(await limiter.ahit(budget, caller.key_id) if budget is not None else None)
    tenant_verdict = None
    if caller.tenant_requests_per_minute is not None:
        tenant_verdict = _within_tenant_quota(
            caller, await limiter.ahit(tenant_budget(caller.tenant_requests_per_minute), str(caller.tenant_id))
        )
    return _admitted(caller, request, verdict, tenant_verdict, meter=True)


def _refuse_suspended(caller: Caller) -> None:
    if caller.tenant_state == "suspended":
        raise TenantSuspended(f"tenant {caller.tenant_name!r} is suspended; its operator can resume it")


def _within_key_budget(verdict: Verdict | None) -> Verdict | None:
    if verdict is not None and not verdict.allowed:
        settings = get_settings()
        raise RateLimitExceeded(
            f"rate limit of {settings.rate_limit_per_second:g} requests/s for this key exceeded",
            headers=verdict.headers(),
        )
    return verdict


def _within_tenant_quota(caller: Caller, verdict: Verdict | None) -> Verdict | None:
    if verdict is not None and not verdict.allowed:
        raise RateLimitExceeded(
            f"quota requests_per_minute of {caller.tenant_requests_per_minute} for this tenant exceeded",
            headers=verdict.headers(),
        )
    return verdict


def _admitted(
    caller: Caller, request: Request, verdict: Verdict | None, tenant_verdict: Verdict | None, *, meter: bool
) -> Verdict | None:
    """The admission's bookkeeping once both budgets allowed it: the tighter budget is the one the answer
    reports, then the read-only check and the usage count."""
    if tenant_verdict is not None and (verdict is None or tenant_verdict.remaining < verdict.remaining):
        verdict = tenant_verdict
    if verdict is not None:
        remember_verdict(request.scope, verdict)
    if _writes(request):
        caller.require_write()
    if meter:
        usage_buffer.add(caller.tenant_id, requests=1)
    request.scope[TENANT_SCOPE_KEY] = caller.tenant_id
    return verdict


def caller_from_request(request: Request, *, meter: bool = True) -> Caller:
    """The tenant caller behind the Authorization header (401 otherwise); may query the database."""
    token = bearer_token(request)
    if token is None:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <api_key>'")
    if is_operator_key(token):
        raise Forbidden("the operator key has no tenant; use a tenant API key for /v1 data calls")
    caller = _cached(token)
    if caller is None:
        caller = _lookup(token, request)
    _admit(caller, request, meter=meter)
    return caller


async def require_caller(request: Request) -> Caller:
    """FastAPI dependency. A cached key is answered on the event loop, its budgets spent with awaited Redis
    calls; only a miss goes to a request thread (a sync dependency would cost a thread hop on every request).
    The budget's RateLimit header fields are added to whatever response the request ends with by
    api.observe.RequestContext."""
    token = bearer_token(request)
    if token is None:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <api_key>'")
    if is_operator_key(token):
        raise Forbidden("the operator key has no tenant; use a tenant API key for /v1 data calls")
    caller = _cached(token)
    if caller is None:
        caller = await in_thread(_lookup, token, request)
    await _admit_on_loop(caller, request)
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
