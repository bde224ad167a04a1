"""A LangChain retriever backed by engram's search: ``EngramRetriever(client=EngramClient(), k=5)``.

Each memory hit becomes a ``Document`` whose text is the memory and whose metadata carries its id, score,
kind, category, importance, creation time and matched entities. Give ``async_client`` too for a truly
asynchronous ``ainvoke``; without it the sync client runs in a thread.

Needs the ``langchain`` extra: ``pip install 'engram-memory-client[langchain]'``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from engram_client.async_client import AsyncEngramClient
from engram_client.client import EngramClient
from engram_client.models import MemoryCategory, MemoryKind, SearchMode, SearchResponse


class EngramRetriever(BaseRetriever):
    """Retrieves the memories engram's hybrid search ranks first for a question."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: EngramClient
    async_client: AsyncEngramClient | None = None
    k: int = Field(default=5, ge=1, le=100, description="How many memories to retrieve.")
    mode: SearchMode | None = None
    kind: MemoryKind | None = None
    category: MemoryCategory | None = None
    entities: list[str] | None = Field(default=None, description="Entities the questions are about.")
    agent_id: str | None = None
    persona: str | None = None

    def _options(self) -> dict[str, Any]:
        return {
            "max_memories": self.k,
            "max_example_queries": 0,
            "max_entities": 0,
            "mode": self.mode,
            "kind": self.kind,
            "category": self.category,
            "entities": self.entities,
            "agent_id": self.agent_id,
            "persona": self.persona,
        }

    @staticmethod
    def _documents(response: SearchResponse) -> list[Document]:
        return [
            Document(
                page_content=hit.text,
                id=hit.id,
                metadata={
                    "id": hit.id,
                    "score": hit.score,
                    "kind": hit.kind,
                    "category": hit.category,
                    "importance": hit.importance,
                    "created_at": hit.created_at.isoformat(),
                    "matched_entities": hit.matched_entities,
                    "source": "engram",
                },
            )
            for hit in response.memories
        ]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self._documents(self.client.search(query, **self._options()))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        if self.async_client is not None:
            return self._documents(await self.async_client.search(query, **self._options()))
        return await asyncio.to_thread(self._get_relevant_documents, query, run_manager=run_manager.get_sync())


__all__ = ["EngramRetriever"]
