"""Canonical entity strings and the catalog snapshot (CONTRACT §3, reference/memories.md)."""

from __future__ import annotations

import pytest

from core.entities.canonical import (
    CanonicalParts,
    CatalogSnapshot,
    ModelKey,
    entity_matches_cascade,
    is_memory_ref,
    is_valid_memory_id,
    make_canonical,
    memory_id_of,
    memory_ref,
    rooted_in,
    split_aggregation,
    split_canonical,
    strip_aggregation,
)

CATALOG = [
    {
        "name": "mydb",
        "models": [
            {
                "name": "orders",
                "columns": ["id", "amount", {"name": "status"}, "customer_id"],
                "measures": ["aov"],
                "aggregations": [{"name": "weighted_median", "formula": "..."}],
                "foreign_keys": [{"column": "customer_id", "target_model": "customers"}],
            },
            {"name": "customers", "columns": ["id", "name", {"name": "ssn", "hidden": True}]},
            {"name": "internal", "hidden": True, "columns": ["secret"]},
        ],
    },
    {"name": "vault", "hidden": True, "models": [{"name": "keys", "columns": ["k"]}]},
]


@pytest.fixture(scope="module")
def snapshot() -> CatalogSnapshot:
    return CatalogSnapshot.from_dicts(CATALOG)


@pytest.mark.parametrize(
    ("entry", "canonical_id", "expected"),
    [
        ("memory:42", "memory:42", True),
        ("memory:421", "memory:42", False),
        ("memory:42.y", "memory:42", False),
        ("memory:4", "memory:42", False),
        ("mydb.orders", "mydb.orders", True),
        ("mydb.orders.amount", "mydb.orders", True),
        ("mydb.orders.amount", "mydb", True),
        ("mydb.orders_archive", "mydb.orders", False),
        ("mydb.orders_archive.amount", "mydb.orders", False),
        ("mydb.orders", "mydb.orders.amount", False),
        ("mydb2.orders", "mydb", False),
        ("memory:42", "memory", False),
    ],
)
def test_entity_matches_cascade(entry: str, canonical_id: str, expected: bool) -> None:
    """memory:<id> refs match exactly only; <ds>[.<model>[.<leaf>]] refs match exactly or as a
    strict dotted descendant, never as a character prefix (memories.md, Cascade-on-delete)."""
    assert entity_matches_cascade(entry=entry, canonical_id=canonical_id) is expected


@pytest.mark.parametrize(
    ("entity", "datasource", "expected"),
    [
        ("prod", "prod", True),
        ("prod.orders", "prod", True),
        ("prod.orders.amount", "prod", True),
        ("prod_v2", "prod", False),
        ("prod_v2.orders", "prod", False),
        ("production.orders", "prod", False),
        ("memory:1", "memory", False),
        ("prod.orders", "", False),
    ],
)
def test_rooted_in(entity: str, datasource: str, expected: bool) -> None:
    """An entity is rooted at a datasource when it is that datasource or a strict dotted descendant;
    a character prefix never qualifies (search.md, datasource filter); memory refs are rooted nowhere."""
    assert rooted_in(entity=entity, datasource=datasource) is expected


@pytest.mark.parametrize(
    ("ref", "target", "aggregation"),
    [
        ("revenue:sum", "revenue", "sum"),
        ("revenue:weighted_avg(weight=qty)", "revenue", "weighted_avg"),
        ("revenue:corr(other=qty)", "revenue", "corr"),
        ("orders.amount:avg", "orders.amount", "avg"),
        ("mydb.orders.revenue:weighted_avg(weight=qty)", "mydb.orders.revenue", "weighted_avg"),
        ("*:count", "*", "count"),
        ("orders.*:count", "orders.*", "count"),
        ("sum(revenue)", "revenue", "sum"),
        ("revenue", "revenue", None),
        ("memory:42", "memory:42", None),
    ],
)
def test_split_and_strip_aggregation(ref: str, target: str, aggregation: str | None) -> None:
    """Aggregation suffixes (with opaque parameters) are stripped: the aggregation is never an
    entity; `*:count` leaves the model wildcard `*` (CONTRACT §3)."""
    assert split_aggregation(ref) == (target, aggregation)
    assert strip_aggregation(ref) == target


@pytest.mark.parametrize("ref", ["revenue:", ":sum", "revenue:sum)", "revenue:s um"])
def test_malformed_aggregation_suffix_is_rejected(ref: str) -> None:
    """A colon must introduce a well-formed aggregation name (optionally with parameters)."""
    with pytest.raises(ValueError):
        split_aggregation(ref)


@pytest.mark.parametrize(
    ("s", "parts"),
    [
        ("mydb", CanonicalParts("mydb")),
        ("mydb.orders", CanonicalParts("mydb", "orders")),
        ("mydb.orders.amount", CanonicalParts("mydb", "orders", "amount")),
    ],
)
def test_split_canonical_round_trips(s: str, parts: CanonicalParts) -> None:
    """Canonical form is exactly <ds>, <ds>.<model> or <ds>.<model>.<leaf> (CONTRACT §3)."""
    assert split_canonical(s) == parts
    assert make_canonical(datasource=parts.datasource, model=parts.model, leaf=parts.leaf) == s


@pytest.mark.parametrize("s", ["memory:1", "a.b.c.d", "a..b", "", ".a"])
def test_split_canonical_rejects_non_catalog_strings(s: str) -> None:
    """Memory refs and strings with more than three or empty segments are not catalog entities."""
    with pytest.raises(ValueError):
        split_canonical(s)


@pytest.mark.parametrize(
    ("memory_id", "valid"),
    [
        ("42", True),
        ("kb.policy.42", True),
        ("a:b", False),
        ("a/b", False),
        ("a?b", False),
        ("a#b", False),
        ("a b", False),
        ("a\x07b", False),
        ("", False),
        ("x" * 200, True),
        ("x" * 201, False),
    ],
)
def test_memory_refs(memory_id: str, valid: bool) -> None:
    """memory:<id> round-trips; ids exclude `: / ? #`, whitespace and control chars, at most 200
    chars (CONTRACT §4)."""
    ref = memory_ref(memory_id)
    assert is_memory_ref(ref)
    assert memory_id_of(ref) == memory_id
    assert is_valid_memory_id(memory_id) is valid
    assert not is_memory_ref("mydb.memory")


@pytest.mark.parametrize(
    ("canonical_id", "kind", "hidden"),
    [
        ("mydb", "datasource", False),
        ("mydb.orders", "model", False),
        ("mydb.orders.amount", "column", False),
        ("mydb.orders.aov", "measure", False),
        ("mydb.orders.weighted_median", "aggregation", False),
        ("mydb.customers.ssn", "column", True),
        ("mydb.internal", "model", True),
        ("mydb.internal.secret", "column", True),
        ("vault.keys.k", "column", True),
        ("mydb.orders.nope", None, False),
        ("mydb.orders_archive", None, False),
        ("nodb", None, False),
        ("memory:1", None, False),
    ],
)
def test_kind_and_hidden(
    snapshot: CatalogSnapshot, canonical_id: str, kind: str | None, hidden: bool
) -> None:
    """Every leaf kind is addressable; hidden datasources/models hide everything under them, and
    hidden columns hide themselves (search.md: hidden models/columns never surface)."""
    assert snapshot.kind_of(canonical_id) == kind
    assert snapshot.contains(canonical_id) is (kind is not None)
    assert snapshot.is_hidden(canonical_id) is hidden


def test_indexes_list_every_owner(snapshot: CatalogSnapshot) -> None:
    """Name lookups are precomputed: leaf name -> owning models, model name -> (ds, model)."""
    assert snapshot.leaf_owners["id"] == (ModelKey("mydb", "orders"), ModelKey("mydb", "customers"))
    assert snapshot.leaf_owners["aov"] == (ModelKey("mydb", "orders"),)
    assert snapshot.models_by_name["keys"] == (ModelKey("vault", "keys"),)


@pytest.mark.parametrize(
    ("source", "token", "target"),
    [
        (ModelKey("mydb", "orders"), "customers", ModelKey("mydb", "customers")),
        (ModelKey("mydb", "orders"), "customer_id", ModelKey("mydb", "customers")),
        (ModelKey("mydb", "orders"), "customer", ModelKey("mydb", "customers")),
        (ModelKey("mydb", "customers"), "orders", ModelKey("mydb", "orders")),
        (ModelKey("mydb", "orders"), "internal", None),
    ],
)
def test_join_target(
    snapshot: CatalogSnapshot, source: ModelKey, token: str, target: ModelKey | None
) -> None:
    """A join hop names a foreign-key-linked model in either direction, or the FK column."""
    assert snapshot.join_target(source=source, token=token) == target


def test_from_rows_matches_from_dicts(snapshot: CatalogSnapshot) -> None:
    """The flat-row builder (as SQL returns rows) builds the same snapshot as the nested one."""
    from_rows = CatalogSnapshot.from_rows(
        datasources=[("mydb", False), ("vault", True)],
        models=[
            ("mydb", "orders", False),
            ("mydb", "customers", False),
            ("mydb", "internal", True),
            ("vault", "keys", False),
            ("ghost", "orphan", False),
        ],
        columns=[
            ("mydb", "orders", "id", False),
            ("mydb", "orders", "amount", False),
            ("mydb", "orders", "status", False),
            ("mydb", "orders", "customer_id", False),
            ("mydb", "customers", "id", False),
            ("mydb", "customers", "name", False),
            ("mydb", "customers", "ssn", True),
            ("mydb", "internal", "secret", False),
            ("vault", "keys", "k", False),
        ],
        measures=[("mydb", "orders", "aov")],
        aggregations=[("mydb", "orders", "weighted_median")],
        foreign_keys=[("mydb", "orders", "customer_id", "mydb", "customers")],
    )
    assert from_rows == snapshot
