"""Each API process applies a change to a tenant made elsewhere: a thread LISTENs on ``engram_tenants``.

A change made through another replica (or by ``engram tenant ...`` on the home) reaches this process within
milliseconds of its commit; one made through another process of the same routed ``engram api`` has already been
applied here before it was answered (api.serve.routed.forget_everywhere).

A suspension, new quotas or revoked keys drop the tenant's cached callers, so its next request is
authenticated afresh; an offboarding also erases the tenant's cached search state and index directory
here (core.search.erasure). Notifications sent while the listener was disconnected are lost, so after
every (re)connection it drops every cached caller and erases the indexes of tenants that are gone.
"""

from __future__ import annotations

import json
import logging
import threading

import psycopg
from sqlalchemy import text

from api.auth import forget_cached_keys
from core.db import get_engine, system_session
from core.search.erasure import erase_tenant, sweep_indexes
from core.tenancy.operations import CHANNEL

log = logging.getLogger("engram.api")

_RECONNECT_SECONDS = 2.0


def apply(payload: str) -> None:
    """Apply one notification's change to this process."""
    try:
        message = json.loads(payload)
        tenant_id = int(message["tenant_id"])
        events = str(message.get("event", "")).split(",")
    except (ValueError, KeyError, TypeError):
        log.warning("ignored a malformed tenant notification: %r", payload[:200])
        return
    forget_cached_keys(tenant_id=tenant_id)
    if "deleted" in events:
        erase_tenant(tenant_id)


def sweep() -> None:
    """Erase what this process holds of tenants offboarded while it was not listening."""
    forget_cached_keys()
    with system_session() as session:
        live = set(session.execute(text("SELECT id FROM tenants WHERE state <> 'deleting'")).scalars())
    gone = sweep_indexes(live_tenants=live)
    if gone:
        log.info("erased the indexes of %d offboarded tenant(s)", len(gone))


class TenantEventListener:
    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engram-tenant-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                url = get_engine().url.render_as_string(hide_password=False)
                dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
                with psycopg.connect(dsn, autocommit=True) as listener:
                    listener.execute(f"LISTEN {CHANNEL}")
                    sweep()
                    while not self._stop.is_set():
                        for notice in listener.notifies(timeout=1.0):
                            apply(notice.payload)
            except Exception as exc:  # noqa: BLE001 - database away: keys expire from the cache on their own
                log.warning("tenant event listener: %s", exc)
                self._stop.wait(_RECONNECT_SECONDS)
