"""The SDK's framework adapters with the real packages, against a real engram API process: a LangGraph
graph whose nodes remember and recall through ``EngramStore``, and a LangChain chain over
``EngramRetriever``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypedDict

import anyio
import pytest
from engram_client import AsyncEngramClient, EngramClient
from engram_client.langchain import EngramRetriever
from engram_client.langgraph import EngramStore, namespace_tag
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore

from tests.helpers.processes import running_api


@pytest.fixture(scope="module")
def api_url(stack) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with running_api(stack.env) as url:
        yield url


class Turn(TypedDict, total=False):
    user: str
    question: str
    answer: str


def remember(state: Turn, *, store: BaseStore) -> Turn:
    store.put((state["user"], "memories"), "refunds", {"text": "refunds are accepted within 30 days"})
    store.put((state["user"], "memories"), "shipping", {"text": "orders ship from Rotterdam"})
    return {}


def recall(state: Turn, *, store: BaseStore) -> Turn:
    found = store.search((state["user"], "memories"), query=state["question"], limit=1)
    return {"answer": found[0].value["text"] if found else "nothing remembered"}


def test_langgraph_graph_remembers_and_recalls_through_engram(api_url, tenant, member_key):
    with EngramClient(api_url, api_key=tenant.admin_key) as engram:
        store = EngramStore(engram, persona_level=0)
        graph = (
            StateGraph(Turn)
            .add_node("remember", remember)
            .add_node("recall", recall)
            .add_edge(START, "remember")
            .add_edge("remember", "recall")
            .add_edge("recall", END)
            .compile(store=store)
        )
        result = graph.invoke({"user": "user-42", "question": "how long are refunds accepted?"})
        assert result["answer"] == "refunds are accepted within 30 days"

        # The items are engram memories: under the user's persona, tagged with their namespace.
        item = store.get(("user-42", "memories"), "refunds")
        assert item is not None and item.value == {"text": "refunds are accepted within 30 days"}
        page = engram.list_memories(tags=[namespace_tag(("user-42", "memories"))], persona="user-42")
        assert len(page.memories) == 2 and {m.persona for m in page.memories} == {"user-42"}
        assert all("lg:" in m.tags for m in page.memories)

        # put replaces, delete removes, namespaces list.
        store.put(("user-42", "memories"), "refunds", {"text": "refunds are accepted within 45 days"})
        again = store.get(("user-42", "memories"), "refunds")
        assert again is not None and again.value["text"].endswith("45 days") and again.created_at == item.created_at
        store.put(("user-7", "notes"), "n1", {"text": "prefers email"})
        assert set(store.list_namespaces()) >= {("user-42", "memories"), ("user-7", "notes")}
        assert store.list_namespaces(prefix=("user-7",)) == [("user-7", "notes")]
        listed = store.search(("user-42",), filter={"text": "orders ship from Rotterdam"})
        assert [i.key for i in listed] == ["shipping"]
        store.delete(("user-42", "memories"), "shipping")
        assert store.get(("user-42", "memories"), "shipping") is None

        async def async_side() -> None:
            await store.aput(("user-7", "notes"), "n2", {"text": "timezone is CET"})
            got = await store.aget(("user-7", "notes"), "n2")
            assert got is not None and got.value == {"text": "timezone is CET"}

        anyio.run(async_side)

    # A member key sees only what engram's persona rules let it: user-7's persona cannot read user-42's items.
    with EngramClient(api_url, api_key=member_key()) as member:
        member_store = EngramStore(member, persona_level=0)
        assert member_store.search(("user-7",), query="refunds accepted") == []
        assert member_store.get(("user-42", "memories"), "refunds") is not None


def test_langchain_chain_answers_from_engram_memories(api_url, tenant):
    with EngramClient(api_url, api_key=tenant.admin_key) as engram:
        saved = engram.save_memory("the on-call rotation changes every Monday at 09:00", tags=["ops"])
        retriever = EngramRetriever(client=engram, k=3)
        chain = retriever | RunnableLambda(lambda docs: [d.page_content for d in docs])
        assert "the on-call rotation changes every Monday at 09:00" in chain.invoke("when does on-call change?")
        documents = retriever.invoke("on-call rotation")
        assert isinstance(documents[0], Document) and documents[0].metadata["id"] == saved.memory_id

        async def async_side() -> None:
            async with AsyncEngramClient(api_url, api_key=tenant.admin_key) as aengram:
                async_retriever = EngramRetriever(client=engram, async_client=aengram, k=3)
                found = await async_retriever.ainvoke("on-call rotation")
                assert found[0].metadata["id"] == saved.memory_id

        anyio.run(async_side)
