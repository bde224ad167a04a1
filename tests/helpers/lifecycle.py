"""Running a tenant's lifecycle pass in the test's own process (core.lifecycle.prune.prune_tenant)."""

from __future__ import annotations


def prune(tenant, **overrides):  # type: ignore[no-untyped-def]
    from core.config import get_settings
    from core.db import tenant_session
    from core.lifecycle.prune import prune_tenant
    from core.lifecycle.staleness import tenant_change_seq

    settings = get_settings().model_copy(update=overrides)
    with tenant_session(tenant.tenant_id) as session:
        seq = tenant_change_seq(session, tenant_id=tenant.tenant_id)
    return prune_tenant(tenant_id=tenant.tenant_id, settings=settings, watermark=None, change_seq=seq)
