"""Erasing an offboarded tenant from this process: its cached search state and its full-text index on disk.

Everything a process derives for a tenant (index handle, catalog snapshot, vector matrix and layout,
eligibility facts) is keyed by the tenant's id, which PostgreSQL never hands out again: a tenant created
later under the same name starts empty. Erasure still drops the old entries at once, so an offboarded
customer's data does not linger in memory or on disk until it happens to be evicted. Each API process
erases on the offboarding's notification (api.tenant_events) and sweeps its index directory at start.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Collection
from pathlib import Path

from core.caches import drop_tenant_everywhere
from core.config import get_settings
from core.search import facts
from core.search.index import forget_index_handle, index_path

log = logging.getLogger("engram.search")

_TENANT_DIR = re.compile(r"tenant-(\d+)")


def erase_tenant(tenant_id: int) -> None:
    """Drop the tenant's cached state in this process and remove its index directory."""
    forget_index_handle(tenant_id)
    drop_tenant_everywhere(tenant_id)
    facts.forget_tenant(tenant_id)
    path = index_path(tenant_id)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed the full-text index of offboarded tenant %s", tenant_id)


def indexed_tenants() -> list[int]:
    """The tenant ids with an index directory under this process's index dir."""
    root = Path(get_settings().index_dir)
    if not root.is_dir():
        return []
    return [int(m.group(1)) for entry in root.iterdir() if (m := _TENANT_DIR.fullmatch(entry.name))]


def sweep_indexes(*, live_tenants: Collection[int]) -> list[int]:
    """Erase every tenant with an index here that is not live (offboarded while this process was down)."""
    gone = [tenant_id for tenant_id in indexed_tenants() if tenant_id not in live_tenants]
    for tenant_id in gone:
        erase_tenant(tenant_id)
    return gone
