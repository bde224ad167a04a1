"""The asynchronous client: the methods of :class:`engram_client.EngramClient`, awaitable.

from engram_client import AsyncEngramClient

async with AsyncEngramClient() as engram:
    saved = await engram.save_memory("orders.amount is in cents", tags=["units"])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, overload

import anyio
import httpx

from engram_client import _operations as op
from engram_client._admin_async import AsyncAdminCalls
from engram_client._calls import Call, M, Settings, T, connection_error, parser, read, should_retry
from engram_client.models import (
    Association,
    BatchResult,
    ForgetResult,
    HydrateResult,
    ListSort,
    Memory,
    MemoryCategory,
    MemoryKind,
    MemoryPage,
    MemoryStatus,
    SaveResult,
    SearchMode,
    SearchResponse,
)
from engram_client.resources import ImportResult, MemoryHistory, RunEnded

Entities = list[str] | dict[str, Any]


class AsyncEngramClient(AsyncAdminCalls):
    """engram over its REST API, asynchronously. ``agent_id`` / ``persona`` are sent when a call names none.

    429 and 503 answers are retried ``max_retries`` times, waiting what ``Retry-After`` says (else an
    exponential backoff from ``backoff`` seconds); then the typed error is raised.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        agent_id: str | None = None,
        persona: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.settings = Settings.resolve(
            base_url=base_url,
            api_key=api_key,
            agent_id=agent_id,
            persona=persona,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
        )
        self._http = httpx.AsyncClient(
            base_url=self.settings.base_url, headers=self.settings.headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncEngramClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = await self._http.request(call.method, call.path, **call.request_kwargs())
            except httpx.HTTPError as exc:
                raise connection_error(exc, self.settings) from exc
            if not should_retry(response, attempt, self.settings):
                return read(call, response)
            await anyio.sleep(self.settings.retry_delay(attempt, response))
            attempt += 1

    # Memories

    async def save_memory(
        self,
        content: str,
        *,
        id: str | None = None,
        kind: MemoryKind | None = None,
        category: MemoryCategory | None = None,
        importance: float | None = None,
        tags: list[str] | None = None,
        linked_entities: Entities | None = None,
        query: dict[str, Any] | None = None,
        occurred_at: datetime | None = None,
        source: str | None = None,
        run_id: str | None = None,
        associations: list[Association] | None = None,
        sync_embed: bool | None = None,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> SaveResult:
        """Save (or, with an existing ``id``, replace) a memory."""
        return await self._send(op.save_memory(self.settings, locals()))

    async def save_memories(
        self, items: Sequence[Mapping[str, Any]], *, agent_id: str | None = None, persona: str | None = None
    ) -> BatchResult:
        """Save up to 1,000 memories in one transaction; each result is a save result or its error."""
        return await self._send(op.save_memories(self.settings, items, locals()))

    async def get_memory(
        self,
        memory_id: str,
        *,
        include_forgotten: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> Memory:
        """Recall one memory by id (:class:`NotFoundError` when absent or not visible)."""
        return await self._send(op.get_memory(self.settings, memory_id, locals()))

    async def memory_history(
        self,
        memory_id: str,
        *,
        include_forgotten: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> MemoryHistory:
        """The memory's versions, newest (the current one) first."""
        return await self._send(op.memory_history(self.settings, memory_id, locals()))

    async def update_memory(
        self,
        memory_id: str,
        *,
        content: str | None = None,
        kind: MemoryKind | None = None,
        category: MemoryCategory | None = None,
        importance: float | None = None,
        tags: list[str] | None = None,
        linked_entities: Entities | None = None,
        occurred_at: datetime | None = None,
        source: str | None = None,
        associations: list[Association] | None = None,
        sync_embed: bool | None = None,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> Memory:
        """Revise the given fields of a memory; every revision is kept."""
        return await self._send(op.update_memory(self.settings, memory_id, locals()))

    async def forget_memory(
        self,
        memory_id: str,
        *,
        reason: str | None = None,
        purge: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> ForgetResult:
        """Forget a memory (soft delete); ``purge=True`` deletes it for good."""
        return await self._send(op.forget_memory(self.settings, memory_id, locals()))

    async def list_memories(
        self,
        *,
        kind: MemoryKind | None = None,
        category: MemoryCategory | None = None,
        tags: list[str] | None = None,
        run_id: str | None = None,
        status: MemoryStatus | None = None,
        since: datetime | None = None,
        occurred_after: datetime | None = None,
        occurred_before: datetime | None = None,
        entity: str | None = None,
        sort: ListSort | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> MemoryPage:
        """One page of memories; pass ``next_cursor`` back as ``cursor`` for the next."""
        return await self._send(op.list_memories(self.settings, locals()))

    async def hydrate(
        self, *, budget_bytes: int, agent_id: str | None = None, persona: str | None = None
    ) -> HydrateResult:
        """The standing context of an agent that fits ``budget_bytes`` (core memories first)."""
        return await self._send(op.hydrate(self.settings, locals()))

    async def export_memories(self, *, agent_id: str | None = None, persona: str | None = None) -> str:
        """The visible memories as markdown with YAML front matter, one block a memory."""
        return await self._send(op.export_memories(self.settings, locals()))

    async def import_memories(
        self, markdown: str, *, agent_id: str | None = None, persona: str | None = None
    ) -> ImportResult:
        """Save the memories of an export (the same keys replace the same memories)."""
        return await self._send(op.import_memories(self.settings, markdown, locals()))

    async def end_run(
        self,
        run_id: str,
        *,
        all_categories: bool = False,
        purge: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> RunEnded:
        """Forget a run's conversation memories (``all_categories``: every memory of it; ``purge``: for good)."""
        return await self._send(op.end_run(self.settings, run_id, locals()))

    # Search

    async def search(
        self,
        question: str | None = None,
        *,
        entities: list[str] | None = None,
        query: dict[str, Any] | None = None,
        datasource: str | None = None,
        mode: SearchMode | None = None,
        kind: MemoryKind | None = None,
        category: MemoryCategory | None = None,
        tags: list[str] | None = None,
        max_memories: int | None = None,
        max_example_queries: int | None = None,
        max_entities: int | None = None,
        occurred_after: datetime | None = None,
        occurred_before: datetime | None = None,
        include_stale: bool | None = None,
        min_score: float | None = None,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> SearchResponse:
        """Memories, example queries and catalog entities relevant to a question and/or entities."""
        return await self._send(op.search(self.settings, locals()))

    # Any call, typed by the caller

    @overload
    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        markdown: str | None = None,
        cast_to: type[M],
    ) -> M: ...

    @overload
    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        markdown: str | None = None,
        cast_to: None = None,
    ) -> Any: ...

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        markdown: str | None = None,
        cast_to: type[M] | None = None,
    ) -> M | Any:
        """Any REST call, with this client's key, retries and typed errors: the answer parsed as ``cast_to``
        (a pydantic model), else as decoded JSON (text when the answer is not JSON)."""
        parse = parser(cast_to) if cast_to is not None else _as_is
        call = Call(method, path, parse, params=params or {}, json=json, markdown=markdown, text_answer=None)
        return await self._send(call)


def _as_is(body: Any) -> Any:
    return body
