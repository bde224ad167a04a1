"""Resolve user-supplied entity references to canonical entity strings against a catalog snapshot.

Inputs may be canonical already (``mydb.orders.amount``), model-qualified (``orders.amount``),
bare (``amount``, ``orders``, ``mydb``), ``memory:<id>``, carry aggregation suffixes
(``amount:sum``, ``revenue:weighted_avg(weight=qty)``), be ``*:count`` / ``orders.*:count`` (the
model), or walk joins (``orders.customers.regions.name`` -> the first model and the leaf).
Save uses strict mode (failures become :class:`EntityError`); search and inline queries use
lenient mode (failures become warnings and the input is dropped).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from core.entities.canonical import (
    MODEL_WILDCARD,
    CatalogSnapshot,
    ModelKey,
    is_memory_ref,
    is_valid_memory_id,
    memory_id_of,
    rooted_in,
    split_aggregation,
)


@dataclass(frozen=True)
class EntityError:
    input: str
    message: str
    candidates: list[str] = field(default_factory=list)


@dataclass
class Resolution:
    entities: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[EntityError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def _add(self, entities: Iterable[str]) -> None:
        for entity in entities:
            if entity not in self.entities:
                self.entities.append(entity)

    def _warn(self, warnings: Iterable[str]) -> None:
        for warning in warnings:
            if warning not in self.warnings:
                self.warnings.append(warning)


@dataclass(frozen=True)
class _Outcome:
    entities: tuple[str, ...] = ()
    error: str | None = None
    candidates: tuple[str, ...] = ()
    unknown: bool = False  # "names nothing" as opposed to ambiguous / malformed: worth suggesting
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Context:
    snapshot: CatalogSnapshot
    default_datasource: str | None = None
    memory_exists: Callable[[str], bool] | None = None
    source: ModelKey | None = None  # the query's source_model: field refs resolve against it first


def _fail(message: str, *, candidates: Sequence[str] = (), unknown: bool = False) -> _Outcome:
    return _Outcome(error=message, candidates=tuple(candidates), unknown=unknown)


# --- Public API ---


def resolve_entities(
    snapshot: CatalogSnapshot,
    items: Sequence[str],
    *,
    strict: bool,
    default_datasource: str | None = None,
    memory_exists: Callable[[str], bool] | None = None,
) -> Resolution:
    """Resolve entity strings; canonical results are deduped in input order.

    Strict: unknown or ambiguous inputs become errors naming candidates (ambiguity) or close
    matches (unknown names). Lenient: they become warnings and are dropped. ``memory:<id>`` is
    valid when ``memory_exists(id)`` (always, when it is None). Among equally good candidates,
    those in ``default_datasource`` win.
    """
    ctx = _Context(snapshot, default_datasource, memory_exists)
    result = Resolution()
    for item in items:
        if not isinstance(item, str):
            outcome = _fail(f"entity references are strings, got {type(item).__name__}")
        else:
            outcome = _resolve_one(item, ctx)
        result._warn(outcome.notes)
        if outcome.error is None:
            result._add(outcome.entities)
        elif strict:
            candidates = list(outcome.candidates)
            if outcome.unknown and not candidates:
                candidates = _suggest(snapshot, item)
            result.errors.append(EntityError(input=str(item), message=outcome.error, candidates=candidates))
        else:
            result._warn([f"entity '{item}' dropped: {outcome.error}"])
    return result


def extract_query_entities(
    snapshot: CatalogSnapshot, query: Mapping[str, Any], *, default_datasource: str | None = None
) -> Resolution:
    """Leniently extract the canonical entities an inline query references, source model first.

    Walks ``source_model``, ``dimensions``, ``time_dimensions``, ``measures`` (formulas) and
    ``filters``. Field references resolve against the source model before the whole catalog, and
    dotted ones follow its joins. In filters, bare words count only when they are leaves of the
    source model (anything else may be SQL); dotted or aggregated filter tokens resolve fully.
    """
    ctx = _Context(snapshot, default_datasource)
    result = Resolution()
    source_ref = _source_model_ref(query.get("source_model"))
    if source_ref is None:
        result._warn(["query has no source_model; its fields are resolved against the whole catalog"])
    else:
        key, warning = _resolve_source_model(source_ref, ctx)
        if key is None:
            result._warn([warning])
        else:
            ctx = replace(ctx, source=key)
            result._add([key.canonical])

    def lenient(token: str) -> None:
        outcome = _resolve_one(token, ctx)
        result._warn(outcome.notes)
        if outcome.error is None:
            result._add(outcome.entities)
        else:
            result._warn([f"entity '{token}' dropped: {outcome.error}"])

    for key_name in ("dimensions", "time_dimensions"):
        for item in _as_list(query.get(key_name)):
            ref = _field_ref(item, nested="dimension" if key_name == "time_dimensions" else None)
            if ref is None:
                result._warn([f"{key_name} item {item!r} ignored: not a field reference"])
            else:
                lenient(ref)

    def from_text(text: str, *, bare_words_must_be_leaves: bool) -> None:
        # A bare SQL word (`date`, `order`) counts only as a leaf of the source model; in filters
        # every bare word does, since a filter may hold any SQL the extractor does not know.
        for token in formula_tokens(text, sql_words=True):
            if "." in token or ":" in token or not (bare_words_must_be_leaves or token.lower() in _SQL_WORDS):
                lenient(token)
            elif ctx.source is not None and _leaf_on(snapshot, ctx.source, token):
                result._add([ctx.source.leaf(token)])

    for item in _as_list(query.get("measures")):
        formula = item.get("formula") if isinstance(item, Mapping) else None
        text = formula if isinstance(formula, str) else _field_ref(item)
        if text is None:
            result._warn([f"measures item {item!r} ignored: no formula or field"])
        else:
            from_text(text, bare_words_must_be_leaves=False)
    for text in _as_list(query.get("filters")):
        if isinstance(text, str):
            from_text(text, bare_words_must_be_leaves=True)
        else:
            result._warn([f"filters item {text!r} ignored: filters are strings"])
    return result


def stale_references(snapshot: CatalogSnapshot, entities: Iterable[str]) -> list[str]:
    """Catalog entities (memory refs excluded) absent from ``snapshot``, deduped in order."""
    stale: list[str] = []
    for entity in entities:
        if not is_memory_ref(entity) and not snapshot.contains(entity) and entity not in stale:
            stale.append(entity)
    return stale


def is_hidden(snapshot: CatalogSnapshot, canonical: str) -> bool:
    """True when a hidden datasource, model or column covers ``canonical``; search never surfaces these."""
    return snapshot.is_hidden(canonical)


# --- Formula and filter tokens ---

_LITERAL_RE = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|\{[^}]*\}")
# A (dotted) identifier, or a model wildcard, with an optional aggregation suffix whose parameters
# are consumed as opaque. The lookbehind keeps ``x::date`` casts and ``1e5`` numbers out.
_TOKEN_RE = re.compile(r"(?<![\w.:])(?:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\.\*(?=:))?|\*(?=:))(?::\w+(?:\([^()]*\))?)?")
_SQL_WORDS = frozenset(
    "and or not is null in like ilike between true false case when then else end exists as asc desc "
    "distinct interval date time timestamp from select where any all some over partition by order "
    "filter with within group".split()
)


def formula_tokens(text: str, *, sql_words: bool = False) -> list[str]:
    """Entity-shaped tokens of a measure formula or filter, literals and function names excluded
    (SQL keywords too, unless ``sql_words``).

    ``"amount:sum / *:count"`` -> ``["amount:sum", "*:count"]``;
    ``"coalesce(status, 'x') = 'paid'"`` -> ``["status"]``.
    """
    cleaned = _LITERAL_RE.sub(" ", text)
    tokens: list[str] = []
    for match in _TOKEN_RE.finditer(cleaned):
        token = match.group(0)
        is_call = cleaned[match.end() :].lstrip().startswith("(")
        if ":" not in token and (is_call or (not sql_words and token.lower() in _SQL_WORDS)):
            continue
        if token not in tokens:
            tokens.append(token)
    return tokens


# --- Resolution of one reference ---


def _resolve_one(raw: str, ctx: _Context) -> _Outcome:
    raw = raw.strip()
    if not raw:
        return _fail("entity reference is empty")
    if is_memory_ref(raw):
        return _resolve_memory(raw, ctx)
    try:
        target, aggregation = split_aggregation(raw)
    except ValueError as exc:
        return _fail(str(exc))
    if target == MODEL_WILDCARD or target.endswith("." + MODEL_WILDCARD):
        # Only a row count makes sense over "every column"; `*:sum` would tag the model by accident.
        if aggregation != "count":
            return _fail(f"'{raw}' is not an entity reference; use '*:count' or '<model>.*:count'")
        if target == MODEL_WILDCARD:
            if ctx.source is None:
                return _fail("'*:count' needs a model: write '<model>.*:count'")
            return _Outcome(entities=(ctx.source.canonical,))
        outcome = _resolve_path(target[: -len(".*")], ctx)
        if outcome.error is None and ctx.snapshot.kind_of(outcome.entities[-1]) != "model":
            return _fail(f"'{target[:-2]}' in '{raw}' is not a model")
        return outcome
    return _resolve_path(target, ctx)


def _resolve_memory(raw: str, ctx: _Context) -> _Outcome:
    memory_id = memory_id_of(raw)
    if not is_valid_memory_id(memory_id):
        return _fail(f"'{memory_id}' is not a valid memory id")
    if ctx.memory_exists is not None and not ctx.memory_exists(memory_id):
        return _fail(f"No memory with id '{memory_id}'")
    return _Outcome(entities=(raw,))


def _resolve_path(target: str, ctx: _Context) -> _Outcome:
    snapshot = ctx.snapshot
    segments = target.split(".")
    if not all(segments):
        return _fail(f"'{target}' has an empty segment")
    if ctx.source is not None:
        relative = _relative(segments, ctx)
        if relative is not None:
            return _Outcome(entities=relative)
    if len(segments) == 1:
        return _resolve_bare(target, ctx)
    if snapshot.contains(target):
        return _Outcome(entities=(target,))
    head, rest = segments[0], segments[1:]
    starts: list[tuple[ModelKey, list[str]]] = []
    qualified = head in snapshot.datasources and snapshot.model(ModelKey(head, rest[0])) is not None
    if qualified:
        starts.append((ModelKey(head, rest[0]), rest[1:]))
    starts += [(key, rest) for key in snapshot.models_by_name.get(head, ())]
    candidates: list[tuple[str, ...]] = []
    for index, (key, path) in enumerate(starts):
        found = _walk(snapshot, key, path)
        if found is not None and index == 0 and qualified:
            return _Outcome(entities=found)  # a datasource-qualified reading beats a model named <ds>
        if found is not None:
            candidates.append(found)
    if candidates:
        return _choose(target, candidates, ctx)
    # The join path cannot be followed from the first model; keep that model and find the leaf's
    # model by name, so a catalog without declared foreign keys still canonicalises the path.
    for key, path in starts:
        if len(path) >= 2:
            model_name, leaf = path[-2], path[-1]
            owners = snapshot.models_by_name.get(model_name, ())
            candidates += [(key.canonical, o.leaf(leaf)) for o in owners if _leaf_on(snapshot, o, leaf)]
    outcome = _choose(target, candidates, ctx)
    if outcome.error is None:
        note = f"'{target}': join path not found along foreign keys; matched its leaf by model name"
        outcome = replace(outcome, notes=(note,))
    return outcome


def _resolve_bare(name: str, ctx: _Context) -> _Outcome:
    """A bare name is a datasource, else a model, else a leaf; shadowed readings are reported."""
    snapshot = ctx.snapshot
    models = snapshot.models_by_name.get(name, ())
    owners = snapshot.leaf_owners.get(name, ())
    if name in snapshot.datasources:
        note = f"'{name}' is a datasource and also a model or leaf name; resolved as the datasource"
        return _Outcome(entities=(name,), notes=(note,) if models or owners else ())
    if models:
        outcome = _choose(name, [(key.canonical,) for key in models], ctx)
        if outcome.error is None and owners:
            note = f"'{name}' is a model and also a leaf name; resolved as the model (write <model>.{name})"
            outcome = replace(outcome, notes=(note,))
        return outcome
    return _choose(name, [(key.leaf(name),) for key in owners], ctx)


def _relative(segments: list[str], ctx: _Context) -> tuple[str, ...] | None:
    """Resolve against the query's source model: ``amount``, ``orders.amount``, ``customers.name``."""
    source = ctx.source
    assert source is not None
    if len(segments) > 1 and segments[0] == source.model:
        found = _walk(ctx.snapshot, source, segments[1:])
        if found is not None:
            return found
    found = _walk(ctx.snapshot, source, segments)
    # `orders.*:count` in a query on orders names the source even when `orders` is ambiguous globally.
    return (source.canonical,) if found is None and segments == [source.model] else found


def _walk(snapshot: CatalogSnapshot, start: ModelKey, rest: Sequence[str]) -> tuple[str, ...] | None:
    """Apply ``rest`` (join hops, then an optional leaf) to ``start``.

    ``[]`` is the model itself; ``[leaf]`` its leaf; with hops the result is the first model plus
    the leaf (or the last joined model), intermediate hops dropped.
    """
    if snapshot.model(start) is None:
        return None
    if not rest:
        return (start.canonical,)
    reached = start
    for hop in rest[:-1]:
        next_model = snapshot.join_target(source=reached, token=hop)
        if next_model is None:
            return None
        reached = next_model
    if _leaf_on(snapshot, reached, rest[-1]):
        leaf_id = reached.leaf(rest[-1])
        return (leaf_id,) if len(rest) == 1 else (start.canonical, leaf_id)
    joined = snapshot.join_target(source=reached, token=rest[-1])
    return None if joined is None else (start.canonical, joined.canonical)


def _leaf_on(snapshot: CatalogSnapshot, key: ModelKey, leaf: str) -> bool:
    model = snapshot.model(key)
    return model is not None and model.leaf_kind(leaf) is not None


def _choose(raw: str, candidates: list[tuple[str, ...]], ctx: _Context) -> _Outcome:
    """One candidate wins; several are narrowed to those rooted (first entity) at the default
    datasource, else ambiguous."""
    unique = list(dict.fromkeys(candidates))
    if not unique:
        return _fail(f"'{raw}' names no datasource, model, column, measure or aggregation", unknown=True)
    if len(unique) > 1 and ctx.default_datasource:
        preferred = [c for c in unique if rooted_in(entity=c[0], datasource=ctx.default_datasource)]
        unique = preferred or unique
    if len(unique) == 1:
        return _Outcome(entities=unique[0])
    # Name a candidate by its distinguishing last entity unless two share it.
    labels = [c[-1] for c in unique]
    if len(set(labels)) < len(labels):
        labels = [" + ".join(c) for c in unique]
    return _fail(f"'{raw}' is ambiguous: it matches {', '.join(labels)}; qualify it", candidates=labels)


def _suggest(snapshot: CatalogSnapshot, raw: str, *, limit: int = 5) -> list[str]:
    """Close matches for an unknown input, as canonical ids (strict mode only: it scans every name)."""
    try:
        name = split_aggregation(raw)[0].rsplit(".", 1)[-1]
    except ValueError:
        return []
    pool = set(snapshot.datasources) | set(snapshot.models_by_name) | set(snapshot.leaf_owners)
    suggestions: list[str] = []
    for close in difflib.get_close_matches(name, pool, n=limit, cutoff=0.75):
        if close in snapshot.datasources:
            suggestions.append(close)
        suggestions += [key.canonical for key in snapshot.models_by_name.get(close, ())]
        suggestions += [key.leaf(close) for key in snapshot.leaf_owners.get(close, ())]
    return list(dict.fromkeys(suggestions))[:limit]


# --- Query helpers ---


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _field_ref(item: Any, *, nested: str | None = None) -> str | None:
    """``"status"``, ``{"name": "status"}``, ``{"field": ...}``, ``{"name": "region", "model": "customers"}``,
    or (time dimensions) ``{"dimension": "created_at" | {...}, "granularity": ...}``."""
    if isinstance(item, str):
        return item
    if not isinstance(item, Mapping):
        return None
    if nested and nested in item:
        return _field_ref(item[nested])
    name = item.get("field") or item.get("name")
    if not isinstance(name, str):
        return None
    model = item.get("model")
    return f"{model}.{name}" if isinstance(model, str) and model else name


def _source_model_ref(source: Any) -> str | None:
    if isinstance(source, str) and source.strip():
        return source.strip()
    if isinstance(source, Mapping) and isinstance(source.get("name"), str):
        ds = source.get("datasource") or source.get("data_source")
        return f"{ds}.{source['name']}" if isinstance(ds, str) and ds else source["name"]
    return None


def _resolve_source_model(ref: str, ctx: _Context) -> tuple[ModelKey | None, str]:
    """The source model must be a model: ``orders`` or ``mydb.orders``; returns (key, warning)."""
    snapshot = ctx.snapshot
    if snapshot.kind_of(ref) == "model":
        ds, model = ref.split(".")
        return ModelKey(ds, model), ""
    outcome = _choose(ref, [(key.canonical,) for key in snapshot.models_by_name.get(ref, ())], ctx)
    if outcome.error is not None:
        message = outcome.error if not outcome.unknown else f"no model named '{ref}'"
        return None, f"source_model '{ref}' dropped: {message}"
    ds, model = outcome.entities[0].split(".")
    return ModelKey(ds, model), ""
