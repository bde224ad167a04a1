"""Catalog routes: datasources, ingest, sample refresh, model inspection and edits (CONTRACT section 5).

Reads take any key of the tenant; writes (they change what every agent of the tenant sees, and a
datasource carries credentials) need an admin key.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse

from api.auth import require_admin, require_caller
from core.db import tenant_session
from core.entities import editing, service
from core.entities.schemas import DatasourceIn, ModelPatchIn, ModelPutIn, RefreshSamplesIn
from core.jobs.service import enqueue
from core.memories.schemas import parse_model
from core.tenancy.context import Caller

router = APIRouter(prefix="/v1")


@router.post("/datasources", status_code=201)
def create_datasource(
    body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> JSONResponse:
    parsed: DatasourceIn = parse_model(DatasourceIn, body)
    with tenant_session(caller.tenant_id) as session:
        datasource = service.create_datasource(session, tenant_id=caller.tenant_id, body=parsed)
        out = service.datasource_to_dict(datasource, models=[])
    return JSONResponse(out, status_code=201)


@router.get("/datasources")
def list_datasources(caller: Caller = Depends(require_caller)) -> dict[str, Any]:
    with tenant_session(caller.tenant_id) as session:
        return {"datasources": service.list_datasources(session)}


@router.get("/datasources/{name}")
def read_datasource(name: str, caller: Caller = Depends(require_caller)) -> dict[str, Any]:
    with tenant_session(caller.tenant_id) as session:
        return service.read_datasource(session, name=name)


@router.delete("/datasources/{name}")
def delete_datasource(name: str, caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    with tenant_session(caller.tenant_id) as session:
        result = service.delete_datasource(session, tenant_id=caller.tenant_id, name=name)
    return {"datasource": name, "status": "deleted", **result.as_dict()}


def _queue(caller: Caller, *, name: str, kind: str, payload: dict[str, Any]) -> JSONResponse:
    with tenant_session(caller.tenant_id) as session:
        service.get_datasource(session, name=name)
        job = enqueue(session, tenant_id=caller.tenant_id, kind=kind, payload=payload)
    return JSONResponse({"job_id": job.id}, status_code=202)


@router.post("/datasources/{name}/ingest", status_code=202)
def ingest(name: str, caller: Caller = Depends(require_admin)) -> JSONResponse:
    return _queue(caller, name=name, kind="ingest", payload={"datasource": name})


@router.post("/datasources/{name}/refresh-samples", status_code=202)
def refresh_samples(
    name: str, body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> JSONResponse:
    parsed: RefreshSamplesIn = parse_model(RefreshSamplesIn, {} if body is None else body)
    payload: dict[str, Any] = {"datasource": name}
    if parsed.models is not None:
        with tenant_session(caller.tenant_id) as session:
            for model in parsed.models:
                service.get_model(session, datasource=name, name=model)
        payload["models"] = parsed.models
    return _queue(caller, name=name, kind="refresh_samples", payload=payload)


@router.get("/models/{datasource}/{name}")
def inspect_model(
    datasource: str, name: str, request: Request, caller: Caller = Depends(require_caller)
) -> dict[str, Any]:
    from api.routes.memories import acting_identity

    # Learnings follow the memory visibility rules, so the agent and persona of the call matter.
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        return service.inspect_model(session, caller=caller, datasource=datasource, name=name)


@router.put("/models/{datasource}/{name}")
def put_model(
    datasource: str, name: str, body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> dict[str, Any]:
    parsed: ModelPutIn = parse_model(ModelPutIn, body)
    with tenant_session(caller.tenant_id) as session:
        editing.put_model(session, tenant_id=caller.tenant_id, datasource=datasource, name=name, body=parsed)
        return service.inspect_model(session, caller=caller, datasource=datasource, name=name)


@router.patch("/models/{datasource}/{name}")
def patch_model(
    datasource: str, name: str, body: Any = Body(default=None), caller: Caller = Depends(require_admin)
) -> dict[str, Any]:
    parsed: ModelPatchIn = parse_model(ModelPatchIn, body)
    with tenant_session(caller.tenant_id) as session:
        editing.patch_model(
            session, tenant_id=caller.tenant_id, datasource=datasource, name=name, body=parsed
        )
        return service.inspect_model(session, caller=caller, datasource=datasource, name=name)


@router.delete("/models/{datasource}/{name}")
def delete_model(datasource: str, name: str, caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    with tenant_session(caller.tenant_id) as session:
        result = service.delete_model(session, tenant_id=caller.tenant_id, datasource=datasource, name=name)
    return {"model": f"{datasource}.{name}", "status": "deleted", **result.as_dict()}
