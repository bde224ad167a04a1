"""Local mode, continued: the key, catalog, job and coverage calls (see :mod:`api.client.local`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from api.client.base import as_api_errors, validated
from api.client.models import (
    CoverageRow,
    Datasource,
    Deleted,
    IssuedKeyOut,
    Job,
    JobAccepted,
    JobPage,
    KeyRevoked,
    ModelInspection,
)
from core.db import system_session, tenant_session
from core.entities import editing
from core.entities import service as catalog
from core.entities.schemas import DatasourceIn, ModelPatchIn, ModelPutIn, RefreshSamplesIn
from core.errors import Forbidden
from core.memories.schemas import parse_model
from core.tenancy.context import Caller


class LocalAdminCalls:
    """Mixin of :class:`api.client.local.LocalEngramClient` for the calls beyond memories and search."""

    _caller: Caller
    agent_id: str | None
    persona: str | None

    def _acting(self, agent_id: str | None, persona: str | None) -> Caller:
        raise NotImplementedError

    def _admin(self) -> Caller:
        """The caller of an admin write (every use of this is one): 403 for members and read-only keys."""
        if not self._caller.is_admin:
            raise Forbidden("this call needs an admin key")
        self._caller.require_write()
        return self._caller

    # Keys

    @as_api_errors
    def create_key(self, *, user: str, role: str = "member") -> IssuedKeyOut:
        from core.tenancy.models import Tenant
        from core.tenancy.service import issue_key

        caller = self._admin()
        with system_session() as session:
            tenant = session.get(Tenant, caller.tenant_id)
            assert tenant is not None
            issued = issue_key(session, tenant=tenant, user=user, role=role)
        return IssuedKeyOut(
            api_key=issued.api_key, id=issued.id, user=issued.user, role=issued.role, tenant=issued.tenant
        )

    @as_api_errors
    def revoke_key(self, key_id: str) -> KeyRevoked:
        from api.auth import forget_cached_keys
        from core.tenancy.service import revoke_key

        caller = self._admin()
        with system_session() as session:
            revoke_key(session, caller=caller, key_id=key_id)
        forget_cached_keys()
        return KeyRevoked(id=key_id, revoked=True)

    # Catalog

    @as_api_errors
    def create_datasource(self, body: DatasourceIn | None = None, **fields: Any) -> Datasource:
        parsed = validated(DatasourceIn, body, fields)
        caller = self._admin()
        with tenant_session(caller.tenant_id) as session:
            datasource = catalog.create_datasource(session, tenant_id=caller.tenant_id, body=parsed)
            return Datasource.model_validate(catalog.datasource_to_dict(datasource, models=[]))

    @as_api_errors
    def list_datasources(self) -> list[Datasource]:
        with tenant_session(self._caller.tenant_id) as session:
            return [Datasource.model_validate(d) for d in catalog.list_datasources(session)]

    @as_api_errors
    def get_datasource(self, name: str) -> Datasource:
        with tenant_session(self._caller.tenant_id) as session:
            return Datasource.model_validate(catalog.read_datasource(session, name=name))

    @as_api_errors
    def delete_datasource(self, name: str) -> Deleted:
        caller = self._admin()
        with tenant_session(caller.tenant_id) as session:
            result = catalog.delete_datasource(session, tenant_id=caller.tenant_id, name=name)
        return Deleted.model_validate({"datasource": name, "status": "deleted", **result.as_dict()})

    def _queue(self, *, name: str, kind: str, payload: dict[str, Any]) -> JobAccepted:
        from core.jobs.service import enqueue

        caller = self._admin()
        with tenant_session(caller.tenant_id) as session:
            catalog.get_datasource(session, name=name)
            job = enqueue(session, tenant_id=caller.tenant_id, kind=kind, payload=payload)
        return JobAccepted(job_id=job.id)

    @as_api_errors
    def ingest_datasource(self, name: str) -> JobAccepted:
        return self._queue(name=name, kind="ingest", payload={"datasource": name})

    @as_api_errors
    def refresh_samples(self, name: str, *, models: list[str] | None = None) -> JobAccepted:
        parsed: RefreshSamplesIn = parse_model(RefreshSamplesIn, {} if models is None else {"models": models})
        payload: dict[str, Any] = {"datasource": name}
        if parsed.models is not None:
            self._admin()
            with tenant_session(self._caller.tenant_id) as session:
                for model in parsed.models:
                    catalog.get_model(session, datasource=name, name=model)
            payload["models"] = parsed.models
        return self._queue(name=name, kind="refresh_samples", payload=payload)

    @as_api_errors
    def inspect_model(
        self, datasource: str, name: str, *, agent_id: str | None = None, persona: str | None = None
    ) -> ModelInspection:
        # The learnings are the ones this agent may see (CONTRACT section 2: every call may name its agent).
        caller = self._acting(agent_id, persona)
        with tenant_session(caller.tenant_id) as session:
            return ModelInspection.model_validate(
                catalog.inspect_model(session, caller=caller, datasource=datasource, name=name)
            )

    @as_api_errors
    def put_model(self, datasource: str, name: str, body: ModelPutIn | None = None, **fields: Any) -> ModelInspection:
        parsed = validated(ModelPutIn, body, fields)
        caller = self._admin()
        with tenant_session(caller.tenant_id) as session:
            editing.put_model(session, tenant_id=caller.tenant_id, datasource=datasource, name=name, body=parsed)
            inspected = catalog.inspect_model(session, caller=caller, datasource=datasource, name=name)
        return ModelInspection.model_validate(inspected)

    @as_api_errors
    def patch_model(
        self, datasource: str, name: str, body: ModelPatchIn | None = None, **fields: Any
    ) -> ModelInspection:
        parsed = validated(ModelPatchIn, body, fields)
        caller = self._admin()
        with tenant_session(caller.tenant_id) as session:
            editing.patch_model(session, tenant_id=caller.tenant_id, datasource=datasource, name=name, body=parsed)
            inspected = catalog.inspect_model(session, caller=caller, datasource=datasource, name=name)
        return ModelInspection.model_validate(inspected)

    @as_api_errors
    def delete_model(self, datasource: str, name: str) -> Deleted:
        caller = self._admin()
        with tenant_session(caller.tenant_id) as session:
            result = catalog.delete_model(session, tenant_id=caller.tenant_id, datasource=datasource, name=name)
        return Deleted.model_validate({"model": f"{datasource}.{name}", "status": "deleted", **result.as_dict()})

    # Jobs and operations

    @as_api_errors
    def get_job(self, job_id: str) -> Job:
        from core.jobs import queries
        from core.jobs.service import get_job

        with system_session() as session:
            job = get_job(session, job_id=job_id, tenant_id=self._caller.tenant_id)
            return Job.model_validate(queries.job_view(job, tenant_name=self._caller.tenant_name))

    @as_api_errors
    def list_jobs(
        self, *, kind: str | None = None, state: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> JobPage:
        from core.jobs import queries

        raw = {"kind": kind, "state": state, "limit": None if limit is None else str(limit), "cursor": cursor}
        filters = queries.parse_filters({k: v for k, v in raw.items() if v is not None}, tenant_id=None)
        with system_session() as session:
            jobs, next_cursor = queries.list_jobs(session, filters=filters, scope=self._caller.tenant_id)
        return JobPage.model_validate({"jobs": jobs, "next_cursor": next_cursor})

    @as_api_errors
    def retry_job(self, job_id: str) -> Job:
        from core.config import get_settings
        from core.jobs import queries

        if not self._caller.is_admin:
            raise Forbidden("retrying a job needs an admin key")
        self._caller.require_write()
        settings = get_settings()
        with system_session() as session:
            job = queries.retry(
                session,
                job_id=job_id,
                scope=self._caller.tenant_id,
                queued_after=timedelta(seconds=settings.outbox_redispatch_seconds),
                running_lease=timedelta(seconds=settings.job_running_lease_seconds),
            )
            return Job.model_validate(queries.job_view(job, tenant_name=self._caller.tenant_name))

    @as_api_errors
    def coverage(self) -> list[CoverageRow]:
        from api.routes.ops import coverage_rows

        return [CoverageRow.model_validate(row) for row in coverage_rows(self._caller.tenant_id)]
