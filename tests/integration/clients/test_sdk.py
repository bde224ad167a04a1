"""The standalone Python SDK (clients/python, import name engram_client) against a real engram API process:
sync and async clients, typed errors, ENGRAM_URL / ENGRAM_API_KEY defaults, retries on 429/503, and its
typing checked by mypy the way a user's code would be."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from engram_client import (
    AsyncEngramClient,
    AuthenticationError,
    EngramClient,
    EngramConnectionError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    ServiceUnavailableError,
)
from engram_client._calls import Settings

from tests.helpers.processes import running_api

SDK = Path(__file__).resolve().parents[3] / "clients" / "python"


@pytest.fixture(scope="module")
def api_url(stack) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with running_api(stack.env) as url:
        yield url


def test_sync_client_saves_searches_lists_updates_and_forgets(api_url, tenant):
    with EngramClient(api_url, api_key=tenant.admin_key, agent_id="planner") as engram:
        saved = engram.save_memory(
            "refunds are accepted for 30 days", kind="decision", tags=["policy"], category="workspace"
        )
        memory = engram.get_memory(saved.memory_id)
        assert (memory.content, memory.kind, memory.importance, memory.agent_id) == (
            "refunds are accepted for 30 days",
            "decision",
            0.8,
            "planner",
        )
        hits = engram.search("how long are refunds accepted?")
        assert saved.memory_id in [hit.id for hit in hits.memories] and hits.channels.fulltext
        page = engram.list_memories(tags=["policy"], limit=10)
        assert [m.id for m in page.memories] == [saved.memory_id] and page.next_cursor is None
        updated = engram.update_memory(saved.memory_id, content="refunds are accepted for 45 days")
        assert updated.content.endswith("45 days") and updated.created_at == memory.created_at
        assert engram.forget_memory(saved.memory_id, reason="policy changed").status == "forgotten"
        with pytest.raises(NotFoundError) as missing:
            engram.get_memory(saved.memory_id)
        assert (missing.value.status, missing.value.code) == (404, "not_found")
        with pytest.raises(InvalidRequestError) as invalid:
            engram.save_memory("x", importance=5)
        assert invalid.value.status == 422 and invalid.value.field == "importance"
        batch = engram.save_memories([{"content": "one"}, {"content": ""}])
        assert batch.results[0].memory_id and batch.results[1].error.code == "validation_error"  # type: ignore[union-attr]
    with EngramClient(api_url, api_key="egk_wrong") as stranger, pytest.raises(AuthenticationError):
        stranger.list_memories()


def test_environment_defaults(api_url, tenant, monkeypatch):
    monkeypatch.setenv("ENGRAM_URL", api_url)
    monkeypatch.setenv("ENGRAM_API_KEY", tenant.admin_key)
    with EngramClient() as engram:
        saved = engram.save_memory("configured from the environment")
        assert engram.get_memory(saved.memory_id).content == "configured from the environment"


def test_async_client(api_url, tenant):
    async def main() -> None:
        async with AsyncEngramClient(api_url, api_key=tenant.admin_key) as engram:
            saved = await engram.save_memory("the warehouse ships on weekdays", tags=["ops"])
            hits = await engram.search("when does the warehouse ship?")
            assert saved.memory_id in [hit.id for hit in hits.memories]
            hydrated = await engram.hydrate(budget_bytes=10_000)
            assert saved.memory_id in [m.id for m in hydrated.memories]
            await engram.forget_memory(saved.memory_id, purge=True)
            with pytest.raises(NotFoundError):
                await engram.get_memory(saved.memory_id)

    anyio.run(main)


def test_unreachable_engram_is_a_typed_error():
    with EngramClient("http://127.0.0.1:9", api_key="k", max_retries=0) as engram:
        with pytest.raises(EngramConnectionError):
            engram.list_memories()


def _flaky(statuses: list[int], headers: dict[str, str]) -> tuple[httpx.MockTransport, list[int]]:
    """A transport answering ``statuses`` in turn (then 200 with an empty page): the retry policy alone."""
    seen: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(len(seen))
        if len(seen) <= len(statuses):
            status = statuses[len(seen) - 1]
            body = {"error": {"code": "rate_limited" if status == 429 else "unavailable", "message": "later"}}
            return httpx.Response(status, json=body, headers=headers)
        return httpx.Response(200, json={"memories": [], "next_cursor": None})

    return httpx.MockTransport(handle), seen


def test_retries_429_and_503_then_raises_typed_errors():
    transport, seen = _flaky([429, 503], {"Retry-After": "0"})
    with EngramClient("http://engram.invalid", api_key="k", transport=transport) as engram:
        assert engram.list_memories().memories == [] and len(seen) == 3
    transport, seen = _flaky([503] * 10, {"Retry-After": "0"})
    with EngramClient("http://engram.invalid", api_key="k", max_retries=2, transport=transport) as engram:
        with pytest.raises(ServiceUnavailableError) as down:
            engram.list_memories()
    assert len(seen) == 3 and down.value.retry_after == 0.0
    transport, seen = _flaky([429] * 10, {"Retry-After": "0"})

    async def main() -> None:
        async_transport = httpx.MockTransport(transport.handler)  # type: ignore[arg-type]
        async with AsyncEngramClient("http://e.invalid", api_key="k", max_retries=1, transport=async_transport) as e:
            with pytest.raises(RateLimitError):
                await e.list_memories()

    anyio.run(main)
    assert len(seen) == 2


def test_retry_delay_follows_retry_after():
    settings = Settings.resolve(
        base_url="http://x", api_key=None, agent_id=None, persona=None, max_retries=3, backoff=0.5, max_backoff=30
    )
    assert settings.retry_delay(0, httpx.Response(429, headers={"Retry-After": "7"})) == 7.0
    assert settings.retry_delay(0, httpx.Response(429, headers={"Retry-After": "600"})) == 30.0
    date = httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert settings.retry_delay(0, date) == 0.0  # a date in the past: retry at once
    backoffs = [settings.retry_delay(n, httpx.Response(503)) for n in range(3)]
    assert 0.25 <= backoffs[0] <= 0.5 and 1.0 <= backoffs[2] <= 2.0


TYPED_USAGE = '''
from engram_client import AsyncEngramClient, EngramClient, Memory, SaveResult, SearchResponse


async def use_async(engram: AsyncEngramClient) -> str:
    saved: SaveResult = await engram.save_memory("x", kind="fact", tags=["t"])
    hits: SearchResponse = await engram.search("x", max_memories=3)
    memory: Memory = await engram.get_memory(saved.memory_id)
    return memory.content + hits.memories[0].text


def use_sync(engram: EngramClient) -> float:
    return engram.save_memory("x").memory_id.count("1") + engram.search("q").memories[0].score
'''

MISTYPED_USAGE = '''
from engram_client import AsyncEngramClient, EngramClient, SaveResult


async def forgot_await(engram: AsyncEngramClient) -> SaveResult:
    return engram.save_memory("x")


def unknown_option(engram: EngramClient) -> None:
    engram.save_memory("x", colour="red")


def bad_kind(engram: EngramClient) -> None:
    engram.save_memory("x", kind="rumour")
'''


def _mypy(path: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    # MYPYPATH: an editable install's import hook is invisible to mypy; a wheel install would not need it.
    # The cache outside the checkout: nothing is written beside the SDK.
    command = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), str(path)]
    env = {**os.environ, "MYPYPATH": str(SDK)}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=path.parent, env=env)


def test_sdk_typing_holds_for_users(tmp_path):
    """mypy --strict passes over the SDK and a sample of sync and async use, and catches the mistakes a
    typed SDK should: a missing await, an unknown option, a kind that does not exist."""
    cache = tmp_path / "mypy-cache"  # shared by the three runs (the SDK's dependencies checked once)
    sdk = _mypy(SDK / "engram_client", cache)
    assert sdk.returncode == 0, sdk.stdout
    good = tmp_path / "good.py"
    good.write_text(TYPED_USAGE)
    checked = _mypy(good, cache)
    assert checked.returncode == 0, checked.stdout
    bad = tmp_path / "bad.py"
    bad.write_text(MISTYPED_USAGE)
    result = _mypy(bad, cache)
    assert result.returncode == 1
    assert 'Incompatible return value type (got "Coroutine' in result.stdout, result.stdout
    assert 'Unexpected keyword argument "colour"' in result.stdout, result.stdout
    assert "Literal['rumour']" in result.stdout, result.stdout
