"""The OpenAPI description: typed bodies and responses, the contract's error shape, bearer auth, tags.

Routes validate their JSON bodies with the core request models themselves (``parse_model``): that is what
gives the contract's 422 naming the field, a batch's per-item errors and the 413-before-422 order. So
FastAPI sees an untyped body; :func:`operation` tells the description which model a body is, which model a
success returns and which errors a route answers, and :func:`install_openapi` puts the request models into
the components next to the response models FastAPI already collects.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Path
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from api.schemas import ErrorResponse

# Every /v1 operation takes a tenant's (or the operator's) key as a bearer token, which api.auth checks: the
# description says so with one security scheme (the Authorize button of /docs), added to each /v1 operation
# by install_openapi rather than declared as a dependency of each router, which FastAPI would call on every
# request (to parse the header again into a model no route reads).
BEARER_SCHEME = "HTTPBearer"
_BEARER = {"type": "http", "description": "an engram API key: `Authorization: Bearer egk_...`", "scheme": "bearer"}
KEYED_PREFIX = "/v1/"

TAGS: list[dict[str, str]] = [
    {"name": "memories", "description": "Save, recall, revise, forget, list, hydrate, export and import memories."},
    {"name": "search", "description": "Hybrid search over memories, example queries and catalog entities."},
    {"name": "catalog", "description": "Datasources, their models and columns: the entities memories talk about."},
    {"name": "runs", "description": "Ending a run forgets its conversation memories."},
    {"name": "jobs", "description": "Background jobs (embedding, ingest, sample refresh, ...) and their retries."},
    {"name": "operations", "description": "Embedding coverage per tenant, doc kind and model."},
    {"name": "keys", "description": "API keys of the caller's tenant (admin keys only)."},
    {"name": "tenants", "description": "Operating tenants (operator key): provision, suspend, limit, meter, offboard."},
    {"name": "audit", "description": "Who did what in the tenant: the append-only audit log (admin keys only)."},
    {"name": "webhooks", "description": "Signed event deliveries (Standard Webhooks) to the tenant's URLs."},
    {"name": "health", "description": "Liveness and readiness; no key needed."},
]

ERROR_TEXT: dict[int, str] = {
    400: "Bad request: the body is not valid JSON, or an input names something that does not exist.",
    401: "Missing or unknown API key.",
    403: "The key may not do this (e.g. a member key on an admin route).",
    404: "Not found, or not visible to this key.",
    409: "Conflicts with the current state (an existing name, a job that is not stuck).",
    413: "Content or body too large.",
    415: "The body is not JSON (`Content-Type: application/json`).",
    422: "Validation failed; `field` is the offending field's path (also for a field the call does not know).",
    429: "Rate limit of this key exceeded; see `Retry-After`.",
    503: "A dependency (database, broker) is down; retry after `Retry-After` seconds.",
}
KEYED_ERRORS = (401, 422, 429, 503)


# Path parameters, described once for every route that takes them.
MemoryIdPath = Annotated[str, Path(description="the memory's id, e.g. '42'")]
KeyIdPath = Annotated[str, Path(description="the key's id (from POST or GET /v1/keys)")]
WebhookIdPath = Annotated[str, Path(description="the webhook's id (from POST or GET /v1/webhooks)")]
JobIdPath = Annotated[str, Path(description="the job's id (e.g. from a 202's job_id)")]
DatasourcePath = Annotated[str, Path(description="the datasource's name")]
ModelPath = Annotated[str, Path(description="the model's name within the datasource")]
RunIdPath = Annotated[str, Path(description="the run_id its memories were saved with")]

_BODY_MODELS: dict[str, type[BaseModel]] = {}

Query = dict[str, tuple[dict[str, Any], str]]
IDENTITY: Query = {
    "agent_id": ({"type": "string"}, "the agent the call acts for (a body's `agent_id` wins)"),
    "persona": ({"type": "string"}, "the persona the call acts for (a body's `persona` wins)"),
}


def query_from(model: type[BaseModel]) -> Query:
    """Query parameters documented from the model a route validates its query string with."""
    schema = model.model_json_schema()
    params: Query = {}
    for name, prop in schema.get("properties", {}).items():
        prop = dict(prop)
        text = prop.pop("description", "")
        prop.pop("title", None)
        if "$ref" in prop or "$defs" in prop:
            prop = {"type": "string"}
        params[name] = (prop, text)
    return params


def operation(
    *,
    summary: str,
    response: type[BaseModel] | None,
    status: int = 200,
    body: type[BaseModel] | None = None,
    body_required: bool = True,
    example: dict[str, Any] | None = None,
    response_example: dict[str, Any] | None = None,
    errors: tuple[int, ...] = (),
    keyed: bool = True,
    response_media: str | None = None,
    description: str | None = None,
    query: Query | None = None,
) -> dict[str, Any]:
    """Keyword arguments of a route decorator documenting one operation.

    ``response`` is the model of the success body (``None`` with ``response_media`` for a non-JSON one);
    ``errors`` are the route's own error statuses on top of those of every keyed route. The route's
    docstring is the description unless ``description`` is given. ``query`` documents query parameters a
    route reads itself (name -> (JSON schema, description)), keeping its own parsing and error messages.
    """
    responses: dict[int | str, dict[str, Any]] = {}
    if response is not None:
        responses[status] = {"model": response, "description": summary}
        if response_example is not None:
            responses[status]["content"] = {"application/json": {"example": response_example}}
    elif response_media is not None:
        responses[status] = {"description": summary, "content": {response_media: {"schema": {"type": "string"}}}}
    body_errors = (400, 413, 415) if body is not None else ()  # malformed JSON, too large, not JSON
    for code in sorted({*errors, *body_errors, *(KEYED_ERRORS if keyed else ())}):
        responses[code] = {"model": ErrorResponse, "description": ERROR_TEXT[code]}
    extra: dict[str, Any] = {}
    if body is not None:
        _BODY_MODELS[body.__name__] = body
        content: dict[str, Any] = {"schema": {"$ref": f"#/components/schemas/{body.__name__}"}}
        if example is not None:
            content["example"] = example
        extra["requestBody"] = {"required": body_required, "content": {"application/json": content}}
    if query:
        extra["parameters"] = [
            {"name": name, "in": "query", "required": False, "schema": schema, "description": text}
            for name, (schema, text) in query.items()
        ]
    kwargs: dict[str, Any] = {"summary": summary, "response_model": None, "responses": responses}
    if description is not None:
        kwargs["description"] = description
    if extra:
        kwargs["openapi_extra"] = extra
    return kwargs


def operation_id(route: APIRoute) -> str:
    """The endpoint's function name (`save_memory`, `search`): what a generated client calls the method."""
    return route.name


def install_openapi(app: FastAPI, *, description: str) -> None:
    """Replace ``app.openapi`` with one that adds the request models and tidies the bodies."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        spec = get_openapi(
            title=app.title, version=app.version, description=description, routes=app.routes, tags=TAGS
        )
        schemas: dict[str, Any] = spec.setdefault("components", {}).setdefault("schemas", {})
        _, top = models_json_schema(
            [(model, "validation") for model in _BODY_MODELS.values()], ref_template="#/components/schemas/{model}"
        )
        for name, schema in top.get("$defs", {}).items():
            if name in schemas and schemas[name] != schema:
                raise RuntimeError(f"two different schemas are both named {name} in the OpenAPI description")
            schemas[name] = schema
        spec["components"]["securitySchemes"] = {BEARER_SCHEME: _BEARER}
        for path, item in spec.get("paths", {}).items():
            for op in item.values():
                if path.startswith(KEYED_PREFIX):
                    op["security"] = [{BEARER_SCHEME: []}]
                for media in op.get("requestBody", {}).get("content", {}).values():
                    ref = media.get("schema", {}).get("$ref")
                    if ref:  # FastAPI's own entry for the untyped body ({"title": "Body"}) gives way to the model
                        media["schema"] = {"$ref": ref}
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
