"""CONTRACT section 8: a body field the call does not know is a 422 whose `field` names it, on every route
that takes a body; the documented aliases (`learning`, `entities`) and the acting identity (`agent_id`,
`persona`) stay accepted."""

from __future__ import annotations

import pytest

from tests.test_errors import assert_error
from tests.test_search_api import save
from tests.test_search_entities import catalog  # noqa: F401 - fixture


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("post", "/v1/memories", {"content": "x", "tagz": ["a"]}, "tagz"),
        (
            "post",
            "/v1/memories",
            {"content": "x", "associations": [{"target_id": "1", "wieght": 1}]},
            "associations.0.wieght",
        ),
        ("post", "/v1/memories:batch", {"items": [{"content": "x"}], "agnet_id": "a"}, "agnet_id"),
        ("post", "/v1/search", {"question": "x", "max_memory": 3}, "max_memory"),
        ("post", "/v1/search", {"question": "x", "tag": ["a"]}, "tag"),
        ("post", "/v1/hydrate", {"budget_bytes": 10, "budget": 5}, "budget"),
        ("post", "/v1/keys", {"user": "a@example.com", "roles": "admin"}, "roles"),
        ("post", "/v1/datasources", {"name": "d", "url": "sqlite://", "descripton": "x"}, "descripton"),
        ("post", "/v1/memories:import", {"markdown": "---\nkey: a\n---\nx\n", "format": "md"}, "format"),
    ],
)
def test_unknown_body_field_is_422_naming_it(client, tenant, method, path, body, field):
    response = getattr(client, method)(path, json=body, headers=tenant.headers())
    error = assert_error(response, 422, "validation_error")
    assert error["field"] == field
    assert field.rsplit(".", 1)[-1] in error["message"]


def test_unknown_patch_field_is_422_and_nothing_changes(client, tenant):
    memory_id = save(client, tenant, {"content": "orders.amount is in cents"})
    response = client.patch(f"/v1/memories/{memory_id}", json={"contnet": "typo"}, headers=tenant.headers())
    assert assert_error(response, 422)["field"] == "contnet"
    got = client.get(f"/v1/memories/{memory_id}", headers=tenant.headers()).json()
    assert got["content"] == "orders.amount is in cents"


def test_unknown_field_in_a_batch_item_is_an_error_in_its_slot(client, tenant):
    response = client.post(
        "/v1/memories:batch",
        json={"items": [{"content": "kept"}, {"content": "x", "knd": "fact"}]},
        headers=tenant.headers(),
    )
    assert response.status_code == 200, response.text
    first, second = response.json()["results"]
    assert "memory_id" in first
    assert second["error"]["field"] == "items.1.knd"


def test_unknown_field_of_a_catalog_model_edit(client, catalog):  # noqa: F811
    response = client.patch("/v1/models/shop/orders", json={"descriptoin": "x"}, headers=catalog.headers())
    assert assert_error(response, 422)["field"] == "descriptoin"


def test_documented_aliases_and_identity_fields_are_accepted(client, tenant):
    """`learning` is `content`, `entities` is `linked_entities`; `agent_id`/`persona` may be in any body."""
    memory_id = save(
        client, tenant, {"learning": "alias note", "entities": [], "agent_id": "planner", "persona": "analyst"}
    )
    # An admin naming an agent and persona sees what they see (CONTRACT section 2).
    identity = {"agent_id": "planner", "persona": "analyst"}
    got = client.get(f"/v1/memories/{memory_id}", params=identity, headers=tenant.headers()).json()
    assert got["content"] == "alias note" and got["agent_id"] == "planner"
    patched = client.patch(
        f"/v1/memories/{memory_id}",
        json={"learning": "alias note, revised", "agent_id": "planner", "persona": "analyst"},
        headers=tenant.headers(),
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["content"] == "alias note, revised"
    for path, body in (
        ("/v1/search", {"question": "alias", "agent_id": "planner", "persona": "analyst"}),
        ("/v1/hydrate", {"budget_bytes": 1000, "agent_id": "planner", "persona": "analyst"}),
        ("/v1/memories:batch", {"items": [{"learning": "b"}], "agent_id": "planner", "persona": "analyst"}),
    ):
        response = client.post(path, json=body, headers=tenant.headers())
        assert response.status_code == 200, (path, response.text)


def test_calls_without_options_refuse_a_body_field_they_do_not_know(client, tenant):
    """Ingest and job retry take no options: no body or `{}` is accepted, any field is a 422 naming it."""
    headers = tenant.headers()
    for path in ("/v1/datasources/nowhere/ingest", "/v1/jobs/nope/retry"):
        response = client.post(path, json={"bogus": 1}, headers=headers)
        assert response.status_code == 422, (path, response.text)
        assert response.json()["error"]["field"] == "bogus"
        # Without the stray field the call goes on to its own answer (here: nothing by that name).
        assert client.post(path, json={}, headers=headers).status_code == 404
        assert client.post(path, headers=headers).status_code == 404
