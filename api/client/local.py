"""Local mode: the methods of :class:`api.client.EngramClient`, run in-process against the core services.

Each method does what its REST route does (validate with the same request model, act as the same
caller, run the same core call in one ``tenant_session``, shape the same answer) and returns the same
response model, so code written against the REST client runs unchanged without an HTTP server. Errors
are the same :class:`EngramAPIError`. The database is the configured one (``ENGRAM_DATABASE_URL``, else
the running `engram serve` of ``ENGRAM_HOME``); committed jobs go to Celery when a broker is reachable,
else they wait for the reconciler, as any write does while Redis is down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from api.client.base import as_api_errors, validated
from api.client.local_admin import LocalAdminCalls
from api.client.models import (
    BatchResult,
    ForgetResult,
    HydrateResult,
    ImportResult,
    Memory,
    MemoryPage,
    RunEnded,
)
from core.db import tenant_session
from core.errors import EngramError, Invalid
from core.memories import listing, transfer
from core.memories import service as memories
from core.memories.schemas import (
    MAX_BATCH_ITEMS,
    ListFilters,
    PatchMemoryIn,
    SaveMemoryIn,
    SaveResult,
    parse_model,
)
from core.search import service as search_service
from core.search.schemas import SearchRequest, SearchResponse
from core.tenancy.context import Caller


def _error_item(exc: EngramError) -> dict[str, Any]:
    error: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.field:
        error["field"] = exc.field
    return {"error": error}


class LocalEngramClient(LocalAdminCalls):
    """In-process client for one API key; ``agent_id`` / ``persona`` as in :class:`api.client.EngramClient`."""

    @as_api_errors
    def __init__(
        self, *, api_key: str, agent_id: str | None = None, persona: str | None = None, install_queue: bool = True
    ):
        from api.auth import caller_for_key

        self._caller: Caller = caller_for_key(api_key)
        self.agent_id, self.persona = agent_id, persona
        if install_queue:
            _install_queue()

    @classmethod
    def for_caller(
        cls, caller: Caller, *, agent_id: str | None = None, persona: str | None = None
    ) -> LocalEngramClient:
        """A client for an already authenticated caller (the MCP server's per-request clients)."""
        client = cls.__new__(cls)
        client._caller, client.agent_id, client.persona = caller, agent_id, persona
        return client

    def __enter__(self) -> LocalEngramClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: sessions are per call."""

    @property
    def caller(self) -> Caller:
        return self._caller

    def _acting(self, agent_id: str | None, persona: str | None) -> Caller:
        return self._caller.acting_as(agent_id=agent_id or self.agent_id, persona=persona or self.persona)

    def _writing(self, agent_id: str | None, persona: str | None) -> Caller:
        """As _acting, for a call that changes memories: 403 for a read-only key."""
        self._caller.require_write()
        return self._acting(agent_id, persona)

    # Memories

    @as_api_errors
    def save_memory(self, item: SaveMemoryIn | None = None, **fields: Any) -> SaveResult:
        parsed = validated(SaveMemoryIn, item, fields)
        caller = self._writing(parsed.agent_id, parsed.persona)
        with tenant_session(caller.tenant_id) as session:
            result = memories.save_memory(session, caller=caller, item=parsed)
        if parsed.sync_embed:
            from api.embedding_hooks import after_save

            result = after_save(caller=caller, result=result)
        return result

    @as_api_errors
    def save_memories(
        self,
        items: Sequence[SaveMemoryIn | dict[str, Any]],
        *,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> BatchResult:
        if len(items) > MAX_BATCH_ITEMS:
            raise Invalid(f"a batch holds at most {MAX_BATCH_ITEMS} items, got {len(items)}", field="items")
        parsed: list[SaveMemoryIn | EngramError] = []
        for i, raw in enumerate(items):
            try:
                parsed.append(
                    raw if isinstance(raw, SaveMemoryIn) else parse_model(SaveMemoryIn, raw, prefix=f"items.{i}.")
                )
            except EngramError as exc:
                parsed.append(exc)
        caller = self._writing(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            results = memories.save_memories(session, caller=caller, items=parsed)
        out = [
            _error_item(r) if isinstance(r, EngramError) else r.model_dump(exclude={"similar_existing"})
            for r in results
        ]
        return BatchResult.model_validate({"results": out})

    @as_api_errors
    def get_memory(
        self,
        memory_id: str,
        *,
        include_forgotten: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> Memory:
        caller = self._acting(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            row = memories.get_memory(session, caller=caller, memory_id=memory_id, include_forgotten=include_forgotten)
            return Memory.model_validate(memories.memories_to_dicts(session, [row])[0])

    @as_api_errors
    def patch_memory(
        self,
        memory_id: str,
        patch: PatchMemoryIn | None = None,
        *,
        agent_id: str | None = None,
        persona: str | None = None,
        **fields: Any,
    ) -> Memory:
        parsed = validated(PatchMemoryIn, patch, fields)
        caller = self._writing(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            row = memories.patch_memory(session, caller=caller, memory_id=memory_id, patch=parsed)
            return Memory.model_validate(memories.memories_to_dicts(session, [row])[0])

    @as_api_errors
    def forget_memory(
        self,
        memory_id: str,
        *,
        reason: str | None = None,
        purge: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> ForgetResult:
        caller = self._writing(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            result = memories.forget_memory(session, caller=caller, memory_id=memory_id, reason=reason, purge=purge)
        return ForgetResult.model_validate(result)

    @as_api_errors
    def list_memories(
        self,
        filters: ListFilters | None = None,
        *,
        agent_id: str | None = None,
        persona: str | None = None,
        **fields: Any,
    ) -> MemoryPage:
        chosen = validated(ListFilters, filters, fields)
        caller = self._acting(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            rows, next_cursor = listing.list_memories(session, caller=caller, filters=chosen)
            page = {"memories": memories.memories_to_dicts(session, rows), "next_cursor": next_cursor}
        return MemoryPage.model_validate(page)

    @as_api_errors
    def hydrate(self, *, budget_bytes: int, agent_id: str | None = None, persona: str | None = None) -> HydrateResult:
        if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes < 0:
            raise Invalid("budget_bytes must be a non-negative integer", field="budget_bytes")
        caller = self._acting(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            rows, used = listing.hydrate(session, caller=caller, budget_bytes=budget_bytes)
            body = {"memories": memories.memories_to_dicts(session, rows), "bytes": used}
        return HydrateResult.model_validate(body)

    @as_api_errors
    def export_memories(self, *, agent_id: str | None = None, persona: str | None = None) -> str:
        caller = self._acting(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            return transfer.export_markdown(session, caller=caller)

    @as_api_errors
    def import_memories(
        self, markdown: str, *, agent_id: str | None = None, persona: str | None = None
    ) -> ImportResult:
        if not markdown.strip():
            raise Invalid("the markdown holds no memory blocks", field="markdown")
        caller = self._writing(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            return ImportResult.model_validate(transfer.import_markdown(session, caller=caller, text=markdown))

    @as_api_errors
    def end_run(
        self,
        run_id: str,
        *,
        all_categories: bool = False,
        purge: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> RunEnded:
        from core.lifecycle.expiry import end_run

        caller = self._writing(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            result = end_run(session, caller=caller, run_id=run_id, all_categories=all_categories, purge=purge)
            return RunEnded.model_validate(result.as_dict())

    # Search

    @as_api_errors
    def search(self, request: SearchRequest | None = None, **fields: Any) -> SearchResponse:
        parsed = validated(SearchRequest, request, fields)
        identity = {"agent_id": parsed.agent_id or self.agent_id, "persona": parsed.persona or self.persona}
        parsed = parsed.model_copy(update={k: v for k, v in identity.items() if v})
        caller = self._acting(parsed.agent_id, parsed.persona)
        with tenant_session(caller.tenant_id) as session:
            return search_service.search(session, caller=caller, request=parsed)


def _install_queue() -> None:
    """Hand committed jobs to Celery; without a reachable broker setting they wait for the reconciler."""
    from core.runtime import ServiceNotRunning

    try:
        from api.broker import install_job_queue

        install_job_queue()
    except ServiceNotRunning:
        pass
