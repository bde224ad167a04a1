"""A LangGraph store backed by engram: ``graph.compile(store=EngramStore(client))``.

Each item is one engram memory. Its id is derived from the namespace and key (so a put of the same key
replaces it), its content is the JSON of ``{"namespace", "key", "value"}`` (so full-text and semantic search
read the value's words and the item comes back exactly), and its tags name every prefix of the namespace
(``lg:``, ``lg:users``, ``lg:users/u1``, ...) so a namespace prefix is an exact tag filter. Optionally one level of
the namespace is the memory's ``persona`` and another its ``agent_id``: ``EngramStore(client,
persona_level=0)`` stores ``("user-42", "memories")`` under persona ``user-42``, so engram's own visibility
rules keep one user's items from another's.

Needs the ``langgraph`` extra: ``pip install 'engram-memory-client[langgraph]'``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any, TypedDict
from urllib.parse import quote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from engram_client.client import EngramClient
from engram_client.errors import NotFoundError
from engram_client.models import Memory, MemoryCategory

TAG_PREFIX = "lg:"
ID_PREFIX = "lg~"
_PAGE = 200
_SEARCH_CAP = 100  # engram's largest max_memories
_SEARCH_TAG_CHARS = 200  # the longest tag a search filter takes


class _Identity(TypedDict):
    persona: str | None
    agent_id: str | None


def memory_id(namespace: tuple[str, ...], key: str) -> str:
    """The engram id of an item: stable for (namespace, key), within engram's id charset and length."""
    digest = hashlib.sha256(json.dumps([list(namespace), key]).encode("utf-8")).hexdigest()[:40]
    return ID_PREFIX + digest


def namespace_tag(namespace: tuple[str, ...]) -> str:
    """The tag a namespace (or namespace prefix) is filtered by; parts are escaped so '/' and ',' are safe."""
    return TAG_PREFIX + "/".join(quote(part, safe="") for part in namespace)


def _tags(namespace: tuple[str, ...]) -> list[str]:
    """Every prefix's tag, the empty one ("lg:", every item of the store) included."""
    return [namespace_tag(namespace[:depth]) for depth in range(len(namespace) + 1)]


def _decode(memory_content: str) -> tuple[tuple[str, ...], str, dict[str, Any]] | None:
    try:
        stored = json.loads(memory_content)
        return tuple(stored["namespace"]), str(stored["key"]), dict(stored["value"])
    except (ValueError, KeyError, TypeError):
        return None  # not an item this store wrote


def _matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(path) > len(namespace):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path) :]
    return all(want in ("*", have) for want, have in zip(path, part, strict=True))


class EngramStore(BaseStore):
    """LangGraph's ``BaseStore`` over engram's REST API (a sync client; the async methods run it in a thread)."""

    supports_ttl = False

    def __init__(
        self,
        client: EngramClient,
        *,
        persona_level: int | None = None,
        agent_level: int | None = None,
        category: MemoryCategory = "core",
    ):
        self.client = client
        self.persona_level = persona_level
        self.agent_level = agent_level
        self.category: MemoryCategory = category

    # BaseStore's two primitives: every get/put/search/delete/list_namespaces arrives here as ops.

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [self._run(op) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    def _run(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            return self._get(op.namespace, op.key)
        if isinstance(op, PutOp):
            if op.value is None:
                self._delete(op.namespace, op.key)
            else:
                self._put(op.namespace, op.key, dict(op.value))
            return None
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        raise TypeError(f"unknown store operation {type(op).__name__}")

    def _identity(self, namespace: tuple[str, ...]) -> _Identity:
        """The persona and agent a namespace stands for (None where the namespace does not reach that level)."""

        def level(index: int | None) -> str | None:
            return namespace[index] if index is not None and index < len(namespace) else None

        return {"persona": level(self.persona_level), "agent_id": level(self.agent_level)}

    def _item(self, memory: Memory, score: float | None = None) -> SearchItem | None:
        decoded = _decode(memory.content)
        if decoded is None:
            return None
        namespace, key, value = decoded
        return SearchItem(namespace, key, value, memory.created_at, memory.updated_at, score)

    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        try:
            memory = self.client.get_memory(memory_id(namespace, key), **self._identity(namespace))
        except NotFoundError:
            return None
        decoded = _decode(memory.content)
        if decoded is None:
            return None
        namespace, key, value = decoded
        return Item(
            value=value, key=key, namespace=namespace, created_at=memory.created_at, updated_at=memory.updated_at
        )

    def _put(self, namespace: tuple[str, ...], key: str, value: dict[str, Any]) -> None:
        content = json.dumps({"namespace": list(namespace), "key": key, "value": value}, ensure_ascii=False)
        self.client.save_memory(
            content,
            id=memory_id(namespace, key),
            tags=_tags(namespace),
            category=self.category,
            source="langgraph-store",
            **self._identity(namespace),
        )

    def _delete(self, namespace: tuple[str, ...], key: str) -> None:
        try:
            self.client.forget_memory(memory_id(namespace, key), purge=True, **self._identity(namespace))
        except NotFoundError:
            pass  # deleting what is not there is not an error in LangGraph's store

    def _in_prefix(self, prefix: tuple[str, ...]) -> Iterator[Memory]:
        """Every memory of this store under a namespace prefix, newest first (all of them for ())."""
        cursor: str | None = None
        while True:
            page = self.client.list_memories(
                tags=[namespace_tag(prefix)], limit=_PAGE, cursor=cursor, **self._identity(prefix)
            )
            yield from (m for m in page.memories if m.id.startswith(ID_PREFIX))
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        wanted = op.offset + op.limit
        found: list[SearchItem] = []
        if op.query:
            # engram ranks within the namespace's tag; the filter narrows its answer afterwards.
            tag = namespace_tag(prefix)
            hits = self.client.search(
                op.query,
                tags=[tag] if prefix and len(tag) <= _SEARCH_TAG_CHARS else None,
                max_memories=_SEARCH_CAP,
                max_entities=0,
                max_example_queries=0,
                **self._identity(prefix),
            )
            for hit in hits.memories:
                if not hit.id.startswith(ID_PREFIX):
                    continue
                item = self._item(self.client.get_memory(hit.id, **self._identity(prefix)), hit.score)
                if item and item.namespace[: len(prefix)] == prefix and _filtered(item, op.filter):
                    found.append(item)
                if len(found) >= wanted:
                    break
        else:
            for memory in self._in_prefix(prefix):
                item = self._item(memory)
                if item and _filtered(item, op.filter):
                    found.append(item)
                if len(found) >= wanted:
                    break
        return found[op.offset : wanted]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces: set[tuple[str, ...]] = set()
        for memory in self._in_prefix(()):
            decoded = _decode(memory.content)
            if decoded is None:
                continue
            namespace = decoded[0]
            if all(_matches(namespace, c) for c in op.match_conditions or ()):
                namespaces.add(namespace[: op.max_depth] if op.max_depth is not None else namespace)
        return sorted(namespaces)[op.offset : op.offset + op.limit]


def _filtered(item: Item, conditions: dict[str, Any] | None) -> bool:
    """LangGraph's exact-match filter on the item's value."""
    return all(item.value.get(field) == wanted for field, wanted in (conditions or {}).items())


__all__ = ["EngramStore", "memory_id", "namespace_tag"]
