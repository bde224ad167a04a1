"""Which memories a search may return, as one SQL predicate, and a per-search cache of the verdicts.

A memory is eligible when it is visible to the caller (CONTRACT section 2), its status is ``active``
(or ``stale`` with ``include_stale``; ``forgotten`` never), it passes the ``kind``, ``category``,
``tags`` (any of) and ``occurred_after`` / ``occurred_before`` filters (both bounds inclusive), and,
under a ``datasource``, it has at least one entity rooted at that datasource.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    ColumnElement,
    Executable,
    Text,
    and_,
    any_,
    bindparam,
    literal,
    literal_column,
    select,
    text,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from core import sql
from core.memories.models import Memory
from core.memories.visibility import AGENT_SCOPED, visible_clause, visible_shape, visible_values
from core.refs import MEMORY_PREFIX
from core.tenancy.context import Caller

if TYPE_CHECKING:
    from core.search.facts import Fact, TenantFacts

MEMORIES, EXAMPLE_QUERIES = "memories", "example_queries"
_doc_id = itemgetter(0)  # of a ranking's (doc id, score)


def any_of(column: Any, values: Iterable[str]) -> ColumnElement[bool]:
    """``column = ANY(:array)``: one bound array instead of one bound parameter per value."""
    return column == any_(literal(list(values), type_=ARRAY(Text)))


HAS_QUERY_SQL = "coalesce(jsonb_typeof(memories.query), 'null') <> 'null'"
# A memory in an episode (a run, or an explicit event time), as core.search.index.episode_of says it in Python.
IN_EPISODE_SQL = "(memories.run_id IS NOT NULL OR memories.occurred_at <> memories.created_at)"


def has_query() -> ColumnElement[bool]:
    """The memory carries an attached query (SQL NULL and JSON null both mean it does not)."""
    # Spelled as literal SQL so it matches the partial index ix_memories_tenant_has_query (0003).
    return literal_column(HAS_QUERY_SQL, type_=Boolean)


def scope_clause() -> ColumnElement[bool]:
    """The memory has an entity equal to the datasource ``scope_ds`` (a parameter) or a strict dotted descendant
    of it."""
    return text(  # type: ignore[return-value]
        "EXISTS (SELECT 1 FROM unnest(memories.entities) AS scope_e "
        "WHERE split_part(scope_e, '.', 1) = :scope_ds AND NOT starts_with(scope_e, '" + MEMORY_PREFIX + "'))"
    ).bindparams(bindparam("scope_ds", value=None, type_=Text))


def tenant_param() -> BindParameter[int]:
    """The tenant's id as the parameter ``tenant`` (:meth:`MemoryFilter.values` gives it)."""
    return bindparam("tenant", value=None, type_=BigInteger)


@dataclass(frozen=True)
class MemoryFilter:
    caller: Caller
    include_stale: bool = False
    kind: str | None = None
    category: str | None = None
    occurred_after: datetime | None = None
    occurred_before: datetime | None = None
    datasource: str | None = None
    # Any of these tags (sorted and distinct, so equal filters hash alike); empty: no tag filter.
    tags: tuple[str, ...] = ()

    @property
    def statuses(self) -> list[str]:
        return ["active", "stale"] if self.include_stale else ["active"]

    def shape(self) -> tuple[Any, ...]:
        """What the form of :meth:`clauses` depends on: the caller's visibility shape, the statuses, and which
        filters are set. Their values (the tenant's, the caller's, the filters') are the parameters
        :meth:`values` gives, so a statement built with these clauses is compiled once per shape, not once per
        tenant, agent and filter value (a cache of statements by filter thrashed with a few hundred tenants)."""
        return (
            visible_shape(self.caller),
            self.include_stale,
            self.kind is not None,
            self.category is not None,
            self.occurred_after is not None,
            self.occurred_before is not None,
            self.datasource is not None,
            bool(self.tags),
        )

    def verdict_key(self) -> tuple[Any, ...]:
        """What :meth:`verdict` depends on, within one tenant: equal for filters that judge every memory alike,
        so that they share the verdicts a tenant's facts remember (core.search.facts). Callers who differ only
        in their key, user or role (other than an admin's seeing all) judge alike: a tenant's many agents and
        end users with one persona and agent share one memo instead of pushing each other's out."""
        caller = self.caller
        sees_all = caller.sees_all
        return (
            self.include_stale,
            self.datasource,
            sees_all,
            None if sees_all else caller.persona,
            None if sees_all else caller.agent_id,
            self.kind,
            self.category,
            self.tags,
            self.occurred_after,
            self.occurred_before,
        )

    def values(self) -> dict[str, Any]:
        """The parameters of :meth:`clauses` and :func:`tenant_param`."""
        values: dict[str, Any] = {"tenant": self.caller.tenant_id, **visible_values(self.caller)}
        for name, value in (
            ("filter_kind", self.kind),
            ("filter_category", self.category),
            ("filter_after", self.occurred_after),
            ("filter_before", self.occurred_before),
            ("scope_ds", self.datasource),
        ):
            if value is not None:
                values[name] = value
        if self.tags:
            values["filter_tags"] = list(self.tags)
        return values

    def corpus_clauses(self) -> list[ColumnElement[bool]]:
        """What defines the corpus the statistics describe: status and datasource scope."""
        clauses: list[ColumnElement[bool]] = [Memory.status.in_(self.statuses)]
        if self.datasource is not None:
            clauses.append(scope_clause())
        return clauses

    def caller_clauses(self) -> list[ColumnElement[bool]]:
        """Filters applied to a ranking, not to the statistics: visibility and the field filters."""
        clauses: list[ColumnElement[bool]] = [visible_clause(self.caller, bound=True)]
        if self.kind is not None:
            clauses.append(Memory.kind == bindparam("filter_kind", value=None, type_=Text))
        if self.category is not None:
            clauses.append(Memory.category == bindparam("filter_category", value=None, type_=Text))
        if self.tags:
            clauses.append(Memory.tags.overlap(bindparam("filter_tags", value=None, type_=ARRAY(Text))))
        if self.occurred_after is not None:
            clauses.append(Memory.occurred_at >= bindparam("filter_after", value=None, type_=Memory.occurred_at.type))
        if self.occurred_before is not None:
            clauses.append(Memory.occurred_at <= bindparam("filter_before", value=None, type_=Memory.occurred_at.type))
        return clauses

    def clauses(self) -> list[ColumnElement[bool]]:
        """Every condition of eligibility but the tenant's (parameters: :meth:`values`)."""
        return self.corpus_clauses() + self.caller_clauses()

    def caller_predicate(self) -> ColumnElement[bool]:
        return and_(*self.caller_clauses())

    def verdict(self, fact: Fact | None) -> str | None:
        """The bucket of a memory with these facts, or None when :meth:`clauses` would exclude it."""
        if fact is None or fact.status not in self.statuses:
            return None
        if self.datasource is not None and self.datasource not in fact.roots:
            return None
        caller = self.caller
        if not caller.sees_all:
            if fact.persona is not None and fact.persona != caller.persona:
                return None
            if fact.agent_id is not None and fact.category in AGENT_SCOPED and fact.agent_id != caller.agent_id:
                return None
        if self.kind is not None and fact.kind != self.kind:
            return None
        if self.category is not None and fact.category != self.category:
            return None
        if self.tags and fact.tags.isdisjoint(self.tags):
            return None
        if self.occurred_after is not None and (fact.occurred_at is None or fact.occurred_at < self.occurred_after):
            return None
        if self.occurred_before is not None and (fact.occurred_at is None or fact.occurred_at > self.occurred_before):
            return None
        return EXAMPLE_QUERIES if fact.carries_query else MEMORIES


@dataclass
class Eligibility:
    """Verdicts for memory ids, asked of the database at most once per id per search.

    ``bucket(id)`` is ``memories`` (no attached query), ``example_queries`` or None (not eligible).
    """

    session: Session
    memory_filter: MemoryFilter
    _verdicts: dict[str, str | None] = field(default_factory=dict)
    # Gives the tenant's facts (core.search.facts) caught up to the search's snapshot, or None (too many to
    # keep): verdicts without a query. Called at the first check that needs a verdict.
    facts_source: Callable[[], TenantFacts | None] | None = None
    _tenant_facts: TenantFacts | None = None

    def learn(self, verdicts: dict[str, str | None]) -> None:
        self._verdicts.update(verdicts)

    def check(self, memory_ids: Iterable[str]) -> None:
        verdicts = self._verdicts
        # (Set operations run in C: a search checks a few hundred ids at a time, most of them known already.)
        missing = set(memory_ids).difference(verdicts)
        if not missing:
            return
        memory_filter = self.memory_filter
        facts = self.facts()
        if facts is not None:
            memo = facts.memo(memory_filter.verdict_key())
            # The verdicts the memo lacks are judged here; the rest are copied from it in one pass in C.
            verdict, fact_of = memory_filter.verdict, facts.get
            for memory_id in missing.difference(memo):
                memo[memory_id] = verdict(fact_of(memory_id))
            verdicts.update(zip(missing, map(memo.__getitem__, missing), strict=True))
            return

        def build() -> Executable:
            return select(Memory.id, has_query()).where(
                Memory.tenant_id == tenant_param(), Memory.id == any_(sql.text_array("ids")), *memory_filter.clauses()
            )

        values = {"ids": sorted(missing), **memory_filter.values()}
        key = ("eligibility", memory_filter.shape())
        rows = sql.run(self.session, sql.Query(key, build, values, generic=True))
        found = {memory_id: EXAMPLE_QUERIES if has_query else MEMORIES for memory_id, has_query in rows}
        for memory_id in missing:
            self._verdicts[memory_id] = found.get(memory_id)

    def facts(self) -> TenantFacts | None:
        """The tenant's facts the verdicts come from (caught up to the search's snapshot at least), or None."""
        source, self.facts_source = self.facts_source, None
        if source is not None:
            self._tenant_facts = source()
        return self._tenant_facts

    def in_memory(self) -> bool:
        """Whether verdicts come from the tenant's facts held in this process (no query per check)."""
        return self.facts() is not None

    def known(self, memory_id: str) -> bool:
        """Whether the verdict on ``memory_id`` is known (asked or learned)."""
        return memory_id in self._verdicts

    def bucket(self, memory_id: str) -> str | None:
        return self._verdicts.get(memory_id)

    def pick(self, ranking: Iterable[tuple[str, float]], bucket: str, depth: int) -> list[tuple[str, float]]:
        """The first ``depth`` entries of ``ranking`` whose memory is eligible for ``bucket``."""
        if depth <= 0:
            return []
        picked: list[tuple[str, float]] = []
        verdict = self._verdicts.get
        for entry in ranking:
            if verdict(entry[0]) == bucket:
                picked.append(entry)
                if len(picked) >= depth:
                    break
        return picked
