"""The tenant audit log and the operator's trail: who did what, recorded with the change itself."""

from core.audit.service import (
    Actor,
    list_entries,
    prune_audit,
    purge_tenant_audit,
    record,
    record_many,
    record_operator,
)

__all__ = ["Actor", "list_entries", "prune_audit", "purge_tenant_audit", "record", "record_many", "record_operator"]
