"""Canonical entity strings and an immutable, in-memory view of one tenant's catalog.

A canonical entity is exactly one of ``<ds>``, ``<ds>.<model>``, ``<ds>.<model>.<leaf>``
(leaf = column, named measure or custom aggregation) or ``memory:<id>``. Equality is plain
string equality. Everything here is pure: no database, no I/O.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

# Memory refs are defined in core.refs (below every domain); canonical forms re-export them.
from core.refs import MEMORY_PREFIX as MEMORY_PREFIX
from core.refs import is_memory_ref as is_memory_ref
from core.refs import memory_id_of as memory_id_of
from core.refs import memory_ref as memory_ref

MODEL_WILDCARD = "*"
"""What :func:`strip_aggregation` leaves of ``*:count``: "every row of the model", i.e. the model."""

MAX_MEMORY_ID_LENGTH = 200
_FORBIDDEN_ID_CHARS = frozenset(":/?#")
_AGG_SUFFIX_RE = re.compile(r"^\w+(?:\(.*\))?$", re.DOTALL)
# ``sum(revenue)`` / ``weighted_avg(revenue, weight=qty)``: the function spelling of ``revenue:sum``.
_AGG_CALL_RE = re.compile(r"^(\w+)\(\s*([^\s,()]+)\s*(?:,[^()]*)?\)$")


# ---------------------------------------------------------------------------
# Canonical strings
# ---------------------------------------------------------------------------


class CanonicalParts(NamedTuple):
    datasource: str
    model: str | None = None
    leaf: str | None = None


class ModelKey(NamedTuple):
    datasource: str
    model: str

    @property
    def canonical(self) -> str:
        return f"{self.datasource}.{self.model}"

    def leaf(self, name: str) -> str:
        """The canonical id of leaf ``name`` on this model."""
        return f"{self.datasource}.{self.model}.{name}"


def is_valid_memory_id(memory_id: str) -> bool:
    """Ids are 1..200 chars without ``: / ? #``, whitespace or control characters."""
    if not memory_id or len(memory_id) > MAX_MEMORY_ID_LENGTH:
        return False
    return not any(ch in _FORBIDDEN_ID_CHARS or ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in memory_id)


def make_canonical(*, datasource: str, model: str | None = None, leaf: str | None = None) -> str:
    """Join parts into ``<ds>[.<model>[.<leaf>]]``."""
    if leaf is not None and model is None:
        raise ValueError("a leaf needs a model")
    return ".".join(p for p in (datasource, model, leaf) if p is not None)


def split_canonical(s: str) -> CanonicalParts:
    """Split ``<ds>[.<model>[.<leaf>]]``; ValueError for memory refs and malformed strings."""
    if is_memory_ref(s):
        raise ValueError(f"{s!r} is a memory reference, not a catalog entity")
    parts = s.split(".")
    if len(parts) > 3 or not all(parts):
        raise ValueError(f"{s!r} is not of the form <ds>[.<model>[.<leaf>]]")
    return CanonicalParts(*parts)


def entity_matches_cascade(*, entry: str, canonical_id: str) -> bool:
    """memory:<id> refs match exactly; <ds>[.<model>[.<leaf>]] refs match exactly or as a strict descendant.

    ``entry`` is a stored entity, ``canonical_id`` the thing being removed. ``memory:42`` never
    matches ``memory:421`` or ``memory:42.y``; ``mydb.orders`` matches ``mydb.orders`` and
    ``mydb.orders.amount`` but never ``mydb.orders_archive``.
    """
    if is_memory_ref(canonical_id) or is_memory_ref(entry):
        return entry == canonical_id
    return entry == canonical_id or entry.startswith(canonical_id + ".")


def rooted_in(*, entity: str, datasource: str) -> bool:
    """An entity is rooted at a datasource when it is the datasource or a strict dotted descendant.

    Never a character prefix (``prod`` does not root ``prod_v2.x``); memory refs are rooted nowhere.
    """
    if not datasource or is_memory_ref(entity):
        return False
    return entity == datasource or entity.startswith(datasource + ".")


def split_aggregation(ref: str) -> tuple[str, str | None]:
    """``(target, aggregation)`` of ``revenue:sum``, ``revenue:weighted_avg(weight=qty)`` or ``sum(revenue)``.

    Aggregation parameters are opaque and dropped. ``*:count`` gives ``("*", "count")`` and
    ``orders.*:count`` gives ``("orders.*", "count")``. ValueError on an empty or malformed suffix.
    """
    ref = ref.strip()
    if is_memory_ref(ref):
        return ref, None
    target, colon, suffix = ref.partition(":")
    if colon:
        if not target or not _AGG_SUFFIX_RE.match(suffix):
            raise ValueError(f"{ref!r} has a malformed aggregation suffix")
        return target, suffix.split("(", 1)[0]
    call = _AGG_CALL_RE.match(ref)
    if call:
        return call.group(2), call.group(1)
    return ref, None


def strip_aggregation(ref: str) -> str:
    """``revenue:sum`` / ``revenue:corr(other=qty)`` -> ``revenue``; ``*:count`` -> ``*`` (the model)."""
    return split_aggregation(ref)[0]


# ---------------------------------------------------------------------------
# Catalog snapshot
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    hidden: bool = False


@dataclass(frozen=True, slots=True)
class ForeignKey:
    """``column`` on the owning model references ``target`` (possibly in another datasource)."""

    column: str
    target: ModelKey


@dataclass(frozen=True)
class ModelInfo:
    datasource: str
    name: str
    hidden: bool = False
    columns: Mapping[str, ColumnInfo] = field(default_factory=dict)
    measures: frozenset[str] = frozenset()
    aggregations: frozenset[str] = frozenset()
    foreign_keys: tuple[ForeignKey, ...] = ()

    @property
    def key(self) -> ModelKey:
        return ModelKey(self.datasource, self.name)

    def leaf_kind(self, leaf: str) -> str | None:
        """``column`` / ``measure`` / ``aggregation`` (in that order of precedence), or None."""
        if leaf in self.columns:
            return "column"
        if leaf in self.measures:
            return "measure"
        if leaf in self.aggregations:
            return "aggregation"
        return None

    def leaf_names(self) -> set[str]:
        return set(self.columns) | self.measures | self.aggregations


@dataclass(frozen=True)
class DatasourceInfo:
    name: str
    hidden: bool = False
    models: Mapping[str, ModelInfo] = field(default_factory=dict)


@dataclass(frozen=True)
class CatalogSnapshot:
    """One tenant's catalog, read-only. Lookup indexes are built lazily on first use, once.

    Construct directly from :class:`DatasourceInfo` objects, or with :meth:`from_dicts`
    (nested plain data) or :meth:`from_rows` (flat tuples, as a SQL query returns them).
    """

    datasources: Mapping[str, DatasourceInfo] = field(default_factory=dict)

    # -- builders ----------------------------------------------------------

    @classmethod
    def from_dicts(cls, datasources: Iterable[Mapping[str, Any]]) -> CatalogSnapshot:
        """Build from ``[{"name", "hidden"?, "models": [model]}]``.

        A model is ``{"name", "hidden"?, "columns": [str | {"name", "hidden"?}],
        "measures": [str | {"name"}], "aggregations": [str | {"name"}],
        "foreign_keys": [{"column", "target_model", "target_datasource"?}]}``;
        ``target_datasource`` defaults to the model's own datasource. Extra keys are ignored.
        """
        built: dict[str, DatasourceInfo] = {}
        for ds_spec in datasources:
            ds_name = ds_spec["name"]
            models: dict[str, ModelInfo] = {}
            for m in ds_spec.get("models", ()):
                columns = {}
                for c in m.get("columns", ()):
                    col = _column(c)
                    columns[col.name] = col
                models[m["name"]] = ModelInfo(
                    datasource=ds_name,
                    name=m["name"],
                    hidden=bool(m.get("hidden", False)),
                    columns=columns,
                    measures=frozenset(_names(m.get("measures", ()))),
                    aggregations=frozenset(_names(m.get("aggregations", ()))),
                    foreign_keys=tuple(
                        ForeignKey(
                            column=fk["column"],
                            target=ModelKey(fk.get("target_datasource") or ds_name, fk["target_model"]),
                        )
                        for fk in m.get("foreign_keys", ())
                    ),
                )
            built[ds_name] = DatasourceInfo(ds_name, bool(ds_spec.get("hidden", False)), models)
        return cls(datasources=built)

    @classmethod
    def from_rows(
        cls,
        *,
        datasources: Iterable[tuple[str, bool]],
        models: Iterable[tuple[str, str, bool]] = (),
        columns: Iterable[tuple[str, str, str, bool]] = (),
        measures: Iterable[tuple[str, str, str]] = (),
        aggregations: Iterable[tuple[str, str, str]] = (),
        foreign_keys: Iterable[tuple[str, str, str, str, str]] = (),
    ) -> CatalogSnapshot:
        """Build from flat rows: ``(ds, hidden)``, ``(ds, model, hidden)``, ``(ds, model, column, hidden)``,
        ``(ds, model, measure)``, ``(ds, model, aggregation)``,
        ``(ds, model, column, target_ds, target_model)``. Rows naming an unknown parent are ignored.
        """
        ds_rows = list(datasources)
        cols: dict[ModelKey, dict[str, ColumnInfo]] = defaultdict(dict)
        for ds, model, column, hidden in columns:
            cols[ModelKey(ds, model)][column] = ColumnInfo(column, hidden)
        leaves: dict[str, dict[ModelKey, set[str]]] = {
            "measures": defaultdict(set),
            "aggregations": defaultdict(set),
        }
        for kind, rows in (("measures", measures), ("aggregations", aggregations)):
            for ds, model, name in rows:
                leaves[kind][ModelKey(ds, model)].add(name)
        fks: dict[ModelKey, list[ForeignKey]] = defaultdict(list)
        for ds, model, column, target_ds, target_model in foreign_keys:
            fks[ModelKey(ds, model)].append(ForeignKey(column, ModelKey(target_ds, target_model)))
        by_ds: dict[str, dict[str, ModelInfo]] = {name: {} for name, _ in ds_rows}
        for ds, model, hidden in models:
            key = ModelKey(ds, model)
            if ds in by_ds:
                by_ds[ds][model] = ModelInfo(
                    datasource=ds,
                    name=model,
                    hidden=hidden,
                    columns=cols.get(key, {}),
                    measures=frozenset(leaves["measures"].get(key, ())),
                    aggregations=frozenset(leaves["aggregations"].get(key, ())),
                    foreign_keys=tuple(fks.get(key, ())),
                )
        return cls(datasources={name: DatasourceInfo(name, hidden, by_ds[name]) for name, hidden in ds_rows})

    # -- point lookups (no index needed) -------------------------------------

    def model(self, key: ModelKey) -> ModelInfo | None:
        ds = self.datasources.get(key.datasource)
        return None if ds is None else ds.models.get(key.model)

    def kind_of(self, canonical_id: str) -> str | None:
        """``datasource`` / ``model`` / ``column`` / ``measure`` / ``aggregation``, or None when absent."""
        try:
            ds, model_name, leaf = split_canonical(canonical_id)
        except ValueError:
            return None
        ds_info = self.datasources.get(ds)
        if ds_info is None:
            return None
        if model_name is None:
            return "datasource"
        model = ds_info.models.get(model_name)
        if model is None:
            return None
        return "model" if leaf is None else model.leaf_kind(leaf)

    def contains(self, canonical_id: str) -> bool:
        return self.kind_of(canonical_id) is not None

    def is_hidden(self, canonical_id: str) -> bool:
        """True when the entity or an ancestor (datasource, model) is hidden; columns have their own flag."""
        try:
            ds, model_name, leaf = split_canonical(canonical_id)
        except ValueError:
            return False
        ds_info = self.datasources.get(ds)
        if ds_info is None:
            return False
        if ds_info.hidden:
            return True
        model = ds_info.models.get(model_name) if model_name else None
        if model is None:
            return False
        if model.hidden:
            return True
        column = model.columns.get(leaf) if leaf else None
        return column is not None and column.hidden

    # -- indexes for name-based resolution -----------------------------------

    @cached_property
    def models_by_name(self) -> dict[str, tuple[ModelKey, ...]]:
        """Model name -> every (ds, model) carrying it, in catalog order."""
        index: dict[str, list[ModelKey]] = {}
        for ds in self.datasources.values():
            for model in ds.models.values():
                index.setdefault(model.name, []).append(model.key)
        return {name: tuple(keys) for name, keys in index.items()}

    @cached_property
    def leaf_owners(self) -> dict[str, tuple[ModelKey, ...]]:
        """Leaf name -> every (ds, model) having a column, measure or aggregation of that name."""
        index: dict[str, list[ModelKey]] = {}
        for ds in self.datasources.values():
            for model in ds.models.values():
                for leaf in model.leaf_names():
                    index.setdefault(leaf, []).append(model.key)
        return {name: tuple(keys) for name, keys in index.items()}

    @cached_property
    def _join_index(self) -> tuple[dict[ModelKey, dict[str, list[ModelKey]]], ...]:
        # Three tiers, tried in order: forward by target model name, forward by FK column name
        # (``customer_id`` and ``customer``), reverse by the referencing model's name.
        by_target: dict[ModelKey, dict[str, list[ModelKey]]] = {}
        by_column: dict[ModelKey, dict[str, list[ModelKey]]] = {}
        reverse: dict[ModelKey, dict[str, list[ModelKey]]] = {}
        for ds in self.datasources.values():
            for model in ds.models.values():
                for fk in model.foreign_keys:
                    _append_unique(by_target, model.key, fk.target.model, fk.target)
                    _append_unique(by_column, model.key, fk.column, fk.target)
                    if fk.column.endswith("_id") and len(fk.column) > 3:
                        _append_unique(by_column, model.key, fk.column[:-3], fk.target)
                    _append_unique(reverse, fk.target, model.name, model.key)
        return by_target, by_column, reverse

    def join_target(self, *, source: ModelKey, token: str) -> ModelKey | None:
        """The model reached from ``source`` by the join hop ``token``, or None.

        A hop names a model joined by a foreign key in either direction (or the FK column);
        among several candidates the one in ``source``'s datasource wins, otherwise the hop is
        ambiguous and None is returned.
        """
        for tier in self._join_index:
            targets = [t for t in tier.get(source, {}).get(token, ()) if self.model(t) is not None]
            if not targets:
                continue
            if len(targets) > 1:
                targets = [t for t in targets if t.datasource == source.datasource]
            return targets[0] if len(targets) == 1 else None
        return None


def _column(spec: str | Mapping[str, Any]) -> ColumnInfo:
    return ColumnInfo(spec) if isinstance(spec, str) else ColumnInfo(spec["name"], bool(spec.get("hidden")))


def _names(items: Iterable[str | Mapping[str, Any]]) -> Iterable[str]:
    return (item if isinstance(item, str) else item["name"] for item in items)


def _append_unique(
    index: dict[ModelKey, dict[str, list[ModelKey]]], source: ModelKey, token: str, target: ModelKey
) -> None:
    bucket = index.setdefault(source, {}).setdefault(token, [])
    if target not in bucket:
        bucket.append(target)
