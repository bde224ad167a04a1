"""Which memories a search may return, as one SQL predicate, and a per-search cache of the verdicts.

A memory is eligible when it is visible to the caller (CONTRACT section 2), its status is ``active``
(or ``stale`` with ``include_stale``; ``forgotten`` never), it passes the ``kind``, ``category`` and
``occurred_after`` / ``occurred_before`` filters (both bounds inclusive), and, under a ``datasource``,
it has at least one entity rooted at that datasource.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    Boolean,
    ColumnElement,
    Executable,
    Text,
    and_,
    any_,
    literal,
    literal_column,
    select,
    text,
)
from sqlalchemy.orm import Session

from core.memories.models import Memory
from core.memories.visibility import visible_clause
from core.search import sql
from core.tenancy.context import Caller

MEMORIES, EXAMPLE_QUERIES = "memories", "example_queries"


def any_of(column: Any, values: Iterable[str]) -> ColumnElement[bool]:
    """``column = ANY(:array)``: one bound array instead of one bound parameter per value."""
    return column == any_(literal(list(values), type_=ARRAY(Text)))


HAS_QUERY_SQL = "coalesce(jsonb_typeof(memories.query), 'null') <> 'null'"


def has_query() -> ColumnElement[bool]:
    """The memory carries an attached query (SQL NULL and JSON null both mean it does not)."""
    # Spelled as literal SQL so it matches the partial index ix_memories_tenant_has_query (0003).
    return literal_column(HAS_QUERY_SQL, type_=Boolean)


def scope_clause(datasource: str) -> ColumnElement[bool]:
    """The memory has an entity equal to ``datasource`` or a strict dotted descendant of it."""
    return text(  # type: ignore[return-value]
        "EXISTS (SELECT 1 FROM unnest(memories.entities) AS scope_e "
        "WHERE split_part(scope_e, '.', 1) = :scope_ds AND NOT starts_with(scope_e, 'memory:'))"
    ).bindparams(scope_ds=datasource)


@dataclass(frozen=True)
class MemoryFilter:
    caller: Caller
    include_stale: bool = False
    kind: str | None = None
    category: str | None = None
    occurred_after: datetime | None = None
    occurred_before: datetime | None = None
    datasource: str | None = None

    @property
    def statuses(self) -> list[str]:
        return ["active", "stale"] if self.include_stale else ["active"]

    def corpus_clauses(self) -> list[ColumnElement[bool]]:
        """What defines the corpus the statistics describe: status and datasource scope."""
        clauses: list[ColumnElement[bool]] = [Memory.status.in_(self.statuses)]
        if self.datasource is not None:
            clauses.append(scope_clause(self.datasource))
        return clauses

    def caller_clauses(self) -> list[ColumnElement[bool]]:
        """Filters applied to a ranking, not to the statistics: visibility and the field filters."""
        clauses: list[ColumnElement[bool]] = [visible_clause(self.caller)]
        if self.kind is not None:
            clauses.append(Memory.kind == self.kind)
        if self.category is not None:
            clauses.append(Memory.category == self.category)
        if self.occurred_after is not None:
            clauses.append(Memory.occurred_at >= self.occurred_after)
        if self.occurred_before is not None:
            clauses.append(Memory.occurred_at <= self.occurred_before)
        return clauses

    def clauses(self) -> list[ColumnElement[bool]]:
        return self.corpus_clauses() + self.caller_clauses()

    def caller_predicate(self) -> ColumnElement[bool]:
        return and_(*self.caller_clauses())


@dataclass
class Eligibility:
    """Verdicts for memory ids, asked of the database at most once per id per search.

    ``bucket(id)`` is ``memories`` (no attached query), ``example_queries`` or None (not eligible).
    """

    session: Session
    memory_filter: MemoryFilter
    _verdicts: dict[str, str | None] = field(default_factory=dict)

    def learn(self, verdicts: dict[str, str | None]) -> None:
        self._verdicts.update(verdicts)

    def check(self, memory_ids: Iterable[str]) -> None:
        missing = [m for m in dict.fromkeys(memory_ids) if m not in self._verdicts]
        if not missing:
            return
        memory_filter = self.memory_filter
        tenant_id = memory_filter.caller.tenant_id

        def build() -> Executable:
            return select(Memory.id, has_query()).where(
                Memory.tenant_id == tenant_id, Memory.id == any_(sql.text_array("ids")), *memory_filter.clauses()
            )

        rows = sql.run(self.session, ("eligibility", memory_filter), build, ids=missing)
        found = {memory_id: EXAMPLE_QUERIES if has_query else MEMORIES for memory_id, has_query in rows}
        for memory_id in missing:
            self._verdicts[memory_id] = found.get(memory_id)

    def known(self, memory_id: str) -> bool:
        """Whether the verdict on ``memory_id`` is known (asked or learned)."""
        return memory_id in self._verdicts

    def bucket(self, memory_id: str) -> str | None:
        return self._verdicts.get(memory_id)
