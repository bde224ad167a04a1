"""Turn a save's `linked_entities` (and attached query) into canonical entities.

Entity lists resolve strictly (unknown or ambiguous: 422 naming the candidates); an inline query dict
resolves leniently (warnings) and is stored on the memory. ``memory:<id>`` references must name a memory
of the tenant (or one saved in the same batch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.entities.canonical import CatalogSnapshot, is_memory_ref, memory_id_of
from core.entities.resolver import extract_query_entities, resolve_entities
from core.entities.store import load_snapshot
from core.errors import Invalid
from core.memories.models import Memory


@dataclass
class Links:
    entities: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    query: dict[str, Any] | None = None
    # What `query` resolved to now, when it is saved (kept with the memory to judge staleness later).
    query_entities: list[str] | None = None


class LinkResolver:
    """Resolves links for one unit of work; loads the catalog and memory ids at most once."""

    def __init__(self, session: Session, *, tenant_id: int):
        self._session = session
        self._tenant_id = tenant_id
        self._snapshot: CatalogSnapshot | None = None
        self._extra_ids: set[str] = set()
        self._known: dict[str, bool] = {}

    @property
    def snapshot(self) -> CatalogSnapshot:
        if self._snapshot is None:
            self._snapshot = load_snapshot(self._session, self._tenant_id)
        return self._snapshot

    def also_existing(self, memory_ids: Iterable[str]) -> None:
        """Ids saved in the same batch count as existing memories."""
        self._extra_ids.update(memory_ids)

    def _prefetch(self, refs: list[str]) -> None:
        ids = [memory_id_of(r) for r in refs if is_memory_ref(r)]
        missing = [i for i in ids if i not in self._known and i not in self._extra_ids]
        if missing:
            found = set(self._session.scalars(select(Memory.id).where(Memory.id.in_(missing))).all())
            for i in missing:
                self._known[i] = i in found

    def _memory_exists(self, memory_id: str) -> bool:
        return memory_id in self._extra_ids or self._known.get(memory_id, False)

    def resolve(self, linked: list[str] | dict[str, Any] | None, *, query: dict[str, Any] | None) -> Links:
        links = Links()
        if isinstance(linked, dict):
            query = linked if query is None else query
            linked = None
        if linked:
            self._prefetch([x for x in linked if isinstance(x, str)])
            needs_catalog = any(isinstance(x, str) and not is_memory_ref(x) for x in linked)
            snapshot = self.snapshot if needs_catalog else CatalogSnapshot()
            resolution = resolve_entities(snapshot, linked, strict=True, memory_exists=self._memory_exists)
            if resolution.errors:
                first = resolution.errors[0]
                index = next((i for i, x in enumerate(linked) if x == first.input), 0)
                message = f"linked entity {first.input!r}: {first.message}"
                if first.candidates:
                    message += f" (candidates: {', '.join(first.candidates)})"
                raise Invalid(
                    message,
                    field=f"linked_entities.{index}",
                    details={"candidates": first.candidates, "input": first.input},
                )
            links.entities.extend(resolution.entities)
            links.warnings.extend(resolution.warnings)
        if query is not None:
            resolution = extract_query_entities(self.snapshot, query)
            for entity in resolution.entities:
                if entity not in links.entities:
                    links.entities.append(entity)
            links.warnings.extend(resolution.warnings)
            links.query = query
            links.query_entities = list(resolution.entities)
        return links
