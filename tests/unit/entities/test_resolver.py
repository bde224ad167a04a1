"""Entity resolution rules (CONTRACT §3, §4 linked_entities, §6; reference/memories.md, search.md)."""

from __future__ import annotations

from typing import Any

import pytest

from core.entities.canonical import CatalogSnapshot
from core.entities.resolver import (
    EntityError,
    Resolution,
    extract_query_entities,
    formula_tokens,
    is_hidden,
    resolve_entities,
    stale_references,
)

# mydb.orders joins mydb.customers, which joins geo.regions in another datasource; `orders`
# also exists in shop; `amount` is a column of two models; `name` of two models in two datasources.
SNAPSHOT = CatalogSnapshot.from_dicts(
    [
        {
            "name": "mydb",
            "models": [
                {
                    "name": "orders",
                    "columns": ["id", "amount", "status", "revenue", "qty", "created_at", "customer_id"],
                    "measures": ["aov"],
                    "aggregations": ["weighted_median"],
                    "foreign_keys": [{"column": "customer_id", "target_model": "customers"}],
                },
                {"name": "orders_archive", "columns": ["id", "amount", "status"]},
                {
                    "name": "customers",
                    "columns": ["id", "name", "region_id", {"name": "ssn", "hidden": True}],
                    "foreign_keys": [
                        {"column": "region_id", "target_datasource": "geo", "target_model": "regions"}
                    ],
                },
                {"name": "internal", "hidden": True, "columns": ["secret"]},
            ],
        },
        {"name": "geo", "models": [{"name": "regions", "columns": ["id", "name", "country"]}]},
        {"name": "shop", "models": [{"name": "orders", "columns": ["id", "total"]}]},
    ]
)
MEMORIES = {"42", "kb.policy.42"}


def strict(items: list[str], **kwargs: Any) -> Resolution:
    return resolve_entities(SNAPSHOT, items, strict=True, memory_exists=MEMORIES.__contains__, **kwargs)


def lenient(items: list[str], **kwargs: Any) -> Resolution:
    return resolve_entities(SNAPSHOT, items, strict=False, memory_exists=MEMORIES.__contains__, **kwargs)


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["mydb.orders.amount"], ["mydb.orders.amount"]),
        (["orders.amount"], ["mydb.orders.amount"]),
        (["orders.total"], ["shop.orders.total"]),
        (["aov"], ["mydb.orders.aov"]),
        (["weighted_median"], ["mydb.orders.weighted_median"]),
        (["customers"], ["mydb.customers"]),
        (["orders_archive"], ["mydb.orders_archive"]),
        (["mydb"], ["mydb"]),
        (["mydb.orders"], ["mydb.orders"]),
        (["memory:42"], ["memory:42"]),
        (["memory:kb.policy.42"], ["memory:kb.policy.42"]),
        (["  mydb.orders.status  "], ["mydb.orders.status"]),
    ],
)
def test_input_forms_resolve(items: list[str], expected: list[str]) -> None:
    """Canonical, model-qualified (datasource found from the model having the leaf), bare leaf,
    bare model, datasource and memory:<id> inputs resolve to canonical form (memories.md)."""
    result = strict(items)
    assert result.errors == []
    assert result.entities == expected


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["revenue:sum"], ["mydb.orders.revenue"]),
        (["revenue:weighted_avg(weight=qty)"], ["mydb.orders.revenue"]),
        (["revenue:corr(other=qty)"], ["mydb.orders.revenue"]),
        (["mydb.orders.amount:sum", "orders.amount:avg"], ["mydb.orders.amount"]),
        (["mydb.orders.revenue:weighted_avg(weight=qty)"], ["mydb.orders.revenue"]),
        (["sum(revenue)"], ["mydb.orders.revenue"]),
        (["orders_archive.*:count"], ["mydb.orders_archive"]),
        (["mydb.orders.*:count"], ["mydb.orders"]),
        (["shop.orders.*:count"], ["shop.orders"]),
    ],
)
def test_aggregation_suffixes_strip_and_star_count_is_the_model(
    items: list[str], expected: list[str]
) -> None:
    """Aggregation suffixes are stripped and their parameters are never entities (`qty` is not
    tagged); `<model>.*:count` collapses to the model (CONTRACT §3)."""
    result = strict(items)
    assert result.errors == []
    assert result.entities == expected


def test_amount_sum_alone_is_ambiguous_like_bare_amount() -> None:
    """Stripping the suffix leaves the bare name, which follows the bare-name rule (ambiguous here)."""
    assert strict(["amount:sum"]).errors[0].candidates == ["mydb.orders.amount", "mydb.orders_archive.amount"]


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["orders.customers.regions.name"], ["mydb.orders", "geo.regions.name"]),
        (["mydb.orders.customers.name"], ["mydb.orders", "mydb.customers.name"]),
        (["orders.customer_id.name"], ["mydb.orders", "mydb.customers.name"]),
        (["customers.regions"], ["mydb.customers", "geo.regions"]),
        (["regions.customers.name"], ["geo.regions", "mydb.customers.name"]),
        (["orders.customers.regions.name:count"], ["mydb.orders", "geo.regions.name"]),
    ],
)
def test_join_paths_keep_the_first_model_and_the_leaf(items: list[str], expected: list[str]) -> None:
    """Multi-hop paths keep the first model and the leaf, intermediate hops dropped; hops follow
    foreign keys in either direction and the leaf's model may be in another datasource (CONTRACT §3)."""
    result = strict(items)
    assert result.errors == []
    assert result.entities == expected


def test_unfollowable_join_path_falls_back_to_the_leaf_model_by_name() -> None:
    """When no foreign key links the hops, the first model is kept and the leaf is found by its
    model's name, with a warning saying the path was not followed."""
    result = strict(["shop.orders.customers.regions.country"])
    assert result.errors == []
    assert result.entities == ["shop.orders", "geo.regions.country"]
    assert any("join path" in w for w in result.warnings)


def test_results_are_deduped_in_input_order() -> None:
    """Equality is string equality on the canonical form, so different spellings of one entity
    collapse to one entry, first occurrence first (CONTRACT §3)."""
    result = strict(["memory:42", "revenue:sum", "mydb.orders.revenue", "revenue:avg", "memory:42", "aov"])
    assert result.entities == ["memory:42", "mydb.orders.revenue", "mydb.orders.aov"]


@pytest.mark.parametrize(
    ("item", "candidates"),
    [
        ("amount", ["mydb.orders.amount", "mydb.orders_archive.amount"]),
        ("name", ["mydb.customers.name", "geo.regions.name"]),
        ("orders", ["mydb.orders", "shop.orders"]),
        (
            "id:count",
            [
                "mydb.orders.id",
                "mydb.orders_archive.id",
                "mydb.customers.id",
                "geo.regions.id",
                "shop.orders.id",
            ],
        ),
    ],
)
def test_ambiguous_strict_is_an_error_naming_candidates(item: str, candidates: list[str]) -> None:
    """Strict (save): an ambiguous bare name fails naming every candidate (CONTRACT §3: 422)."""
    result = strict([item])
    assert result.entities == []
    assert result.errors == [EntityError(input=item, message=result.errors[0].message, candidates=candidates)]
    assert all(c in result.errors[0].message for c in candidates)


@pytest.mark.parametrize(
    ("item", "candidates"),
    [
        ("amount", ["mydb.orders.amount", "mydb.orders_archive.amount"]),
        ("orders", ["mydb.orders", "shop.orders"]),
    ],
)
def test_ambiguous_lenient_is_a_warning_naming_input_and_candidates(item: str, candidates: list[str]) -> None:
    """Lenient (search): an unresolved input becomes a warning naming it and its candidates, and is
    dropped while the rest still resolves (search.md, Lenient input validation)."""
    result = lenient([item, "aov"])
    assert result.errors == []
    assert result.entities == ["mydb.orders.aov"]
    assert len(result.warnings) == 1
    assert f"'{item}'" in result.warnings[0]
    assert all(c in result.warnings[0] for c in candidates)


@pytest.mark.parametrize(
    ("item", "message_part"),
    [
        ("memory:421", "No memory with id '421'"),
        ("memory:a b", "not a valid memory id"),
        ("memory:", "not a valid memory id"),
        ("nope", "names no"),
        ("mydb.nope.amount", "names no"),
        ("mydb.orders.nope", "names no"),
        ("mydb.orders.amount.x", "names no"),
        ("*:count", "needs a model"),
        ("orders.*:sum", "'*:count'"),
        ("mydb.*:count", "not a model"),
        ("", "empty"),
        ("revenue:", "malformed"),
        ("mydb..orders", "empty segment"),
    ],
)
def test_unknown_or_malformed_inputs(item: str, message_part: str) -> None:
    """Strict: unknown segments, unknown memories and malformed refs are errors; lenient: the same
    inputs are warnings naming the input and are dropped (memories.md, search.md)."""
    result = strict([item])
    assert result.entities == []
    assert [e.input for e in result.errors] == [item]
    assert message_part in result.errors[0].message
    relaxed = lenient([item])
    assert relaxed.errors == [] and relaxed.entities == []
    assert relaxed.warnings == [f"entity '{item}' dropped: {result.errors[0].message}"]


def test_memory_ref_matches_exactly() -> None:
    """memory:42 exists, memory:421 does not: a memory ref is checked as a whole id, never a prefix."""
    result = lenient(["memory:42", "memory:421"])
    assert result.entities == ["memory:42"]
    assert result.warnings == ["entity 'memory:421' dropped: No memory with id '421'"]


def test_memory_refs_are_accepted_without_an_existence_check() -> None:
    """Without memory_exists every well-formed memory ref is valid (the caller checks later)."""
    assert resolve_entities(SNAPSHOT, ["memory:999"], strict=True).entities == ["memory:999"]


def test_unknown_name_suggests_close_matches_in_strict_mode() -> None:
    """An unknown name fails with close matches as candidates, so the 422 helps fix the typo."""
    error = strict(["amout"]).errors[0]
    assert "mydb.orders.amount" in error.candidates


@pytest.mark.parametrize(
    ("item", "default", "expected"),
    [
        ("orders", "shop", ["shop.orders"]),
        ("orders", "mydb", ["mydb.orders"]),
        ("name", "geo", ["geo.regions.name"]),
        ("orders.id", "shop", ["shop.orders.id"]),
        ("orders.customers.regions.name", "mydb", ["mydb.orders", "geo.regions.name"]),
    ],
)
def test_default_datasource_breaks_ties(item: str, default: str, expected: list[str]) -> None:
    """Among several candidates, those rooted at the default datasource win (a join path is rooted
    where its first model is, even when its leaf lives in another datasource)."""
    assert strict([item], default_datasource=default).entities == expected


def test_default_datasource_cannot_break_a_tie_inside_itself() -> None:
    """Two candidates in the default datasource stay ambiguous."""
    assert strict(["amount"], default_datasource="mydb").errors[0].candidates == [
        "mydb.orders.amount",
        "mydb.orders_archive.amount",
    ]


@pytest.mark.parametrize(
    ("items", "expected"),
    [(["mydb.customers.ssn"], ["mydb.customers.ssn"]), (["internal.secret"], ["mydb.internal.secret"])],
)
def test_hidden_entities_resolve_for_saving(items: list[str], expected: list[str]) -> None:
    """Hidden models/columns still exist, so saving against them works; search filters them."""
    assert strict(items).entities == expected


@pytest.mark.parametrize(
    ("canonical", "hidden"),
    [
        ("mydb.customers.ssn", True),
        ("mydb.internal", True),
        ("mydb.internal.secret", True),
        ("mydb.customers.name", False),
        ("mydb.orders", False),
        ("memory:42", False),
    ],
)
def test_is_hidden(canonical: str, hidden: bool) -> None:
    """Hidden models and hidden columns never surface in search (search.md)."""
    assert is_hidden(SNAPSHOT, canonical) is hidden


def test_bare_name_collisions_prefer_datasource_then_model_with_a_warning() -> None:
    """A bare name is read as a datasource before a model before a leaf; the shadowed reading is
    reported in a warning rather than failing."""
    snapshot = CatalogSnapshot.from_dicts(
        [
            {"name": "sales", "models": [{"name": "events", "columns": ["sales"]}]},
            {"name": "crm", "models": [{"name": "contacts", "columns": ["events"]}]},
        ]
    )
    as_ds = resolve_entities(snapshot, ["sales"], strict=True)
    assert as_ds.entities == ["sales"] and len(as_ds.warnings) == 1
    as_model = resolve_entities(snapshot, ["events"], strict=True)
    assert as_model.entities == ["sales.events"] and len(as_model.warnings) == 1
    assert resolve_entities(snapshot, ["contacts.events"], strict=True).entities == ["crm.contacts.events"]


def test_non_string_items_are_errors() -> None:
    """Entity lists hold strings; anything else is an error, not a crash."""
    result = resolve_entities(SNAPSHOT, [42], strict=True)  # type: ignore[list-item]
    assert result.errors[0].input == "42"


# ---------------------------------------------------------------------------
# Inline queries (lenient)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            {
                "source_model": "mydb.orders",
                "measures": [{"formula": "amount:sum"}],
                "filters": ["status = 'paid'"],
            },
            ["mydb.orders", "mydb.orders.amount", "mydb.orders.status"],
        ),
        (
            {
                "source_model": "orders_archive",
                "dimensions": ["amount"],
                "measures": ["amount:sum", "*:count"],
            },
            ["mydb.orders_archive", "mydb.orders_archive.amount"],
        ),
        (
            {
                "source_model": "mydb.orders",
                "dimensions": [{"name": "status"}, {"field": "customer_id"}],
                "time_dimensions": [{"dimension": "created_at", "granularity": "month"}, "created_at"],
                "measures": [
                    "revenue:weighted_avg(weight=qty)",
                    {"formula": "aov", "name": "average order"},
                    {"formula": "weighted_median(amount)"},
                ],
            },
            [
                "mydb.orders",
                "mydb.orders.status",
                "mydb.orders.customer_id",
                "mydb.orders.created_at",
                "mydb.orders.revenue",
                "mydb.orders.aov",
                "mydb.orders.amount",
            ],
        ),
        (
            {"source_model": "mydb.orders", "dimensions": ["customers.name", "customers.regions.country"]},
            ["mydb.orders", "mydb.customers.name", "geo.regions.country"],
        ),
        (
            {"source_model": "mydb.orders", "dimensions": [{"name": "name", "model": "customers"}]},
            ["mydb.orders", "mydb.customers.name"],
        ),
        (
            {"source_model": {"name": "orders", "datasource": "shop"}, "dimensions": ["id", "orders.total"]},
            ["shop.orders", "shop.orders.id", "shop.orders.total"],
        ),
        ({"source_model": "mydb.orders"}, ["mydb.orders"]),
        ({"source_model": "mydb.orders", "measures": ["orders.*:count"]}, ["mydb.orders"]),
    ],
)
def test_query_fields_resolve_relative_to_source_model(query: dict[str, Any], expected: list[str]) -> None:
    """The extractor walks source_model, dimensions, time_dimensions, measures and filters; field
    refs resolve against the source model first (`amount` on orders_archive is not ambiguous), dotted
    refs follow its joins, the source model is always tagged, aggregation params are opaque."""
    result = extract_query_entities(SNAPSHOT, query)
    assert result.entities == expected
    assert result.warnings == []
    assert result.errors == []


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (["status is not null and amount > 100"], ["mydb.orders.status", "mydb.orders.amount"]),
        (["customers.name like 'amount%'"], ["mydb.customers.name"]),
        (["coalesce(qty, 0) > 1"], ["mydb.orders.qty"]),
        (["created_at::date >= '2024-01-01'"], ["mydb.orders.created_at"]),
        (["status in ('paid', \"revenue\") or foo = 1e5"], ["mydb.orders.status"]),
        (["amount:sum > {threshold}"], ["mydb.orders.amount"]),
        ("status = 'paid'", ["mydb.orders.status"]),
    ],
)
def test_filter_identifiers_resolve_and_literals_keywords_are_ignored(
    filters: Any, expected: list[str]
) -> None:
    """Filters contribute the identifiers that resolve against the source model's leaves (or
    dotted/aggregated refs); string literals, placeholders, keywords, function names, casts and
    unknown bare words are ignored without warnings."""
    result = extract_query_entities(SNAPSHOT, {"source_model": "mydb.orders", "filters": filters})
    assert result.entities == ["mydb.orders", *expected]
    assert result.warnings == []


def test_sql_words_count_when_they_are_leaves_of_the_source_model() -> None:
    """A column may be called like a keyword (`date`, `order`): it is tagged when the source model
    has it, and otherwise ignored as SQL without a warning."""
    snapshot = CatalogSnapshot.from_dicts(
        [{"name": "db", "models": [{"name": "visits", "columns": ["date", "order", "n"]}]}]
    )
    query = {
        "source_model": "visits",
        "measures": [{"formula": "sum(case when order > 1 then n end)"}, "n:sum"],
        "filters": ["date >= '2024-01-01' and extract(year from date) = 2024"],
    }
    result = extract_query_entities(snapshot, query)
    assert result.entities == ["db.visits", "db.visits.order", "db.visits.n", "db.visits.date"]
    assert result.warnings == []


def test_query_resolution_is_lenient() -> None:
    """Unresolvable query fields become warnings naming the input; the rest still resolves."""
    result = extract_query_entities(
        SNAPSHOT,
        {"source_model": "shop.orders", "dimensions": ["nope"], "measures": [{"formula": "amount:sum"}]},
    )
    assert result.entities == ["shop.orders"]
    assert result.errors == []
    assert any("'nope'" in w for w in result.warnings)
    assert any("'amount:sum'" in w and "mydb.orders_archive.amount" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("query", "default", "entities", "warns"),
    [
        ({"source_model": "orders", "dimensions": ["total"]}, None, ["shop.orders.total"], True),
        (
            {"source_model": "orders", "dimensions": ["total"]},
            "shop",
            ["shop.orders", "shop.orders.total"],
            False,
        ),
        ({"dimensions": ["aov"]}, None, ["mydb.orders.aov"], True),
        ({"source_model": "aov"}, None, [], True),
    ],
)
def test_source_model_must_resolve_to_one_model(
    query: dict[str, Any], default: str | None, entities: list[str], warns: bool
) -> None:
    """An ambiguous, missing or non-model source_model is a warning and fields resolve against the
    whole catalog; the default datasource disambiguates it."""
    result = extract_query_entities(SNAPSHOT, query, default_datasource=default)
    assert result.entities == entities
    assert bool(result.warnings) is warns


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("amount:sum / *:count", ["amount:sum", "*:count"]),
        ("revenue:weighted_avg(weight=qty)", ["revenue:weighted_avg(weight=qty)"]),
        ("sum(amount) - count(*)", ["amount"]),
        ("case when status = 'paid' then amount else 0 end", ["status", "amount"]),
        ("orders.*:count + customers.name", ["orders.*:count", "customers.name"]),
    ],
)
def test_formula_tokens(text: str, tokens: list[str]) -> None:
    """Formulas yield their entity-shaped tokens; aggregation parameters stay opaque."""
    assert formula_tokens(text) == tokens


def test_stale_references() -> None:
    """Catalog entities absent from the snapshot are stale; memory refs are never catalog-stale."""
    entities = [
        "mydb.orders",
        "mydb.orders.gone",
        "memory:9",
        "gone_ds",
        "mydb.orders.gone",
        "geo.regions.name",
    ]
    assert stale_references(SNAPSHOT, entities) == ["mydb.orders.gone", "gone_ds"]
