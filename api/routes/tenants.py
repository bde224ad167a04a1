"""Operating tenants over REST (CONTRACT section 9): the operator key provisions, lists, suspends, limits and
offboards tenants; a tenant's admin reads its own usage. Thin adapters over core.tenancy.operations."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.auth import bearer_token, forget_tenant_callers, is_operator_key, require_admin
from api.openapi import operation
from api.threads import Route
from core.db import system_session, tenant_session
from core.errors import Forbidden, Invalid, Unauthorized
from core.memories.schemas import unknown_fields
from core.parsing import plain_int
from core.tenancy import operations, usage
from core.tenancy.context import Caller
from core.tenancy.quotas import full_quotas

router = APIRouter(prefix="/v1", tags=["tenants"], route_class=Route)

TenantPath = Annotated[str, Path(description="the tenant's name")]
MAX_USAGE_DAYS = 366


class QuotasIn(BaseModel):
    """Limits to set; null is unlimited, a quota not named is left as it is."""

    model_config = ConfigDict(extra="forbid")

    max_memories: int | None = Field(default=None, description="memories kept (not forgotten)")
    max_datasources: int | None = Field(default=None, description="datasources registered")
    requests_per_minute: int | None = Field(default=None, description="requests of all the tenant's keys together")
    embedding_texts_per_day: int | None = Field(default=None, description="texts sent to the embedding provider")


class Quotas(BaseModel):
    """A tenant's limits; null is unlimited."""

    max_memories: int | None
    max_datasources: int | None
    requests_per_minute: int | None
    embedding_texts_per_day: int | None


class Usage(BaseModel):
    # Every answer carries every counter: the OpenAPI document marks them required.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    memories: int = 0
    datasources: int = 0
    storage_bytes: int = 0
    requests: int = 0
    searches: int = 0
    saves: int = 0
    embedded_texts: int = 0
    embedding_tokens: int = 0


class TenantIn(BaseModel):
    """`POST /v1/tenants`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="letters, digits, '_', '.', '-'; at most 200", examples=["acme"])
    quotas: QuotasIn | None = Field(default=None, description="limits; those not named take the deployment's defaults")
    admin_user: str = Field(default="admin@localhost", description="the user (an email) of the first admin key")


class TenantPatch(BaseModel):
    """`PATCH /v1/tenants/{name}`: suspend or resume, and/or change the quotas named."""

    model_config = ConfigDict(extra="forbid")

    state: str | None = Field(default=None, description="active or suspended")
    quotas: QuotasIn | None = None


class TenantOut(BaseModel):
    tenant: str
    state: str
    quotas: Quotas
    usage: Usage
    created_at: str | None


class ProvisionedOut(BaseModel):
    tenant: str
    api_key: str
    state: str
    quotas: Quotas
    created_at: str | None


class TenantPage(BaseModel):
    tenants: list[TenantOut]
    next_cursor: str | None


class OffboardingOut(BaseModel):
    job_id: str


class UsageDay(Usage):
    date: str


class UsageReport(BaseModel):
    usage: Usage
    quotas: Quotas
    days: list[UsageDay] | None = None


async def require_operator_key(request: Request) -> None:
    """The operator key as Bearer: 401 without a key, 403 with a tenant's key."""
    token = bearer_token(request)
    if token is None:
        raise Unauthorized("missing API key: these calls need the operator key as 'Authorization: Bearer <key>'")
    if not is_operator_key(token):
        raise Forbidden("operating tenants needs the operator key")


def _body(body: Any, model: type[BaseModel]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object")
    unknown_fields(model, body)
    return body


@router.post(
    "/tenants",
    status_code=201,
    dependencies=[Depends(require_operator_key)],
    **operation(
        summary="Provision a tenant",
        body=TenantIn,
        example={"name": "acme", "quotas": {"max_memories": 100000, "requests_per_minute": 600}},
        response=ProvisionedOut,
        status=201,
        errors=(403, 409),
    ),
)
def create_tenant(body: Any = Body(default=None)) -> JSONResponse:
    """A new tenant and its first admin key (shown only in this answer); 409 when the name is taken."""
    body = _body(body, TenantIn)
    name = body.get("name")
    if not isinstance(name, str):
        raise Invalid("name must be a string", field="name")
    admin_user = body.get("admin_user", "admin@localhost")
    if not isinstance(admin_user, str):
        raise Invalid("admin_user must be an email address", field="admin_user")
    with system_session() as session:
        made = operations.provision(session, name=name, quotas=body.get("quotas"), admin_user=admin_user)
        answer = {
            "tenant": made.tenant.name,
            "api_key": made.key.api_key,
            "state": made.tenant.state,
            "quotas": full_quotas(made.tenant.quotas),
            "created_at": made.tenant.created_at.isoformat() if made.tenant.created_at else None,
        }
    return JSONResponse(answer, status_code=201)


@router.get(
    "/tenants",
    dependencies=[Depends(require_operator_key)],
    **operation(
        summary="List tenants",
        response=TenantPage,
        errors=(403,),
        query={
            "limit": ({"type": "integer", "minimum": 1, "maximum": operations.MAX_PAGE}, "page size (default 50)"),
            "cursor": ({"type": "string"}, "the next_cursor of the previous page"),
            "state": ({"type": "string", "enum": list(operations.STATES)}, "only tenants in this state"),
            "q": ({"type": "string"}, "only tenants whose name starts with this"),
        },
    ),
)
def list_tenants(request: Request) -> dict[str, Any]:
    """Tenants by name, with their state, quotas and current usage."""
    params = request.query_params
    limit = page_limit(params.get("limit"))
    with system_session() as session:
        page, next_cursor = operations.list_tenants(
            session, limit=limit, cursor=params.get("cursor"), state=params.get("state"), prefix=params.get("q")
        )
    return {"tenants": page, "next_cursor": next_cursor}


def page_limit(raw: str | None) -> int:
    if raw is None:
        return 50
    value = plain_int(raw, max_digits=6)
    if value is None or not 1 <= value <= operations.MAX_PAGE:
        raise Invalid(f"limit must be a whole number from 1 to {operations.MAX_PAGE}", field="limit")
    return value


@router.get(
    "/tenants/{name}",
    dependencies=[Depends(require_operator_key)],
    **operation(summary="Read a tenant", response=TenantOut, errors=(403, 404)),
)
def read_tenant(name: TenantPath) -> dict[str, Any]:
    """One tenant with its current usage."""
    with system_session() as session:
        return operations.describe(session, name=name)


@router.patch(
    "/tenants/{name}",
    dependencies=[Depends(require_operator_key)],
    **operation(
        summary="Suspend, resume or limit a tenant",
        body=TenantPatch,
        example={"state": "suspended"},
        response=TenantOut,
        errors=(403, 404),
    ),
)
def patch_tenant(name: TenantPath, body: Any = Body(default=None)) -> dict[str, Any]:
    """A suspended tenant's keys get 403 `tenant_suspended` on every call; its data and queued jobs are kept
    and go on when it is active again. Quotas named here replace the tenant's (null: unlimited)."""
    body = _body(body, TenantPatch)
    with system_session() as session:
        tenant, _changes = operations.update_tenant(
            session, name=name, state=body.get("state"), quotas=body.get("quotas")
        )
        tenant_id = tenant.id
    forget_tenant_callers(tenant_id)
    with system_session() as session:
        return operations.describe(session, name=name)


@router.delete(
    "/tenants/{name}",
    status_code=202,
    dependencies=[Depends(require_operator_key)],
    **operation(summary="Offboard a tenant", response=OffboardingOut, status=202, errors=(403, 404)),
)
def delete_tenant(name: TenantPath) -> JSONResponse:
    """Offboarding: the tenant's keys answer 401 at once, and a purge job removes every row of it, its vectors,
    its full-text index and its cached state on every replica. The name may be used again at once."""
    with system_session() as session:
        tenant, job_id = operations.offboard(session, name=name)
        tenant_id = tenant.id
    forget_tenant_callers(tenant_id)
    return JSONResponse({"job_id": job_id}, status_code=202)


@router.get(
    "/usage",
    **operation(
        summary="The tenant's usage",
        response=UsageReport,
        errors=(400, 403),
        query={
            "from": ({"type": "string", "format": "date"}, "first day of the daily counters (UTC)"),
            "to": ({"type": "string", "format": "date"}, "last day of the daily counters (default: today)"),
        },
    ),
)
def read_usage(request: Request, caller: Caller = Depends(require_admin)) -> dict[str, Any]:
    """The caller's tenant: current usage and quotas; with `from`/`to`, the daily counters of those days."""
    first, last = _date(request, "from"), _date(request, "to")
    with tenant_session(caller.tenant_id) as session:
        figures = usage.usage_of(session, tenant_ids=[caller.tenant_id])[caller.tenant_id]
        quotas = operations.tenant_quotas(session, tenant_id=caller.tenant_id)
        answer: dict[str, Any] = {"usage": figures, "quotas": quotas}
        if first is not None or last is not None:
            last = last or usage.today()
            first = first or last
            if first > last:
                raise Invalid("from must not be after to", field="from")
            if (last - first) > timedelta(days=MAX_USAGE_DAYS - 1):
                raise Invalid(f"at most {MAX_USAGE_DAYS} days at a time", field="from")
            answer["days"] = usage.days(session, tenant_id=caller.tenant_id, first=first, last=last)
    return answer


def _date(request: Request, name: str) -> date | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise Invalid(f"{name} must be a date (YYYY-MM-DD)", field=name) from None
