"""`quota.exceeded` webhook events (CONTRACT section 10) for writes refused by a quota.

The refused write rolls back, so the event is committed on its own, after the refusal. An agent that keeps
retrying would otherwise send its tenant one event per attempt: each process sends at most one per tenant
and quota a minute.
"""

from __future__ import annotations

import logging
import threading
import time

from starlette.types import Scope

from core.db import tenant_session
from core.errors import EngramError, QuotaExceeded
from core.webhooks.service import emit

log = logging.getLogger("engram.api")

# Where api.auth leaves the admitted caller's tenant on the request.
TENANT_SCOPE_KEY = "engram.tenant_id"
_EVERY_SECONDS = 60.0
_last_sent: dict[tuple[int, str], float] = {}
_lock = threading.Lock()


def _due(tenant_id: int, quota: str) -> bool:
    now = time.monotonic()
    with _lock:
        if now - _last_sent.get((tenant_id, quota), -_EVERY_SECONDS) < _EVERY_SECONDS:
            return False
        if len(_last_sent) > 10_000:
            _last_sent.clear()
        _last_sent[(tenant_id, quota)] = now
        return True


def quota_exceeded(tenant_id: int, errors: list[EngramError]) -> None:
    """Send `quota.exceeded` for each quota among ``errors`` (at most once a minute per tenant and quota)."""

    quotas = {(e.quota, e.limit) for e in errors if isinstance(e, QuotaExceeded) and e.quota is not None}
    due = [(quota, limit) for quota, limit in sorted(quotas, key=str) if _due(tenant_id, str(quota))]
    if not due:
        return
    try:
        with tenant_session(tenant_id) as session:
            for quota, limit in due:
                emit(session, tenant_id=tenant_id, type="quota.exceeded", data={"quota": quota, "limit": limit})
    except Exception as exc:  # noqa: BLE001 - the refusal is answered whatever happens to its event
        log.warning("quota.exceeded event not recorded: %s", exc)


def from_scope(scope: Scope, error: EngramError) -> None:
    """The event of a refusal raised by a route, for the tenant the request was admitted for."""
    tenant_id = scope.get(TENANT_SCOPE_KEY)
    if isinstance(error, QuotaExceeded) and isinstance(tenant_id, int):
        quota_exceeded(tenant_id, [error])
