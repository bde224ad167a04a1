"""The OpenAPI description is a client generator's input: valid, every operation tagged, summarised and
typed (bodies and 2xx answers name a model, never a bare object), errors in the contract's shape, bearer
auth declared; and what the server answers matches what it documents."""

from __future__ import annotations

import re
from typing import Any

import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

# Operations that take no body by design (the path says everything).
# Calls that take no options: their optional body is an object with no fields, closed to unknown ones.
NO_OPTIONS = {"ingest_datasource", "retry_job"}


@pytest.fixture(scope="module")
def spec(client) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    response = client.get("/openapi.json")
    assert response.status_code == 200
    return response.json()


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in spec["paths"].items() for method, op in item.items()]


def component(spec: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith("#/components/schemas/"), ref
    return spec["components"]["schemas"][ref.rsplit("/", 1)[-1]]


def test_the_description_is_valid_openapi(spec):
    validate(spec)
    assert spec["openapi"].startswith("3.1")
    assert len(operations(spec)) >= 29


def test_every_operation_is_tagged_summarised_and_described(spec):
    tags = {t["name"] for t in spec["tags"]}
    for path, method, op in operations(spec):
        assert op.get("tags") and set(op["tags"]) <= tags, (path, method)
        assert op.get("summary") and op.get("description"), (path, method)
        assert re.fullmatch(r"[a-z_]+", op["operationId"]), op["operationId"]
        for parameter in op.get("parameters", []):
            assert parameter.get("description"), (path, method, parameter["name"])
    ids = [op["operationId"] for _, _, op in operations(spec)]
    assert len(ids) == len(set(ids))


def test_bodies_are_typed_with_an_example_and_refuse_unknown_fields(spec):
    """A body names a component that is an object closed to unknown fields (the 422 the route gives)."""
    for path, method, op in operations(spec):
        if method not in ("post", "put", "patch"):
            assert "requestBody" not in op, (path, method)
            continue
        content = op["requestBody"]["content"]["application/json"]
        assert set(content["schema"]) == {"$ref"}, (path, method)
        schema = component(spec, content["schema"]["$ref"])
        assert schema["type"] == "object", (path, method)
        assert bool(schema.get("properties")) != (op["operationId"] in NO_OPTIONS), (path, method)
        assert schema.get("additionalProperties") is False, (path, method)
        assert "example" in content, (path, method)


def test_success_answers_are_typed(spec):
    for path, method, op in operations(spec):
        successes = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        assert len(successes) == 1, (path, method)
        (answer,) = successes.values()
        for media, content in answer["content"].items():
            if media != "application/json":
                assert content["schema"] == {"type": "string"}, (path, method)  # the markdown export
                continue
            schema = component(spec, content["schema"]["$ref"])
            assert schema["type"] == "object" and schema["properties"], (path, method)


def test_errors_are_the_contracts_shape_and_keys_are_bearer(spec):
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert set(schemas["ErrorResponse"]["required"]) == {"error"}
    detail = component(spec, schemas["ErrorResponse"]["properties"]["error"]["$ref"])
    assert {"code", "message"} <= set(detail["required"]) and "field" in detail["properties"]
    assert spec["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["HTTPBearer"]["description"],
    }
    for path, method, op in operations(spec):
        errors = {code: r for code, r in op["responses"].items() if code[0] in "45"}
        for response in errors.values():
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (path, method)
        if path.startswith("/v1/"):
            assert op["security"] == [{"HTTPBearer": []}], (path, method)
            assert {"401", "422", "503"} <= set(errors), (path, method)


def test_examples_are_valid_for_their_schemas(spec):
    """An example a reader copies from /docs is a body the schema accepts (and so the route)."""
    checked = 0
    for _, _, op in operations(spec):
        contents = [op["requestBody"]["content"]] if "requestBody" in op else []
        contents += [r.get("content", {}) for r in op["responses"].values()]
        for content in contents:
            media = content.get("application/json", {})
            if "example" in media and "$ref" in media.get("schema", {}):
                schema = {**media["schema"], "components": spec["components"]}
                OAS31Validator(schema).validate(media["example"])
                checked += 1
    assert checked >= 13  # every body's example and the documented answers'


def _check(spec: dict[str, Any], path: str, method: str, response: Any) -> None:
    """The answer validates against the schema the description gives for its status."""
    op = spec["paths"][path][method]
    documented = op["responses"][str(response.status_code)]["content"]["application/json"]["schema"]
    OAS31Validator({**documented, "components": spec["components"]}).validate(response.json())


def test_answers_match_the_description(client, tenant, spec):
    h = tenant.headers()
    saved = client.post("/v1/memories", json={"content": "orders.amount is in cents", "tags": ["units"]}, headers=h)
    _check(spec, "/v1/memories", "post", saved)
    memory_id = saved.json()["memory_id"]
    batch = client.post("/v1/memories:batch", json={"items": [{"content": "b"}, {"content": ""}]}, headers=h)
    _check(spec, "/v1/memories:batch", "post", batch)
    _check(spec, "/v1/memories", "get", client.get("/v1/memories", headers=h))
    _check(spec, "/v1/memories/{memory_id}", "get", client.get(f"/v1/memories/{memory_id}", headers=h))
    patched = client.patch(f"/v1/memories/{memory_id}", json={"tags": ["units", "usd"]}, headers=h)
    _check(spec, "/v1/memories/{memory_id}", "patch", patched)
    _check(spec, "/v1/search", "post", client.post("/v1/search", json={"question": "order amount unit"}, headers=h))
    _check(spec, "/v1/hydrate", "post", client.post("/v1/hydrate", json={"budget_bytes": 1000}, headers=h))
    _check(spec, "/v1/ops/coverage", "get", client.get("/v1/ops/coverage", headers=h))
    _check(spec, "/v1/jobs", "get", client.get("/v1/jobs", headers=h))
    _check(spec, "/v1/datasources", "get", client.get("/v1/datasources", headers=h))
    _check(spec, "/v1/memories/{memory_id}", "delete", client.delete(f"/v1/memories/{memory_id}", headers=h))
    _check(spec, "/v1/runs/{run_id}", "delete", client.delete("/v1/runs/r1", headers=h))
    _check(spec, "/healthz", "get", client.get("/healthz"))
    unknown = client.post("/v1/search", json={"question": "x", "tagz": ["a"]}, headers=h)
    assert unknown.status_code == 422
    _check(spec, "/v1/search", "post", unknown)
    _check(spec, "/v1/memories/{memory_id}", "get", client.get("/v1/memories/nope", headers=h))


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_every_asset_from_this_server(client, page):
    """Swagger UI and ReDoc come from the installed package, so the pages work without internet."""
    response = client.get(page)
    assert response.status_code == 200
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", response.text)
    urls += re.findall(r"""url\s*:\s*['"]([^'"]+)['"]""", response.text)  # swagger's spec url
    urls += re.findall(r"""spec-url\s*=\s*["']([^"']+)["']""", response.text)  # redoc's
    assert any(u.endswith(".js") for u in urls), urls
    for url in set(urls):
        assert url.startswith("/") and not url.startswith("//"), f"{page} loads {url} from elsewhere"
        assert client.get(url).status_code == 200, url
    assert "cdn" not in response.text.lower()


def test_every_documented_operation_is_one_of_the_apps_own_routes(client, spec):
    """Routes are matched by their path alone: every operation the description lists is a route of the app's
    own router (api.app.add_routes), none behind an included router, which FastAPI walks with bookkeeping per
    candidate and walks twice when it holds the match."""
    from fastapi.routing import APIRoute

    own = {(route.path, method.lower()) for route in client.app.router.routes if isinstance(route, APIRoute)
           for method in route.methods}  # fmt: skip
    documented = {(path, method) for path, method, _ in operations(spec)}
    assert documented <= own, sorted(documented - own)
