"""Catalog routes: datasources, ingest, sample refresh, model inspection and edits (CONTRACT section 5).

Reads take any key of the tenant; writes (they change what every agent of the tenant sees, and a
datasource carries credentials) need an admin key.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse

from api.auth import require_admin, require_caller
from api.openapi import IDENTITY, DatasourcePath, ModelPath, operation
from api.routes.memories import acting_identity
from api.schemas import Datasource, DatasourceList, Deleted, JobAccepted, ModelInspection
from api.threads import Route
from core.audit.service import record
from core.db import tenant_session
from core.entities import editing, service
from core.entities.schemas import DatasourceIn, ModelPatchIn, ModelPutIn, NoOptionsIn, RefreshSamplesIn
from core.jobs.service import enqueue
from core.memories.schemas import parse_model
from core.tenancy.context import Caller

router = APIRouter(prefix="/v1", tags=["catalog"], route_class=Route)

_ADMIN = (403, 404, 415)
_MODEL_EXAMPLE = {
    "description": "Customer orders",
    "columns": [{"name": "amount", "type": "INTEGER", "description": "order amount in cents"}],
    "measures": [{"name": "aov", "formula": "amount:avg", "description": "average order value"}],
}


@router.post(
    "/datasources",
    status_code=201,
    **operation(
        summary="Register a datasource",
        body=DatasourceIn,
        example={"name": "shop", "url": "sqlite:////data/shop.db", "description": "the web shop"},
        response=Datasource,
        status=201,
        errors=(400, 403, 409, 415),
    ),
)
def create_datasource(
    body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> JSONResponse:
    """`url` is an SQLAlchemy URL of a real database; credentials in it are stored encrypted, never returned.
    Then `POST /v1/datasources/{name}/ingest` reflects its tables."""
    parsed: DatasourceIn = parse_model(DatasourceIn, body)
    with tenant_session(caller.tenant_id) as session:
        datasource = service.create_datasource(session, tenant_id=caller.tenant_id, body=parsed)
        record(session, caller_or_actor=caller, action="datasource.add", target=f"datasource:{parsed.name}")
        out = service.datasource_to_dict(datasource, models=[])
    return JSONResponse(out, status_code=201)


@router.get("/datasources", **operation(summary="List datasources", response=DatasourceList))
def list_datasources(caller: Caller = Depends(require_caller)) -> dict[str, Any]:
    """Every datasource of the caller's tenant (credentials never shown)."""
    with tenant_session(caller.tenant_id) as session:
        return {"datasources": service.list_datasources(session)}


@router.get("/datasources/{name}", **operation(summary="Read a datasource", response=Datasource, errors=(404,)))
def read_datasource(name: DatasourcePath, caller: Caller = Depends(require_caller)) -> dict[str, Any]:
    """One datasource and the names of its models."""
    with tenant_session(caller.tenant_id) as session:
        return service.read_datasource(session, name=name)


@router.delete(
    "/datasources/{name}", **operation(summary="Delete a datasource", response=Deleted, errors=(403, 404))
)
def delete_datasource(name: DatasourcePath, caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """Cascades to its models, columns, embeddings and memory references (counted in the answer)."""
    with tenant_session(caller.tenant_id) as session:
        result = service.delete_datasource(session, tenant_id=caller.tenant_id, name=name)
        record(session, caller_or_actor=caller, action="datasource.remove", target=f"datasource:{name}")
    return {"datasource": name, "status": "deleted", **result.as_dict()}


def _queue(caller: Caller, *, name: str, kind: str, payload: dict[str, Any]) -> JSONResponse:
    with tenant_session(caller.tenant_id) as session:
        service.get_datasource(session, name=name)
        job = enqueue(session, tenant_id=caller.tenant_id, kind=kind, payload=payload)
        action = "datasource.ingest" if kind == "ingest" else f"datasource.{kind}"
        record(session, caller_or_actor=caller, action=action, target=f"datasource:{name}")
    return JSONResponse({"job_id": job.id}, status_code=202)


@router.post(
    "/datasources/{name}/ingest",
    status_code=202,
    **operation(
        summary="Ingest a datasource",
        body=NoOptionsIn,
        body_required=False,
        example={},
        response=JobAccepted,
        status=202,
        errors=(403, 404, 422),
    ),
)
def ingest_datasource(
    name: DatasourcePath, body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> JSONResponse:
    """Queue a job that reflects the tables into models and columns, then refreshes samples and embeddings.
    Idempotent; an unreachable source fails the job and changes nothing."""
    parse_model(NoOptionsIn, {} if body is None else body)
    return _queue(caller, name=name, kind="ingest", payload={"datasource": name})


@router.post(
    "/datasources/{name}/refresh-samples",
    status_code=202,
    **operation(
        summary="Refresh sample values",
        body=RefreshSamplesIn,
        body_required=False,
        example={"models": ["orders"]},
        response=JobAccepted,
        status=202,
        errors=_ADMIN,
    ),
)
def refresh_samples(
    name: DatasourcePath, body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> JSONResponse:
    """Queue a job re-sampling the columns of every model of the datasource, or of `models` only."""
    parsed: RefreshSamplesIn = parse_model(RefreshSamplesIn, {} if body is None else body)
    payload: dict[str, Any] = {"datasource": name}
    if parsed.models is not None:
        with tenant_session(caller.tenant_id) as session:
            for model in parsed.models:
                service.get_model(session, datasource=name, name=model)
        payload["models"] = parsed.models
    return _queue(caller, name=name, kind="refresh_samples", payload=payload)


@router.get(
    "/models/{datasource}/{name}",
    **operation(summary="Inspect a model", response=ModelInspection, errors=(404,), query=IDENTITY),
)
def inspect_model(
    datasource: DatasourcePath, name: ModelPath, request: Request, caller: Caller = Depends(require_caller)
) -> dict[str, Any]:
    """Columns with types, descriptions and samples, measures, aggregations, and the `learnings`: query-less
    memories visible to the caller whose entities overlap the model."""

    # Learnings follow the memory visibility rules, so the agent and persona of the call matter.
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        return service.inspect_model(session, caller=caller, datasource=datasource, name=name)


@router.put(
    "/models/{datasource}/{name}",
    **operation(
        summary="Create or replace a model", body=ModelPutIn, example=_MODEL_EXAMPLE, response=ModelInspection,
        errors=_ADMIN,
    ),
)
def put_model(
    datasource: DatasourcePath, name: ModelPath, body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> dict[str, Any]:
    """The model as given: description, label, hidden flag, columns, measures, aggregations."""
    parsed: ModelPutIn = parse_model(ModelPutIn, body)
    with tenant_session(caller.tenant_id) as session:
        editing.put_model(session, tenant_id=caller.tenant_id, datasource=datasource, name=name, body=parsed)
        record(session, caller_or_actor=caller, action="model.put", target=f"model:{datasource}.{name}")
        return service.inspect_model(session, caller=caller, datasource=datasource, name=name)


@router.patch(
    "/models/{datasource}/{name}",
    **operation(
        summary="Edit a model",
        body=ModelPatchIn,
        example={"columns": [{"name": "amount", "description": "order amount in cents"}], "remove_columns": ["legacy"]},
        response=ModelInspection,
        errors=(409, *_ADMIN),
    ),
)
def patch_model(
    datasource: DatasourcePath, name: ModelPath, body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> dict[str, Any]:
    """Change descriptions, labels and hidden flags; add or remove columns, measures and aggregations."""
    parsed: ModelPatchIn = parse_model(ModelPatchIn, body)
    with tenant_session(caller.tenant_id) as session:
        editing.patch_model(
            session, tenant_id=caller.tenant_id, datasource=datasource, name=name, body=parsed
        )
        record(session, caller_or_actor=caller, action="model.update", target=f"model:{datasource}.{name}")
        return service.inspect_model(session, caller=caller, datasource=datasource, name=name)


@router.delete(
    "/models/{datasource}/{name}", **operation(summary="Delete a model", response=Deleted, errors=(403, 404))
)
def delete_model(
    datasource: DatasourcePath, name: ModelPath, caller: Caller = Depends(require_admin)
) -> dict[str, Any]:
    """Removes the model, its columns and embeddings, and strips references to them from memories."""
    with tenant_session(caller.tenant_id) as session:
        result = service.delete_model(session, tenant_id=caller.tenant_id, datasource=datasource, name=name)
        record(session, caller_or_actor=caller, action="model.delete", target=f"model:{datasource}.{name}")
    return {"model": f"{datasource}.{name}", "status": "deleted", **result.as_dict()}
