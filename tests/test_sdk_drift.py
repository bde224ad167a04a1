"""The SDK's models and parameters stay those of the server: compared with the server's OpenAPI document
(``create_app().openapi()``, what /openapi.json serves), so a field added, renamed or dropped on one side
fails here instead of in a user's program."""

from __future__ import annotations

import inspect
from typing import Any

import engram_client.models as sdk
import pytest
from engram_client import EngramClient
from pydantic import BaseModel

from api import schemas as server_out
from core.memories.schemas import ListFilters, PatchMemoryIn, SaveMemoryIn
from core.memories.schemas import SaveResult as ServerSaveResult
from core.search import schemas as server_search


@pytest.fixture(scope="module")
def components(app) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return app.openapi().get("components", {}).get("schemas", {})


def spec_properties(components: dict[str, Any], server_model: type[BaseModel], *, mode: str) -> set[str]:
    """The properties the spec documents for ``server_model`` (FastAPI names a component after the model,
    with -Input/-Output when the two differ). An operation the spec does not type yet is documented by the
    model its route validates with, which is what the spec's component will be generated from."""
    suffix = "-Input" if mode == "validation" else "-Output"
    for name in (server_model.__name__, server_model.__name__ + suffix):
        if name in components:
            return set(components[name].get("properties", {}))
    return set(server_model.model_json_schema(mode=mode)["properties"])  # type: ignore[arg-type]


RESPONSES: list[tuple[type[BaseModel], type[BaseModel]]] = [
    (sdk.Memory, server_out.Memory),
    (sdk.Association, server_out.AssociationOut),
    (sdk.MemoryPage, server_out.MemoryPage),
    (sdk.ForgetResult, server_out.ForgetResult),
    (sdk.HydrateResult, server_out.HydrateResult),
    (sdk.BatchResult, server_out.BatchResult),
    (sdk.ErrorBody, server_out.ErrorBody),
    (sdk.Job, server_out.Job),
    (sdk.SaveResult, ServerSaveResult),
    (sdk.SearchResponse, server_search.SearchResponse),
    (sdk.MemoryHit, server_search.MemoryHit),
    (sdk.ExampleQueryHit, server_search.ExampleQueryHit),
    (sdk.EntityHit, server_search.EntityHit),
    (sdk.Channels, server_search.Channels),
]


@pytest.mark.parametrize(("ours", "theirs"), RESPONSES, ids=[ours.__name__ for ours, _ in RESPONSES])
def test_response_models_have_the_spec_fields(components, ours, theirs):
    documented = spec_properties(components, theirs, mode="serialization")
    # The server's job model carries operator-only extras the SDK keeps as extra fields.
    optional_extras = {"payload", "result", "tenant", "started_at", "finished_at"} if ours is sdk.Job else set()
    assert set(ours.model_fields) == documented - optional_extras


# Each SDK method's keyword parameters against the request body (or query) it sends.
REQUESTS: list[tuple[str, type[BaseModel], set[str]]] = [
    ("save_memory", SaveMemoryIn, set()),
    ("update_memory", PatchMemoryIn, {"memory_id"}),  # the id is in the path
    ("list_memories", ListFilters, {"agent_id", "persona"}),
    ("search", server_search.SearchRequest, set()),
]


@pytest.mark.parametrize(("method", "body", "outside_body"), REQUESTS, ids=[m for m, _, _ in REQUESTS])
def test_method_parameters_are_the_request_fields(components, method, body, outside_body):
    parameters = set(inspect.signature(getattr(EngramClient, method)).parameters) - {"self"}
    assert parameters - outside_body == spec_properties(components, body, mode="validation")
