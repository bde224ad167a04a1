"""Superseding needs evidence beyond cosine (core.embeddings.supersede): true and false pairs, table-driven,
then on the real stack with the bundled model."""

from __future__ import annotations

import numpy as np
import pytest

from core.embeddings.providers import get_embedder
from core.embeddings.supersede import may_supersede, near_identical

# (older, newer, same fact restated?) — the false ones are distinct facts the static model scores > 0.9.
PAIRS = [
    ("orders.amount is stored in cents; divide by 100", "orders.amount is stored in cents, divide it by 100", True),
    ("orders rows are archived after 0 days", "orders rows are archived after 0 days.", True),
    ("Deploys happen on Tuesdays", "deploys happen on tuesdays.", True),
    ("The nightly export runs at 2 am", "The nightly export runs at 2 am UTC", True),
    ("Service outbox-57 listens on port 8057", "Service outbox-59 listens on port 8059", False),
    ("outbox-57: the outbox table holds 57 rows", "outbox-59: the outbox table holds 59 rows", False),
    ("Customer 1042 is on the pro plan", "Customer 1043 is on the pro plan", False),
    ("The refund window is 30 days", "The refund window is 45 days", False),
    ("The user prefers dark mode", "The user prefers light mode", False),
    ("Alice owns the billing service", "Alice owns the billing service and the invoicing service too", False),
]


@pytest.mark.parametrize(("older", "newer", "same"), PAIRS)
def test_near_identical_text(older, newer, same):
    assert near_identical(older, newer) is same


@pytest.mark.parametrize(
    ("older_entities", "newer_entities", "expected"),
    [([], [], True), (["shop.orders"], ["shop.orders"], True), (["shop.orders"], ["shop.refunds"], False),
     (["shop.orders"], [], False), (["a", "b"], ["b", "a"], True)],
)  # fmt: skip
def test_supersede_needs_the_same_entities(older_entities, newer_entities, expected):
    text = "amounts are in cents"
    assert (
        may_supersede(older_text=text, newer_text=text, older_entities=older_entities, newer_entities=newer_entities)
        is expected
    )


def test_the_false_pairs_do_fool_the_cosine():
    """The reason for the rule: the bundled model puts most distinct templated facts above 0.9."""
    embedder = get_embedder("local")
    fooled = 0
    for older, newer, same in PAIRS:
        a, b = embedder.embed_documents([older, newer])
        cosine = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
        fooled += int(not same and cosine > 0.9)
    assert fooled >= 4


def _save(client, tenant, content, **extra):  # type: ignore[no-untyped-def]
    body = {"content": content, "sync_embed": True, **extra}
    response = client.post("/v1/memories", json=body, headers=tenant.headers())
    assert response.status_code == 201, response.text
    return response.json()


@pytest.mark.parametrize(
    ("older", "newer", "same"), [p for p in PAIRS if p[0].startswith(("orders", "Customer", "outbox"))]
)
def test_sync_save_supersedes_only_restatements(client, tenant, older, newer, same):
    """On the real stack: a restatement supersedes; a distinct templated fact is only reported as similar."""
    first = _save(client, tenant, older)["memory_id"]
    second = _save(client, tenant, newer)
    old = client.get(f"/v1/memories/{first}", headers=tenant.headers()).json()
    new = client.get(f"/v1/memories/{second['memory_id']}", headers=tenant.headers()).json()
    if same:
        assert old["superseded_by"] == second["memory_id"]
        assert new["associations"] == [
            {"target_id": first, "relation_type": "updates", "weight": pytest.approx(1, abs=0.1)}
        ]
    else:
        assert old["superseded_by"] is None and new["associations"] == []
        assert [s["memory_id"] for s in second["similar_existing"]] == [first]
