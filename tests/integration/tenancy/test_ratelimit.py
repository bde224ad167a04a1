"""Rate limits kept in Redis (CONTRACT section 2): they hold across API replicas, answer 429 with
Retry-After and the RateLimit header fields, fail open when Redis is down, and bound failed key lookups."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from limits import RateLimitItemPerSecond

from api.ratelimit import INVALID_KEY_BUDGET, INVALID_KEYS_PER_MINUTE, RedisRateLimiter, limiter


@pytest.fixture
def tight_budget() -> Iterator[None]:
    from core.config import get_settings

    settings = get_settings()
    saved = settings.rate_limit_per_second, settings.rate_limit_burst
    settings.rate_limit_per_second, settings.rate_limit_burst = 1.0, 3.0
    try:
        yield
    finally:
        settings.rate_limit_per_second, settings.rate_limit_burst = saved


def test_successful_responses_carry_ratelimit_headers(client, tenant):
    response = client.get("/v1/memories", headers=tenant.headers())
    assert response.status_code == 200
    limit, remaining = int(response.headers["RateLimit-Limit"]), int(response.headers["RateLimit-Remaining"])
    assert 0 <= remaining < limit and int(response.headers["RateLimit-Reset"]) >= 0


def _budget_fields(response) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """The response's RateLimit-Limit, -Remaining and -Reset (KeyError when one is missing); each once."""
    names = [name.lower() for name in response.headers.keys()]
    for name in ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"):
        assert names.count(name) == 1, (response.request.url, names)
    headers = response.headers
    return int(headers["RateLimit-Limit"]), int(headers["RateLimit-Remaining"]), int(headers["RateLimit-Reset"])


def test_every_answer_to_a_metered_key_carries_its_budget(client, tenant):
    """Whatever a route returns (a model, its own JSONResponse, markdown, an error raised after admission,
    MCP's JSON-RPC), the answer says the key's budget."""
    auth = tenant.headers()
    saved = client.post("/v1/memories", json={"content": "the fiscal year starts in April"}, headers=auth)
    assert saved.status_code == 201  # a route returning its own JSONResponse
    memory_id = saved.json()["memory_id"]
    mcp_call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    answers = {
        "save": saved,
        "get": client.get(f"/v1/memories/{memory_id}", headers=auth),
        "list": client.get("/v1/memories", headers=auth),
        "search": client.post("/v1/search", json={"question": "fiscal year", "mode": "hybrid"}, headers=auth),
        "export": client.get("/v1/memories:export", headers=auth),
        "jobs": client.get("/v1/jobs", headers=auth),
        "missing": client.get("/v1/memories/999999999", headers=auth),
        "invalid": client.post("/v1/memories", json={"content": ""}, headers=auth),
        "unknown field": client.post("/v1/search", json={"question": "x", "nope": 1}, headers=auth),
        "mcp": client.post("/mcp", json=mcp_call, headers={**auth, "Accept": "application/json, text/event-stream"}),
    }
    statuses = {name: response.status_code for name, response in answers.items()}
    assert statuses == {
        "save": 201,
        "get": 200,
        "list": 200,
        "search": 200,
        "export": 200,
        "jobs": 200,
        "missing": 404,
        "invalid": 422,
        "unknown field": 422,
        "mcp": 200,
    }
    budgets = {name: _budget_fields(response) for name, response in answers.items()}
    limits = {limit for limit, _, _ in budgets.values()}
    assert len(limits) == 1, budgets  # one key, one budget
    (limit,) = limits
    assert all(0 <= remaining < limit and reset >= 0 for _, remaining, reset in budgets.values()), budgets


def test_unmetered_answers_carry_no_budget(client):
    """A request no key's budget admitted says none: health, and a refused key."""
    for response in (client.get("/healthz"), client.get("/v1/memories", headers={"Authorization": "Bearer egk_x"})):
        assert not {name.lower() for name in response.headers.keys()} & {"ratelimit-limit", "ratelimit-remaining"}


def test_budget_is_shared_by_separate_limiters(stack, tenant):
    """Two limiters with their own Redis connections (as two API replicas have) spend one budget."""
    item = RateLimitItemPerSecond(5, 30, namespace="engram-test")
    replica_a, replica_b = RedisRateLimiter(), RedisRateLimiter()
    identifier = f"shared-{tenant.name}"
    verdicts = [(replica_a if i % 2 else replica_b).hit(item, identifier) for i in range(8)]
    assert all(v is not None for v in verdicts)
    assert [v.allowed for v in verdicts if v is not None] == [True] * 5 + [False] * 3
    refused = verdicts[-1]
    assert refused is not None and refused.headers()["RateLimit-Remaining"] == "0"
    assert 1 <= int(refused.headers()["Retry-After"]) <= 30


def test_awaited_and_blocking_hits_spend_one_budget(stack, tenant):
    """The event loop's awaited hits (api.auth's admission) and a thread's blocking ones count in the same
    Redis window, with the same verdicts and header fields."""
    import asyncio

    item = RateLimitItemPerSecond(4, 30, namespace="engram-test")
    limiter = RedisRateLimiter()
    identifier = f"both-{tenant.name}"

    async def awaited(count: int) -> list:
        return [await limiter.ahit(item, identifier) for _ in range(count)]

    verdicts = [limiter.hit(item, identifier), *asyncio.run(awaited(2)), limiter.hit(item, identifier)]
    verdicts += asyncio.run(awaited(2))
    assert all(v is not None for v in verdicts)
    assert [v.allowed for v in verdicts if v is not None] == [True] * 4 + [False] * 2
    assert [v.remaining for v in verdicts if v is not None] == [3, 2, 1, 0, 0, 0]
    refused = verdicts[-1]
    assert refused is not None and 1 <= int(refused.headers()["Retry-After"]) <= 30


def test_admitted_requests_read_the_window_once_a_second(stack, tenant, monkeypatch):
    """An admitted request costs one Redis call (the hit): its RateLimit-Remaining is the window read less than
    a second ago less the requests admitted here since, so it still counts down; a refusal reads the window
    afresh (exact Remaining 0 and Retry-After)."""
    from limits.strategies import SlidingWindowCounterRateLimiter

    item = RateLimitItemPerSecond(4, 30, namespace="engram-test")
    limiter = RedisRateLimiter()
    reads: list[int] = []
    real = SlidingWindowCounterRateLimiter.get_window_stats

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SlidingWindowCounterRateLimiter, "get_window_stats", counted)
    verdicts = [limiter.hit(item, f"window-{tenant.name}") for _ in range(6)]
    assert [v.allowed for v in verdicts if v is not None] == [True] * 4 + [False] * 2
    assert [v.remaining for v in verdicts if v is not None] == [3, 2, 1, 0, 0, 0]
    assert len(reads) == 3  # the first admission and the two refusals


@pytest.fixture
def redis_hits(monkeypatch):
    """The cost of every hit the limiters make on Redis, in order (the limits strategy's own, counted)."""
    from limits.strategies import SlidingWindowCounterRateLimiter

    hits: list[int] = []
    real = SlidingWindowCounterRateLimiter.hit

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        hits.append(kwargs.get("cost", 1))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SlidingWindowCounterRateLimiter, "hit", counted)
    return hits


def test_a_large_budget_is_spent_from_leases_and_replicas_never_exceed_it(stack, tenant, monkeypatch, redis_hits):
    """A budget of 200+ is taken from Redis a share at a time (here 3 of 300) and spent in memory: one Redis
    hit per share, RateLimit-Remaining still counting down one by one, and two replicas together admit the
    budget exactly, the requests past it refused (a lease kept as long as the test runs: no clock in it)."""
    import api.ratelimit as ratelimit

    monkeypatch.setattr(ratelimit, "_LEASE_SECONDS", 3600.0)
    item = RateLimitItemPerSecond(300, 30, namespace="engram-test")
    assert ratelimit.lease_size(item) == 3
    replica_a, replica_b = RedisRateLimiter(), RedisRateLimiter()
    identifier = f"leased-{tenant.name}"
    first = [replica_a.hit(item, identifier) for _ in range(30)]
    assert all(v is not None and v.allowed for v in first)
    # Shares grow with the key's pace (1, 2, then 3 per Redis hit): every request counted, at most a share's
    # rest leased ahead.
    assert redis_hits[:3] == [1, 2, 3] and len(redis_hits) == 11 and sum(redis_hits) == 30
    remaining = [v.remaining for v in first if v is not None]
    assert remaining == list(range(299, 269, -1))
    rest = [(replica_b if i % 2 else replica_a).hit(item, identifier) for i in range(370)]
    assert all(v is not None for v in rest)
    admitted = len(first) + sum(1 for v in rest if v is not None and v.allowed)
    assert admitted == 300
    assert not any(v.allowed for v in rest[-20:] if v is not None)


def test_concurrent_hits_that_each_took_a_share_lose_none_of_it(stack, tenant, monkeypatch, redis_hits):
    """Requests awaiting their hits at once each take a share; the shares add up in one lease, so every
    request Redis counted is admitted by someone (none lost to a lease replacing another)."""
    import asyncio

    import api.ratelimit as ratelimit

    monkeypatch.setattr(ratelimit, "_LEASE_SECONDS", 3600.0)
    item = RateLimitItemPerSecond(300, 30, namespace="engram-test")
    limiter = RedisRateLimiter()
    identifier = f"together-{tenant.name}"

    async def at_once() -> list:
        return list(await asyncio.gather(*(limiter.ahit(item, identifier) for _ in range(10))))

    together = asyncio.run(at_once())
    assert all(v is not None and v.allowed for v in together)
    redis_hits.clear()
    # The shares the 10 took (sized by the pace: 1, 2, then 3 each) less the 10 they admitted.
    leftover = 1 + 2 + 3 * 8 - 10
    leased = [limiter.hit(item, identifier) for _ in range(leftover)]
    assert all(v is not None and v.allowed for v in leased) and redis_hits == []
    rest = [limiter.hit(item, identifier) for _ in range(300)]
    admitted = len(together) + len(leased) + sum(1 for v in rest if v is not None and v.allowed)
    assert admitted == 300


def test_a_slow_client_of_a_large_budget_hits_redis_once_a_request_and_wastes_none(
    stack, tenant, monkeypatch, redis_hits
):
    """Requests further apart than a lease lives take no share ahead (each is one request in Redis), so a
    client well under its budget is never refused early by shares that expired unused."""
    import time

    import api.ratelimit as ratelimit

    monkeypatch.setattr(ratelimit, "_LEASE_SECONDS", 0.05)
    item = RateLimitItemPerSecond(300, 30, namespace="engram-test")
    limiter = RedisRateLimiter()
    identifier = f"slow-{tenant.name}"
    verdicts = []
    for _ in range(12):
        verdicts.append(limiter.hit(item, identifier))
        time.sleep(0.12)  # over two lease periods apart
    assert all(v is not None and v.allowed for v in verdicts)
    assert redis_hits == [1] * 12
    assert [v.remaining for v in verdicts if v is not None] == list(range(299, 287, -1))


def test_429_is_per_key(client, tenant, member_key, tight_budget):
    other = member_key("other@example.com")  # spends one of the admin key's 3
    statuses = [client.get("/v1/memories", headers=tenant.headers()).status_code for _ in range(4)]
    assert statuses == [200, 200, 429, 429]
    limited = client.get("/v1/memories", headers=tenant.headers())
    assert limited.json()["error"]["code"] == "rate_limited"
    names = {h.lower() for h in limited.headers}
    assert {"retry-after", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"} <= names
    assert client.get("/v1/memories", headers=tenant.headers(other)).status_code == 200


def test_saves_succeed_when_redis_is_down(client, tenant, tight_budget, caplog):
    from api.serve.embedded import free_port
    from core.config import get_settings

    settings = get_settings()
    saved_url = settings.redis_url
    settings.redis_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    try:
        with caplog.at_level(logging.WARNING, logger="engram.ratelimit"):
            statuses = [
                client.post("/v1/memories", json={"content": f"n{i}"}, headers=tenant.headers()).status_code
                for i in range(5)
            ]
        assert statuses == [201] * 5  # over the budget of 3, yet let through: the limiter cannot count
        assert "rate limiter unavailable" in caplog.text
    finally:
        settings.redis_url = saved_url
        limiter._down_until = 0.0


def test_failed_key_lookups_are_limited_per_address_and_never_refuse_a_valid_key(client, tenant, make_tenant):
    """Guessing keys: past the address's budget of failures, the guesses get 429. A valid key is never refused
    for sharing the address (behind a load balancer every caller does): not one used a moment ago, and not a
    key of another tenant that this process has never seen."""
    assert client.get("/v1/memories", headers=tenant.headers()).status_code == 200  # now cached
    other = make_tenant("unseen")  # its key was never used: its first call is a lookup
    member = client.post("/v1/keys", json={"user": "new@example.com"}, headers=tenant.headers()).json()["api_key"]
    active = limiter._get()
    assert active is not None
    active.clear(INVALID_KEY_BUDGET, "testclient")  # other tests' 401s spent some of it
    try:
        statuses = [
            client.get("/v1/memories", headers={"Authorization": f"Bearer egk_guess{i}"}).status_code
            for i in range(INVALID_KEYS_PER_MINUTE + 2)
        ]
        assert statuses[:INVALID_KEYS_PER_MINUTE] == [401] * INVALID_KEYS_PER_MINUTE
        assert statuses[-1] == 429
        assert client.get("/v1/memories", headers=tenant.headers()).status_code == 200
        assert client.get("/v1/memories", headers=other.headers()).status_code == 200
        assert client.get("/v1/memories", headers={"Authorization": f"Bearer {member}"}).status_code == 200
    finally:
        active.clear(INVALID_KEY_BUDGET, "testclient")


def test_trusted_proxies_decide_whose_address_a_bad_key_spends(stack, tenant):
    """ENGRAM_TRUSTED_PROXIES: behind a trusted proxy, each forwarded client has its own budget of bad keys; a
    forwarded address from a peer that is not trusted is ignored (the peer's own address is used)."""
    import os

    from fastapi.testclient import TestClient

    from api.app import create_app
    from core.config import reset_settings_cache

    active = limiter._get()
    assert active is not None
    os.environ["ENGRAM_TRUSTED_PROXIES"] = "testclient"  # the test client's peer "address"
    reset_settings_cache()
    try:
        with TestClient(create_app(), raise_server_exceptions=False) as proxied:
            guesser = {"X-Forwarded-For": "203.0.113.7"}
            active.clear(INVALID_KEY_BUDGET, "203.0.113.7")
            statuses = [
                proxied.get("/v1/memories", headers={**guesser, "Authorization": f"Bearer egk_g{i}"}).status_code
                for i in range(INVALID_KEYS_PER_MINUTE + 1)
            ]
            assert statuses[-1] == 429
            bystander = {"X-Forwarded-For": "198.51.100.9", "Authorization": "Bearer egk_typo"}
            assert proxied.get("/v1/memories", headers=bystander).status_code == 401  # its own budget
    finally:
        os.environ.pop("ENGRAM_TRUSTED_PROXIES")
        reset_settings_cache()
        for address in ("203.0.113.7", "198.51.100.9"):
            active.clear(INVALID_KEY_BUDGET, address)
    # Without the setting the header is not believed: the same guesses spend the peer's budget.
    active.clear(INVALID_KEY_BUDGET, "testclient")
    try:
        with TestClient(create_app(), raise_server_exceptions=False) as direct:
            for i in range(INVALID_KEYS_PER_MINUTE):
                forged = {"X-Forwarded-For": f"192.0.2.{i}", "Authorization": f"Bearer egk_h{i}"}
                direct.get("/v1/memories", headers=forged)
            forged = {"X-Forwarded-For": "192.0.2.250", "Authorization": "Bearer egk_x"}
            spent = direct.get("/v1/memories", headers=forged)
            assert spent.status_code == 429
    finally:
        active.clear(INVALID_KEY_BUDGET, "testclient")
